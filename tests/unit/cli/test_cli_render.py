"""What qm status prints of where a batch job runs: its node, or every node of a gang."""

from __future__ import annotations

from qm.v1 import types_pb2

from cli import render
from tests.unit.cli.conftest import text


def gang() -> types_pb2.Job:
    job = types_pb2.Job(job_id="g", node_id="n0", gpu_indices=[0, 1])
    job.spec.gpus = 4
    for rank in (0, 1):
        job.placements.add(task_id=f"g/0.{rank}", node_id=f"n{rank}", gpu_indices=[0, 1])
    return job


def test_a_gang_lists_each_of_its_nodes() -> None:
    shown = text(render.job_detail(gang()))
    assert "nodes" in shown and "n0 GPUs [0, 1]; n1 GPUs [0, 1]" in shown
    assert "2 nodes" in text(render.jobs_table([gang()]))


def test_a_job_on_one_node_shows_that_node() -> None:
    job = types_pb2.Job(job_id="j", node_id="n3", gpu_indices=[5])
    job.placements.add(task_id="j/0", node_id="n3", gpu_indices=[5])
    assert "n3 GPUs [5]" in text(render.job_detail(job))
    assert "n3" in text(render.jobs_table([job]))


def test_the_nodes_table_counts_serving_gpus_apart_from_free_ones() -> None:
    node = types_pb2.Node(inventory=types_pb2.NodeInventory(node_id="n1"))
    node.inventory.gpus.add(index=0, type="H100")
    node.inventory.gpus.add(index=1, type="H100")
    node.inventory.gpus.add(index=2, type="H100")
    node.serving.add(gpu_index=1, allocation="vision")
    row = next(line for line in text(render.nodes_table([node])).splitlines() if "n1" in line)
    assert "1 vision" in row
    assert row.split("│")[5].strip() == "2"  # FREE: three GPUs, one serving

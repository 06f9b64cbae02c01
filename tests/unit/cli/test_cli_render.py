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


# --- protection and preemption ------------------------------------------------


def charged(protection: types_pb2.Protection.ValueType) -> types_pb2.Job:
    job = types_pb2.Job(job_id="j", state=types_pb2.JOB_STATE_RUNNING, protection=protection)
    job.spec.allocation = "nlp"
    job.spec.min_runtime.FromSeconds(600)
    return job


def test_a_submission_says_what_will_protect_the_job() -> None:
    free = types_pb2.JobSpec(gpus=1)
    assert render.protection_at_submission(free).startswith("free work")
    paid = types_pb2.JobSpec(gpus=1, allocation="nlp")
    paid.min_runtime.FromSeconds(600)
    told = render.protection_at_submission(paid)
    assert "protected for 10m from its start if placed within nlp's share" in told
    assert "borrowed" in told


def test_a_running_job_says_until_when_it_is_protected_or_that_it_is_not() -> None:
    contract = charged(types_pb2.PROTECTION_CONTRACT)
    contract.protected_until.FromSeconds(1_800_000_000)
    assert "protected until 2027-01-15 08:00:00 (within nlp's share)" in text(
        render.job_detail(contract)
    )
    borrowed = text(render.job_detail(charged(types_pb2.PROTECTION_BORROWED)))
    assert "unprotected: on GPUs borrowed beyond nlp's share" in " ".join(borrowed.split())
    assert "free work" in render.protection(charged(types_pb2.PROTECTION_FREE))
    waiting = charged(types_pb2.PROTECTION_UNSPECIFIED)
    assert render.protection(waiting).startswith("once it starts: charged: protected for 10m")
    assert "free work" in render.change(charged(types_pb2.PROTECTION_FREE))


def test_a_preempted_job_says_for_whom_and_by_which_rule() -> None:
    job = charged(types_pb2.PROTECTION_BORROWED)
    job.state = types_pb2.JOB_STATE_PREEMPTED
    job.preemption.CopyFrom(
        types_pb2.Preemption(
            job_id="j-9", allocation="vision", rule=types_pb2.PREEMPTION_RULE_BORROWED
        )
    )
    shown = " ".join(text(render.job_detail(job)).split())
    assert "preempted for j-9 of vision: its GPUs were borrowed beyond its allocation's" in shown
    assert "protection" not in shown  # it ended: nothing protects it any more

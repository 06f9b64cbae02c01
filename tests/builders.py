"""Fluent-free builders for scenario tests: small functions with sensible defaults."""

from __future__ import annotations

from collections.abc import Iterable

from qm.v1 import types_pb2

from libs.config.budget import tree_from_mapping
from libs.core import Decision, Input, JobSpec, NodeId, NodeSpec
from libs.core.budget_tree import BudgetTree
from libs.events.wire_time import duration_ms
from libs.sim.policy import Policy


def job(gpus: int = 1, *, allocation: str = "team-a", user: str = "alice", **kw: object) -> JobSpec:
    fields: dict[str, object] = {"command": ("true",), **kw}
    return JobSpec(allocation=allocation, user=user, gpus=gpus, **fields)  # type: ignore[arg-type]


def node(node_id: str, gpus: int = 8, gpu_type: str = "H100") -> NodeSpec:
    return NodeSpec(node_id=NodeId(node_id), gpu_type=gpu_type, gpu_indices=tuple(range(gpus)))


def tree(**weights: float) -> BudgetTree:
    """A flat budget tree: one leaf per keyword, weighted as given."""
    return tree_from_mapping(
        {"name": "root", "children": [{"name": k, "weight": w} for k, w in weights.items()]}
    )


def decided(policy: Policy, inputs: Iterable[Input]) -> list[Decision]:
    """Every decision the policy makes on the inputs, in order."""
    return [d for event in inputs for d in policy.handle(event)]


def proto_workflow(*tasks: tuple[str, list[str]], name: str = "w") -> types_pb2.Workflow:
    """A workflow as the log holds it: (task id, parents) each, serving model ``m-<id>``."""
    return types_pb2.Workflow(
        name=name,
        tasks=[
            types_pb2.WorkflowTask(
                task_id=t,
                model=f"m-{t}",
                model_mb=100,
                run_duration=duration_ms(5),
                in_kb=1,
                out_kb=1,
                parents=p,
            )
            for t, p in tasks
        ],
    )

"""Tiny workloads and scripted policies for driver tests."""

from __future__ import annotations

from collections.abc import Callable

from libs.config.budget import tree_from_mapping
from libs.core import Decision, Input, JobSpec
from libs.sim import ClusterSpec, SimJob, Workload
from libs.sim.policy import Policy

TREE = tree_from_mapping({"name": "root", "children": [{"name": "a"}, {"name": "b"}]})


def spec(gpus: int = 1, *, allocation: str = "a", resumable: bool = True, **kw: object) -> JobSpec:
    fields: dict[str, object] = {"min_runtime_s": 600, **kw}
    return JobSpec(allocation, "u", gpus, ("x",), resumable=resumable, **fields)  # type: ignore[arg-type]


def workload(*jobs: tuple[float, str, JobSpec, float], nodes: int = 1, gpus: int = 4) -> Workload:
    sim_jobs = tuple(SimJob(at, job_id, s, runtime) for at, job_id, s, runtime in jobs)
    return Workload(sim_jobs, ClusterSpec(nodes, gpus, "H100").node_specs(), TREE)


class Scripted:
    """Answers each input with whatever ``react`` says; remembers every input."""

    def __init__(self, react: Callable[[Input], list[Decision]]) -> None:
        self.react = react
        self.inputs: list[Input] = []

    def handle(self, event: Input) -> list[Decision]:
        self.inputs.append(event)
        return self.react(event)


class Recording:
    """A real policy, with its inputs remembered."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.inputs: list[Input] = []

    def handle(self, event: Input) -> list[Decision]:
        self.inputs.append(event)
        return self.inner.handle(event)

"""The core never raises: what it cannot act on it answers, naming the rule."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from libs.core import (
    JobArrived,
    JobSpec,
    NodeJoined,
    NodeSpec,
    Place,
    Refused,
    Reject,
    Scheduler,
    UsageSnapshot,
)
from libs.core import limits as L
from libs.core.baselines import FifoPolicy, PriorityPolicy
from libs.core.compass.workflow import Task, Workflow
from tests.builders import job, node

WIDE = "x" * (L.MAX_COMMAND_BYTES + 1)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (job(0), "gpus"),
        (job(-3), "gpus"),
        (job(L.MAX_GPUS + 1), "gpus"),
        (job(1, simulated_duration_s=math.nan), "env[QM_SIMULATED_SECONDS]"),
        (job(1, simulated_duration_s=math.inf), "env[QM_SIMULATED_SECONDS]"),
        (job(1, min_gpu_memory_gib=math.nan), "min_gpu_memory_gib"),
        (job(1, simulated_utilization=math.nan), "env[QM_SIMULATED_UTILIZATION]"),
        (job(1, command=(WIDE,)), "command"),
        (job(1, command=("a\0b",)), "command"),
        (job(1, command=("x",) * (L.MAX_COMMAND_ARGS + 1)), "command"),
        (job(1, env=tuple((f"K{i}", "v") for i in range(L.MAX_ENV_VARS + 1))), "env"),
        (job(1, env=(("A=B", "v"),)), "env[A=B]"),
        (job(1, secrets=("API KEY",)), "secrets[API KEY]"),
        (job(1, secrets=("1PASSWORD",)), "secrets[1PASSWORD]"),
        (job(1, secrets=("../../etc/shadow",)), "secrets[../../etc/shadow]"),
        (job(1, secrets=("TOKEN",), env=(("TOKEN", "in the clear"),)), "secrets[TOKEN]"),
        (job(1, secrets=tuple(f"S{i}" for i in range(L.MAX_SECRETS + 1))), "secrets"),
        (job(1, allocation=""), "allocation"),
        (job(1, allocation="a" * (L.MAX_TEXT_CHARS + 1)), "allocation"),
        (job(1, user=""), "user"),
        (
            job(
                1,
                workflow=Workflow(
                    "w",
                    tuple(Task(f"t{i}", "", 0, 1, 1, 1) for i in range(L.MAX_WORKFLOW_TASKS + 1)),
                ),
            ),
            "workflow.tasks",
        ),
        (job(2, workflow=Workflow("w", (Task("t", "", 0, 1, 1, 1),))), "gpus"),
    ],
)
def test_a_job_breaking_a_rule_is_rejected_not_raised(spec: JobSpec, field: str) -> None:
    for policy in (Scheduler(), PriorityPolicy(), FifoPolicy()):
        policy.handle(NodeJoined(0, node("n1")))
        [rejected] = policy.handle(JobArrived(1, "j1", spec))
        assert isinstance(rejected, Reject)
        assert (rejected.job_id, rejected.field) == ("j1", field)
        assert rejected.reason.startswith(f"{field}: ")


def test_a_rejected_job_is_forgotten_and_the_next_one_runs() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("n1")))
    s.handle(JobArrived(1, "j1", job(0)))
    assert s.handle(JobArrived(1, "j1", job(1))) == []  # the same id: already answered
    [place] = s.handle(JobArrived(2, "j2", job(1)))
    assert isinstance(place, Place) and place.job_id == "j2"


@pytest.mark.parametrize("job_id", ["", "j" * (L.MAX_NAME_CHARS + 1)])
def test_a_job_id_out_of_bounds_is_rejected(job_id: str) -> None:
    [rejected] = Scheduler().handle(JobArrived(1, job_id, job(1)))
    assert isinstance(rejected, Reject) and rejected.field == "job_id"
    assert len(rejected.job_id) <= L.MAX_NAME_CHARS


@pytest.mark.parametrize(
    ("bad", "rule"),
    [
        (NodeSpec("n1", "H100", ()), "gpus: a node has 1 to 64 GPUs, got 0"),
        (NodeSpec("n1", "H100", tuple(range(65))), "gpus: a node has 1 to 64 GPUs, got 65"),
        (NodeSpec("n1", "H100", (0, 0)), "gpus: indices must be distinct, 0 to 1023"),
        (NodeSpec("", "H100", (0,)), "node_id: must be 1 to 64 characters"),
        (NodeSpec("n1", "H100", (0,), math.nan), "gpus.memory: must be between 0 and 4096 GiB"),
    ],
)
def test_a_node_breaking_a_rule_is_refused_and_changes_nothing(bad: NodeSpec, rule: str) -> None:
    s = Scheduler()
    before = s.digest()
    assert s.handle(NodeJoined(0, bad)) == [Refused(bad.node_id, rule)]
    assert s.digest() == before


def test_a_usage_snapshot_with_numbers_that_are_not_finite_is_refused() -> None:
    s = Scheduler()
    before = s.digest()
    [refused] = s.handle(UsageSnapshot(1, 86400, (("a", math.nan),)))
    assert isinstance(refused, Refused) and "finite" in refused.reason
    assert s.digest() == before


def test_a_gang_spanning_too_many_nodes_waits_with_the_reason() -> None:
    s = Scheduler()
    for i in range(L.MAX_GANG_NODES + 1):
        s.handle(NodeJoined(0, replace(node(f"n{i:03}", 1))))
    [wait] = s.handle(JobArrived(1, "g", job(L.MAX_GANG_NODES + 1)))
    assert f"a job may span at most {L.MAX_GANG_NODES}" in wait.reason  # type: ignore[union-attr]

"""What admission refuses of a batch job's shape: jobs it waits for (``--after``) that its
user cannot see or that are workflows, and sizes no set of the cluster's nodes holds."""

from __future__ import annotations

from typing import Any

import grpc
from qm.v1 import job_service_pb2 as js
from qm.v1 import types_pb2

from libs.core import simulated
from libs.events import event_type
from services.admission.servicer import job_id_for
from tests.unit.services.admission.doubles import (
    TOPIC,
    Aborted,
    Context,
    Projector,
    memory_log,
    node,
    rejected,
    servicer,
    submit,
)

OK = types_pb2.DEPENDENCY_CONDITION_OK
ANY = types_pb2.DEPENDENCY_CONDITION_ANY


def batch(**kw: Any) -> types_pb2.JobSpec:
    return types_pb2.JobSpec(**{"allocation": "team-a", "gpus": 1, "command": ["true"], **kw})


def job(job_id: str, user: str, allocation: str, **spec: Any) -> types_pb2.Job:
    return types_pb2.Job(
        job_id=job_id,
        state=types_pb2.JOB_STATE_RUNNING,
        spec=types_pb2.JobSpec(user=user, allocation=allocation, **spec),
    )


JOBS = [
    job("j-mine", "alice", "team-a", command=["train"]),
    job("j-team", "bob", "team-a", command=["train"]),  # alice's allocation: she sees it
    job("j-other", "bob", "team-b", command=["train"]),  # not hers to see
    job("j-flow", "alice", "team-a", workflow=types_pb2.Workflow(name="w")),
]


def after(*job_ids: str, condition: types_pb2.DependencyCondition.ValueType = OK) -> Any:
    return [types_pb2.Dependency(job_id=j, condition=condition) for j in job_ids]


async def test_a_job_may_wait_for_jobs_its_user_sees() -> None:
    spec = batch(after=[*after("j-mine"), *after("j-team", condition=ANY)])
    reply, sent = await submit(spec, Projector(jobs=JOBS))
    assert isinstance(reply, js.SubmitJobResponse)
    assert [event_type(e) for e in sent] == ["job_submitted", "job_admitted"]
    assert sent[1].job_admitted.spec.after == spec.after


async def test_a_job_it_cannot_see_is_one_that_does_not_exist() -> None:
    for hidden in ("j-other", "j-nowhere"):
        reply, event = await rejected(batch(after=after("j-mine", hidden)), Projector(jobs=JOBS))
        assert reply.code == grpc.StatusCode.INVALID_ARGUMENT
        assert reply.details == f"invalid job: after: no job {hidden} you can see"
        assert event.field == "after"


async def test_a_workflow_is_not_waited_for() -> None:
    reply, _ = await rejected(batch(after=after("j-flow")), Projector(jobs=JOBS))
    assert reply.details == (
        "invalid job: after: j-flow is a workflow; --after follows batch jobs only"
    )


async def test_a_job_submitted_through_another_instance_is_seen_before_it_is_projected() -> None:
    log = memory_log()
    async with servicer(log) as other:  # the projector knows neither job
        first = await other.SubmitJob(
            js.SubmitJobRequest(spec=batch(client_request_id="first")),
            Context(),  # type: ignore[arg-type]
        )
    async with servicer(log) as service:  # reads the log from its start, as one does
        second = await service.SubmitJob(
            js.SubmitJobRequest(spec=batch(client_request_id="second", after=after(first.job_id))),
            Context(),  # type: ignore[arg-type]
        )
    assert second.job_id != first.job_id


async def test_a_job_does_not_wait_for_itself() -> None:
    own = job_id_for("alice", "me")
    log = memory_log()
    async with servicer(log) as service:
        try:
            await service.SubmitJob(
                js.SubmitJobRequest(spec=batch(client_request_id="me", after=after(own))),
                Context(),  # type: ignore[arg-type]
            )
        except Aborted as refused:
            assert refused.details == f"invalid job: after: {own} is this job"
        else:
            raise AssertionError("a job waiting for itself was admitted")
    assert [event_type(e) for e in log.envelopes(TOPIC)] == ["job_submitted", "job_rejected"]


EIGHTS = [node(f"n{i}", "H100", 80, gpus=8) for i in range(3)] + [node("t", "T4", 16, gpus=16)]


async def test_a_command_larger_than_every_node_must_name_its_nodes() -> None:
    reply, event = await rejected(batch(gpus=16, gpu_type="H100"), Projector(EIGHTS))
    assert event.field == "gpus" and reply.code == grpc.StatusCode.INVALID_ARGUMENT
    assert reply.details == (
        "invalid job: gpus: at most 8 H100 GPUs on one node here; "
        "for more, --nodes N --gpus-per-node M"
    )
    # Any type: the largest node of any type; --gpus-per-node alone names one node.
    for spec in (batch(gpus=32), batch(gpus=32, nodes=1)):
        reply, _ = await rejected(spec, Projector(EIGHTS))
        assert "gpus: at most 16 GPUs on one node here" in reply.details
    admitted, _ = await submit(batch(gpus=16, gpu_type="H100", nodes=2), Projector(EIGHTS))
    assert isinstance(admitted, js.SubmitJobResponse)


async def test_a_simulated_run_may_take_whole_nodes() -> None:
    spec = batch(gpus=16, gpu_type="H100", env=simulated.to_env(simulated.SimulatedRun(60)))
    reply, _ = await submit(spec, Projector(EIGHTS))
    assert isinstance(reply, js.SubmitJobResponse)


async def test_no_more_parts_than_nodes_with_room_for_one() -> None:
    reply, event = await rejected(batch(gpus=32, gpu_type="H100", nodes=4), Projector(EIGHTS))
    assert event.field == "nodes"
    assert reply.details == (
        "invalid job: nodes: 4 parts of 8 H100 GPUs need 4 nodes; only 3 here have as many"
    )
    reply, _ = await rejected(batch(gpus=32, gpu_type="H100", nodes=2), Projector(EIGHTS))
    assert "2 parts of 16 H100 GPUs need 2 nodes; none here has as many" in reply.details
    # Nodes that cannot run its command are no room for it.
    sims = [node(f"s{i}", "H100", 80, gpus=8, executor=types_pb2.EXECUTOR_SIMULATED) for i in "ab"]
    reply, _ = await rejected(batch(gpus=16, nodes=2), Projector([EIGHTS[0], *sims]))
    assert "only 1 here has as many" in reply.details


async def test_room_is_judged_on_a_fresh_view_and_not_at_all_without_one() -> None:
    projector = Projector(EIGHTS)
    await rejected(batch(gpus=16, gpu_type="H100"), projector)
    assert projector.asked == ["default", "default"]  # the kept view, then afresh
    reply, _ = await submit(batch(gpus=16, nodes=8), Projector([]))
    assert isinstance(reply, js.SubmitJobResponse)


async def test_a_broken_size_is_refused_once() -> None:
    reply, _ = await rejected(batch(gpus=12, nodes=5), Projector(EIGHTS))
    assert reply.details.count("nodes:") == 1 and "do not split into 5 equal parts" in reply.details

"""Job arrays at admission: one id, an element per index named from it, and the array
as a whole to cancel, list and wait for."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from qm.v1 import job_service_pb2 as js
from qm.v1 import types_pb2

from libs.core.limits import MAX_ARRAY_ELEMENTS, MAX_ARRAY_INDEX
from libs.events import event_type
from services.admission.servicer import array_id_for
from tests.unit.services.admission.doubles import (
    TOPIC,
    Aborted,
    Context,
    Projector,
    memory_log,
    servicer,
    submit,
)

S = types_pb2


def element(index: int, count: int = 3, **kw: Any) -> types_pb2.JobSpec:
    given: dict[str, Any] = {
        "allocation": "team-a",
        "gpus": 1,
        "command": ["true"],
        "client_request_id": "sweep",
        "array": types_pb2.ArrayElement(index=index, count=count),
    }
    return types_pb2.JobSpec(**(given | kw))


def listed(job_id: str, state: int, user: str = "alice", index: int = 0) -> types_pb2.Job:
    spec = types_pb2.JobSpec(
        user=user, allocation="team-a", array=types_pb2.ArrayElement(index=index, count=3)
    )
    return types_pb2.Job(job_id=job_id, state=state, spec=spec)  # type: ignore[arg-type]


async def test_the_elements_of_an_array_are_named_by_its_id_and_their_index() -> None:
    array_id = array_id_for("alice", "sweep")
    assert array_id.startswith("a-")
    log = memory_log()
    async with servicer(log) as service:
        ids = [
            (await service.SubmitJob(js.SubmitJobRequest(spec=element(i)), Context())).job_id  # type: ignore[arg-type]
            for i in (0, 2, 2)
        ]
    assert ids == [f"{array_id}_0", f"{array_id}_2", f"{array_id}_2"]  # the retry: the same
    kinds = [event_type(e) for e in log.envelopes(TOPIC)]
    assert kinds == ["job_submitted", "job_admitted"] * 2


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (element(0, count=0), f"array.count: an array holds 1 to {MAX_ARRAY_ELEMENTS} jobs"),
        (element(0, count=MAX_ARRAY_ELEMENTS + 1), "array.count"),
        (element(MAX_ARRAY_INDEX + 1), f"array.index: at most {MAX_ARRAY_INDEX}"),
        (element(0, client_request_id=""), "client_request_id: an array's elements share one"),
        (element(0, workflow=types_pb2.Workflow(name="w")), "array: an array is of batch jobs"),
    ],
)
async def test_a_malformed_element_is_refused_and_nothing_recorded(
    spec: types_pb2.JobSpec, says: str
) -> None:
    reply, sent = await submit(spec)
    assert isinstance(reply, Aborted) and reply.code == grpc.StatusCode.INVALID_ARGUMENT
    assert reply.details.startswith(f"invalid job: {says}")
    assert sent == []


ARRAY = [
    listed("a-1f_0", S.JOB_STATE_RUNNING, index=0),
    listed("a-1f_1", S.JOB_STATE_FINISHED, index=1),
    listed("a-1f_2", S.JOB_STATE_PENDING, index=2),
    listed("a-2e_0", S.JOB_STATE_RUNNING, user="bob"),  # team-a's: alice sees, cannot steer
    listed("a-3d_0", S.JOB_STATE_FAILED),
    listed("j-1f", S.JOB_STATE_RUNNING),  # no array's
]


async def cancel(job_id: str, user: str = "alice") -> tuple[Any, list[Any]]:
    log = memory_log()
    async with servicer(log, Projector(jobs=ARRAY)) as service:
        try:
            reply: Any = await service.CancelJob(
                js.CancelJobRequest(job_id=job_id),
                Context(user),  # type: ignore[arg-type]
            )
        except Aborted as exc:
            reply = exc
    return reply, log.envelopes(TOPIC)


async def test_cancelling_an_array_cancels_each_element_that_has_not_ended() -> None:
    reply, sent = await cancel("a-1f")
    assert list(reply.cancelled) == ["a-1f_0", "a-1f_2"] and reply.job_id == "a-1f"
    assert [e.job_cancel_requested.job_id for e in sent] == ["a-1f_0", "a-1f_2"]
    assert {e.job_cancel_requested.requested_by for e in sent} == {"alice"}


async def test_one_element_is_cancelled_alone() -> None:
    reply, sent = await cancel("a-1f_2")
    assert reply.job_id == "a-1f_2" and not reply.cancelled
    assert [e.job_cancel_requested.job_id for e in sent] == ["a-1f_2"]


@pytest.mark.parametrize(
    ("array_id", "user", "code", "says"),
    [
        ("a-1f", "carol", grpc.StatusCode.NOT_FOUND, "no job array 'a-1f'"),  # sees none
        ("a-99", "alice", grpc.StatusCode.NOT_FOUND, "no job array 'a-99'"),
        ("a-2e", "alice", grpc.StatusCode.PERMISSION_DENIED, "alice may cancel only their own"),
        ("a-3d", "alice", grpc.StatusCode.FAILED_PRECONDITION, "all have ended"),
    ],
)
async def test_an_array_not_to_cancel_is_refused_and_nothing_recorded(
    array_id: str, user: str, code: grpc.StatusCode, says: str
) -> None:
    reply, sent = await cancel(array_id, user)
    assert isinstance(reply, Aborted) and reply.code == code and says in reply.details
    assert sent == []


async def steer(verb: str, job_id: str, jobs: list[types_pb2.Job]) -> tuple[Any, list[Any]]:
    """Alice holds or releases ``job_id``: the answer, and what went into the log."""
    log = memory_log()
    async with servicer(log, Projector(jobs=jobs)) as service:
        try:
            if verb == "hold":
                reply: Any = await service.HoldJob(js.HoldJobRequest(job_id=job_id), Context())  # type: ignore[arg-type]
            else:
                reply = await service.ReleaseJob(js.ReleaseJobRequest(job_id=job_id), Context())  # type: ignore[arg-type]
        except Aborted as exc:
            reply = exc
    return reply, log.envelopes(TOPIC)


async def test_holding_an_array_holds_each_element_that_waits_and_release_lets_them_go() -> None:
    held = listed("a-1f_3", S.JOB_STATE_PENDING, index=3)
    held.held = True
    jobs = [*ARRAY, held]  # 0 runs, 1 finished, 2 waits, 3 waits held
    reply, sent = await steer("hold", "a-1f", jobs)
    assert list(reply.held) == ["a-1f_2"]
    assert [(e.job_held.job_id, e.job_held.held) for e in sent] == [("a-1f_2", True)]
    reply, sent = await steer("release", "a-1f", jobs)
    assert list(reply.released) == ["a-1f_3"]
    assert [(e.job_held.job_id, e.job_held.held) for e in sent] == [("a-1f_3", False)]
    refused, sent = await steer("release", "a-3d", jobs)  # its one element failed
    assert isinstance(refused, Aborted) and refused.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "no element of job array a-3d that you may release is held" in refused.details
    assert sent == []


async def test_an_array_is_no_job_to_get_and_the_answer_says_what_to_ask() -> None:
    async with servicer(memory_log(), Projector(jobs=ARRAY)) as service:
        with pytest.raises(Aborted) as refused:
            await service.GetJob(js.GetJobRequest(job_id="a-1f"), Context())  # type: ignore[arg-type]
        listing = await service.ListJobs(
            js.ListJobsRequest(array_id="a-1f"),
            Context(),  # type: ignore[arg-type]
        )
        with pytest.raises(Aborted) as malformed:
            await service.ListJobs(js.ListJobsRequest(array_id="j-1f"), Context())  # type: ignore[arg-type]
    assert refused.value.code == grpc.StatusCode.NOT_FOUND
    assert "a-1f is a job array, not one job: qm status a-1f lists its elements" in (
        refused.value.details
    )
    assert sorted(job.job_id for job in listing.jobs) == ["a-1f_0", "a-1f_1", "a-1f_2"]
    assert malformed.value.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_waiting_for_an_array_waits_for_each_element_its_user_sees() -> None:
    after = [
        types_pb2.Dependency(job_id="a-1f", condition=S.DEPENDENCY_CONDITION_ANY),
        types_pb2.Dependency(job_id="j-1f"),
    ]
    spec = types_pb2.JobSpec(allocation="team-a", gpus=1, command=["reduce"], after=after)
    reply, sent = await submit(spec, Projector(jobs=ARRAY))
    assert isinstance(reply, js.SubmitJobResponse), reply
    admitted = sent[-1].job_admitted.spec.after
    assert [(d.job_id, d.condition) for d in admitted] == [
        ("a-1f_0", S.DEPENDENCY_CONDITION_ANY),
        ("a-1f_1", S.DEPENDENCY_CONDITION_ANY),
        ("a-1f_2", S.DEPENDENCY_CONDITION_ANY),
        ("j-1f", S.DEPENDENCY_CONDITION_UNSPECIFIED),
    ]
    nowhere = types_pb2.JobSpec(
        allocation="team-a", gpus=1, command=["x"], after=[types_pb2.Dependency(job_id="a-99")]
    )
    refused, _ = await submit(nowhere, Projector(jobs=ARRAY))
    assert isinstance(refused, Aborted)
    assert refused.details == "invalid job: after: no job a-99 you can see"

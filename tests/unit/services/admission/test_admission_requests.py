"""One job per client request id, decided from the log; clear answers when it fails."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from qm.v1 import events_pb2, types_pb2
from qm.v1 import job_service_pb2 as js

from libs.bus import EventProducer
from libs.bus.memory import MemoryBus
from libs.core import limits as L
from libs.events import event_type, new_envelope
from libs.events.wire_time import duration_ms
from services.admission.servicer import JobServicer, job_id_for
from services.status import Unavailable
from tests.unit.services.admission.doubles import TOPIC, Aborted, Context, memory_log, servicer


def spec(request_id: str = "r-1", **fields: object) -> types_pb2.JobSpec:
    given: dict[str, object] = {
        "allocation": "team-a",
        "gpus": 1,
        "command": ["true"],
        "client_request_id": request_id,
        **fields,
    }
    return types_pb2.JobSpec(**given)  # type: ignore[arg-type]


async def submit(
    service: JobServicer, job: types_pb2.JobSpec, user: str = "alice"
) -> js.SubmitJobResponse | Aborted:
    try:
        return await service.SubmitJob(js.SubmitJobRequest(spec=job), Context(user))  # type: ignore[arg-type]
    except Aborted as exc:
        return exc


def kinds(log: MemoryBus) -> list[str]:
    return [event_type(env) for env in log.envelopes(TOPIC)]


async def append(log: MemoryBus, env: events_pb2.Envelope) -> None:
    """A record some other admission instance wrote."""
    await EventProducer(log, client_id="other").send(TOPIC, env, key="default")


async def test_a_retry_gets_the_same_job_and_adds_no_decision() -> None:
    log = memory_log()
    async with servicer(log) as service:
        first, again = await submit(service, spec()), await submit(service, spec())
        assert isinstance(first, js.SubmitJobResponse) and isinstance(again, js.SubmitJobResponse)
        assert (first.job_id, first.duplicate) == (again.job_id, False) and again.duplicate
        assert kinds(log) == ["job_submitted", "job_admitted"]


async def test_duplicates_racing_each_other_make_one_job() -> None:
    log = memory_log()
    async with servicer(log) as service:
        replies = await asyncio.gather(*(submit(service, spec()) for _ in range(5)))
        assert {r.job_id for r in replies} == {job_id_for("alice", "r-1")}  # type: ignore[union-attr]
        assert sorted(r.duplicate for r in replies) == [False, True, True, True, True]  # type: ignore[union-attr]
        assert kinds(log).count("job_admitted") == 1


async def test_a_retry_after_a_rejection_gets_the_same_rejection() -> None:
    log = memory_log()
    async with servicer(log) as service:
        refused = await submit(service, spec(gpus=0))
        fixed = await submit(service, spec(gpus=1))  # the same request id: the same answer
        assert isinstance(refused, Aborted) and isinstance(fixed, Aborted)
        assert (fixed.code, fixed.details) == (refused.code, refused.details)
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT and "gpus" in refused.details
        assert kinds(log) == ["job_submitted", "job_rejected"]


async def test_a_permission_refusal_is_repeated_as_one() -> None:
    async with servicer(memory_log()) as service:
        first = await submit(service, spec(allocation="team-b"))
        again = await submit(service, spec(allocation="team-b"))
        assert isinstance(first, Aborted) and isinstance(again, Aborted)
        assert first.code == again.code == grpc.StatusCode.PERMISSION_DENIED
        assert first.details == again.details


async def test_a_fresh_claim_not_decided_yet_makes_a_duplicate_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("services.admission.claims.DECIDE_WITHIN_S", 0.05)
    log = memory_log()
    async with servicer(log) as service:
        claim = events_pb2.JobSubmitted(job_id=job_id_for("alice", "r-1"), spec=spec())
        await append(log, new_envelope(claim, producer="admission"))
        with pytest.raises(Unavailable, match="still being decided"):
            await submit(service, spec())
        # Claims only (this request's own, if its view had not read the first yet,
        # comes second and loses): its claimer may still decide, nobody else does.
        assert set(kinds(log)) == {"job_submitted"}


async def test_a_claim_nobody_decided_is_decided_by_the_next_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("services.admission.claims.DECIDE_WITHIN_S", 0.05)
    monkeypatch.setattr("services.admission.claims.TAKE_OVER_AFTER_S", 0.0)
    log = memory_log()
    async with servicer(log) as service:
        job_id = job_id_for("alice", "r-1")
        claimed = spec(command=["python", "-c", "print(1)"])
        claimed.user = "alice"
        # The request that wrote this claim died before deciding.
        dead = new_envelope(
            events_pb2.JobSubmitted(job_id=job_id, spec=claimed), producer="admission"
        )
        await append(log, dead)
        reply = await submit(service, spec())
        assert isinstance(reply, js.SubmitJobResponse) and reply.job_id == job_id
        [admitted] = [
            env.job_admitted for env in log.envelopes(TOPIC) if env.HasField("job_admitted")
        ]
        assert list(admitted.spec.command) == ["python", "-c", "print(1)"]  # what was claimed


async def test_a_claim_nobody_decided_and_nobody_retries_is_decided_by_the_sweep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = memory_log()
    async with servicer(log) as service:
        dead, fresh = spec("r-dead"), spec("r-fresh")
        dead.user = fresh.user = "alice"
        for request_id, claimed in (("r-dead", dead), ("r-fresh", fresh)):
            claim = events_pb2.JobSubmitted(job_id=job_id_for("alice", request_id), spec=claimed)
            await append(log, new_envelope(claim, producer="admission"))
        async with asyncio.timeout(5):  # the follower reads both
            while service.submissions._requests.claim(job_id_for("alice", "r-fresh")) is None:
                await asyncio.sleep(0.01)
        assert await service.submissions.decide_abandoned() == 0  # both claimers may still decide
        monkeypatch.setattr("services.admission.claims.TAKE_OVER_AFTER_S", 0.0)
        assert await service.submissions.decide_abandoned() == 2
        admitted = [
            e.job_admitted.job_id for e in log.envelopes(TOPIC) if e.HasField("job_admitted")
        ]
        assert sorted(admitted) == sorted(job_id_for("alice", r) for r in ("r-dead", "r-fresh"))
        async with asyncio.timeout(5):  # decided once: the log says so, and nothing is left
            while await service.submissions.decide_abandoned():
                await asyncio.sleep(0.01)
        admitted = [
            e.job_admitted.job_id for e in log.envelopes(TOPIC) if e.HasField("job_admitted")
        ]
        assert len(admitted) == 2


async def test_a_retry_and_the_sweep_racing_for_an_abandoned_claim_decide_it_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("services.admission.claims.DECIDE_WITHIN_S", 0.0)  # at once
    monkeypatch.setattr("services.admission.claims.TAKE_OVER_AFTER_S", 0.0)
    log = memory_log()
    async with servicer(log) as service:
        job_id = job_id_for("alice", "r-1")
        claimed = spec()
        claimed.user = "alice"
        dead = new_envelope(
            events_pb2.JobSubmitted(job_id=job_id, spec=claimed), producer="admission"
        )
        await append(log, dead)
        async with asyncio.timeout(5):  # the follower reads it
            while service.submissions._requests.claim(job_id) is None:
                await asyncio.sleep(0.01)
        retried, swept = await asyncio.gather(
            submit(service, spec()), service.submissions.decide_abandoned(), return_exceptions=True
        )
        # Whichever took it decided it; the other was told to ask again, or saw the answer.
        assert swept == 1 or isinstance(retried, js.SubmitJobResponse)
        assert isinstance(retried, js.SubmitJobResponse | Unavailable)
        admitted = [e for e in log.envelopes(TOPIC) if e.HasField("job_admitted")]
        assert len(admitted) == 1


async def test_a_broker_that_does_not_answer_makes_the_call_unavailable_fast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("services.admission.journal.LOG_TIMEOUT_S", 0.05)
    log = memory_log()
    log.down = True
    async with servicer(log) as service:
        with pytest.raises(Unavailable, match="did not take the record"):
            await submit(service, spec())


@pytest.mark.parametrize("allocation", ["team-a", ""])  # "": the default, chosen later
@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"command": ["x" * 2_000_000]}, "command: at most 65536 bytes, got 2000000"),
        ({"env": {f"K{i}": "v" * 4000 for i in range(200)}}, "env: at most 65536 bytes"),
        ({"cluster": "c" * 200}, "cluster: must be at most 128 characters"),
    ],
)
async def test_a_job_too_large_to_record_is_refused_naming_the_field(
    fields: dict[str, object], named: str, allocation: str
) -> None:
    log = memory_log()
    async with servicer(log) as service:
        reply = await submit(service, spec(allocation=allocation, **fields))
    assert isinstance(reply, Aborted) and reply.code == grpc.StatusCode.INVALID_ARGUMENT
    assert named in reply.details
    [rejected] = log.envelopes(TOPIC)  # no claim: nothing that large is written
    assert rejected.job_rejected.spec == types_pb2.JobSpec()
    assert rejected.ByteSize() < L.MAX_RECORD_BYTES


@pytest.mark.parametrize("allocation", ["team-a", ""])
async def test_a_workflow_of_too_many_tasks_is_refused_before_anything_is_built(
    allocation: str,
) -> None:
    tasks = [
        types_pb2.WorkflowTask(task_id=f"t{i}", run_duration=duration_ms(1), in_kb=1, out_kb=1)
        for i in range(100_000)
    ]
    workflow = types_pb2.Workflow(name="w", tasks=tasks)
    huge = spec(allocation=allocation, command=[], workflow=workflow)
    async with servicer(memory_log()) as service:
        reply = await submit(service, huge)
    assert isinstance(reply, Aborted)
    assert "workflow.tasks: at most 4096 tasks, got 100000" in reply.details


async def test_the_allocation_left_to_admission_is_in_every_record_of_the_job() -> None:
    """alice belongs to team-a alone: the claim says so too, so that every reader of the
    log (the job view, usage) charges the same allocation."""
    log = memory_log()
    async with servicer(log) as service:
        assert isinstance(await submit(service, spec(allocation="")), js.SubmitJobResponse)
    recorded = [getattr(env, event_type(env)).spec.allocation for env in log.envelopes(TOPIC)]
    assert recorded == ["team-a", "team-a"]

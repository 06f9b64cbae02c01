"""A workflow through the live stack: planned, sent task by task to a simulated GPU
whose model cache loads and evicts, and every plan reproduced by the audit."""

from __future__ import annotations

import contextlib

from qm.v1 import events_pb2, types_pb2
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc

from libs.events import DecodeError, decode
from libs.events.wire_time import duration_ms
from tests.integration.conftest import assert_audit_reproduces, eventually, read_topic, wait_for_end
from tests.integration.stack import Stack

# Two 30 GB models cannot share a 40 GiB A100 (42,950 MB): the second evicts the first.
CHAIN = types_pb2.Workflow(
    name="caption",
    tasks=[
        types_pb2.WorkflowTask(
            task_id="see",
            model="vit-30g",
            model_mb=30_000,
            run_duration=duration_ms(200),
            in_kb=300,
            out_kb=2,
        ),
        types_pb2.WorkflowTask(
            task_id="say",
            model="tts-30g",
            model_mb=30_000,
            run_duration=duration_ms(100),
            in_kb=2,
            out_kb=300,
            parents=["see"],
        ),
    ],
)


def events_of(stack: Stack, key: str) -> list[events_pb2.Envelope]:
    """The topic's envelopes, past the garbage other tests write to it."""
    found = []
    for record in read_topic(stack, key):
        with contextlib.suppress(DecodeError):
            found.append(decode(record.value))
    return found


def test_a_workflow_runs_on_simulated_gpus_and_its_plans_replay(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    spec = types_pb2.JobSpec(allocation="vision", gpus=1, gpu_type="A100", workflow=CHAIN)
    job_ids = []
    for run in range(2):  # one after the other, so the second finds the first's cache
        spec.client_request_id = f"caption-{stack.run_id}-{run}"
        reply = jobs.SubmitJob(
            js.SubmitJobRequest(spec=spec), metadata=stack.auth("alice"), timeout=30
        )
        job_ids.append(reply.job_id)
        job = wait_for_end(stack, jobs, reply.job_id)
        assert types_pb2.JobState.Name(job.state) == "JOB_STATE_FINISHED", job

    def cache_events() -> list[events_pb2.Envelope] | None:
        found = [
            env
            for env in events_of(stack, "events")
            if env.WhichOneof("payload") in ("model_loaded", "model_evicted")
            and env.correlation_id in job_ids
        ]
        return found if len(found) >= 4 else None

    cache = eventually(cache_events, what="model cache events")
    loaded = [e.model_loaded.model for e in cache if e.WhichOneof("payload") == "model_loaded"]
    evicted = [e.model_evicted for e in cache if e.WhichOneof("payload") == "model_evicted"]
    # Each run swaps the two models on the one serving GPU.
    assert loaded[:2] == ["vit-30g", "tts-30g"]
    assert evicted[0].model == "vit-30g" and "room for tts-30g" in evicted[0].reason
    assert loaded.count("vit-30g") == 2  # the second run had to load it again

    decisions = events_of(stack, "decisions")
    plans = [d.workflow_planned for d in decisions if d.WhichOneof("payload") == "workflow_planned"]
    assert {p.job_id for p in plans} >= set(job_ids)
    sent = [
        d.task_placed
        for d in decisions
        if d.WhichOneof("payload") == "task_placed" and d.task_placed.job_id in job_ids
    ]
    assert sorted(p.serving.name for p in sent) == ["say", "say", "see", "see"]
    assert all(p.node_id == "sim-0" for p in sent)
    # The serving GPU is held for vision, and charged to it while held: the ledger folds
    # this decision (and the release that follows).
    held = [
        (d.serving_held.node_id, d.serving_held.allocation)
        for d in decisions
        if d.WhichOneof("payload") == "serving_held"
    ]
    assert ("sim-0", "vision") in held

    assert_audit_reproduces(stack, at_least=len(plans) + len(sent))

"""Bad records and restarts: the stack loses nothing and keeps serving."""

from __future__ import annotations

import asyncio
from pathlib import Path

from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2

from libs.bus import KafkaBus, load_topic_config
from libs.bus.deadletter import CONSUMER, REASON, SOURCE_TOPIC
from tests.integration.conftest import eventually, read_topic, until_running, wait_for_end
from tests.integration.stack import Stack
from tests.integration.test_job_lifecycle import submit


def produce_raw(stack: Stack, key: str, value: bytes) -> None:
    topic = getattr(load_topic_config(Path(stack.topics_file)), key).name

    async def send() -> None:
        producer = KafkaBus(stack.kafka_settings()).producer()
        await producer.start()
        try:
            await (await producer.send(topic, value=value, key=b"default"))
        finally:
            await producer.stop()

    asyncio.run(send())


def test_garbage_is_dead_lettered_and_the_stack_goes_on(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    produce_raw(stack, "events", b"\x08\x96\x01 not an envelope")
    produce_raw(stack, "decisions", b"")

    events_reason = "not a qm.v1.Envelope: Error parsing message with type 'qm.v1.Envelope'"
    wanted = {
        ("placement", "events", events_reason),
        ("projector", "events", events_reason),
        ("projector", "decisions", "empty record value"),
        ("node-agent", "decisions", "empty record value"),
    }

    def parked() -> bool:
        found = set()
        for record in read_topic(stack, "deadletter"):
            headers = {k: v.decode() for k, v in record.headers}
            consumer = next(
                (
                    role
                    for role in ("placement", "node-agent", "projector")
                    if role in headers[CONSUMER]
                ),
                headers[CONSUMER],
            )
            reason = headers[REASON][: len(events_reason)]
            found.add((consumer, headers[SOURCE_TOPIC].rsplit(".", 1)[-1], reason))
        return wanted <= found

    eventually(parked, what=f"dead letters from every consumer: {wanted}")
    job_id = submit(stack, jobs, command=["true"])
    assert wait_for_end(stack, jobs, job_id).state == types_pb2.JOB_STATE_FINISHED


def test_placement_rebuilds_its_state_after_a_restart(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    sleeper = submit(stack, jobs, gpus=4, gpu_type="H100", command=["sleep", "60"])
    held = until_running(stack, jobs, sleeper)
    stack.stop("placement")
    waiting = submit(stack, jobs, gpus=4, gpu_type="H100", command=["true"])
    stack.start("placement")
    done = wait_for_end(stack, jobs, waiting)
    assert done.state == types_pb2.JOB_STATE_FINISHED
    assert done.node_id != held.node_id, "the rebuilt scheduler gave away GPUs still in use"
    jobs.CancelJob(js.CancelJobRequest(job_id=sleeper), metadata=stack.auth("alice"))
    assert wait_for_end(stack, jobs, sleeper).state == types_pb2.JOB_STATE_CANCELLED

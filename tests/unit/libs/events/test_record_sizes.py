"""Every record a service writes fits the bus by construction: the largest job the
limits allow, submitted, placed, planned or rejected, is still one record."""

from __future__ import annotations

from dataclasses import replace

from qm.v1 import events_pb2, types_pb2

from libs.config.policy import policy_from_mapping
from libs.core import GangPart, Place, Planned, PlannedTask, Reject, ServingTask
from libs.core import limits as L
from libs.events import encode, new_envelope
from libs.events.convert import decision_payload, spec_from_proto
from libs.events.log_step import policy_configured
from libs.events.release import MAX_RELEASE_CHARS
from libs.events.wire_time import duration_ms

# Kafka's default record limit (message.max.bytes) and aiokafka's max_request_size.
KAFKA_LIMIT = 1_048_576

ID = "i" * L.MAX_NAME_CHARS
TEXT = "t" * L.MAX_TEXT_CHARS
PROVENANCE = types_pb2.Provenance(
    input_partition=2**31 - 1,
    input_offset=2**63 - 1,
    state_digest=b"d" * 32,
    policy=TEXT,
    policy_version=2**31 - 1,
    config_digest=b"c" * 16,
    release="r" * MAX_RELEASE_CHARS,
)


def largest_workflow_spec() -> types_pb2.JobSpec:
    """As many tasks as allowed, every task id as long as allowed; then the command grown
    until the spec is as large as the limit allows."""
    tasks = [
        types_pb2.WorkflowTask(
            task_id=f"{i:0{L.MAX_NAME_CHARS}d}",
            model="m",
            model_mb=L.MAX_MODEL_MB,
            run_duration=duration_ms(L.MAX_RUN_MS),
            in_kb=L.MAX_TRANSFER_KB,
            out_kb=L.MAX_TRANSFER_KB,
        )
        for i in range(L.MAX_WORKFLOW_TASKS)
    ]
    spec = types_pb2.JobSpec(
        allocation=TEXT,
        user=TEXT,
        gpus=1,
        gpu_type=TEXT,
        cluster=TEXT,
        client_request_id=TEXT,
        workflow=types_pb2.Workflow(name=TEXT, tasks=tasks),
    )
    return grown(spec)


def grown(spec: types_pb2.JobSpec) -> types_pb2.JobSpec:
    assert spec.ByteSize() < L.MAX_SPEC_BYTES
    spec.command.append("x" * (L.MAX_SPEC_BYTES - spec.ByteSize()))
    while (over := spec.ByteSize() - L.MAX_SPEC_BYTES) > 0:  # the length prefix grew
        spec.command[-1] = spec.command[-1][:-over]
    return spec


def envelope_size(payload: events_pb2.Envelope | object) -> int:
    env = new_envelope(
        payload,  # type: ignore[arg-type]
        producer=TEXT,
        cluster=TEXT,
        correlation_id=TEXT,
        causation_id=TEXT,
        event_id=TEXT,
    )
    return len(encode(env))


def test_the_record_limit_fits_the_bus() -> None:
    assert L.MAX_SPEC_BYTES < L.MAX_RECORD_BYTES <= KAFKA_LIMIT


def test_the_largest_job_fits_in_every_record_about_it() -> None:
    spec = largest_workflow_spec()
    sizes = {
        "job_submitted": envelope_size(events_pb2.JobSubmitted(job_id=ID, spec=spec)),
        "job_admitted": envelope_size(events_pb2.JobAdmitted(job_id=ID, spec=spec)),
    }
    core_spec = spec_from_proto(types_pb2.JobSpec(gpus=1, command=["x"]))
    serving = ServingTask(
        ID,
        TEXT,
        L.MAX_MODEL_MB,
        L.MAX_RUN_MS,
        1.0,
        (TEXT,) * L.MAX_UPCOMING,
        (ID, 1023),
        "r" * L.MAX_REASON_CHARS,
    )
    gang = tuple(
        GangPart(ID, "a" * L.MAX_ADDRESS_CHARS, L.MAX_NODE_GPUS) for _ in range(L.MAX_GANG_NODES)
    )
    place = Place(ID, ID, ID, tuple(range(L.MAX_NODE_GPUS)), core_spec, serving, ID)
    placed = decision_payload(replace(place, gang=gang, master_port=65535), PROVENANCE)
    placed.spec.CopyFrom(spec)  # the spec as large as it may be
    sizes["task_placed"] = envelope_size(placed)
    plan = Planned(
        ID,
        TEXT,
        tuple(PlannedTask(ID, ID, 1023, 1e18, 1e18, 1e18) for _ in range(L.MAX_WORKFLOW_TASKS)),
    )
    sizes["workflow_planned"] = envelope_size(decision_payload(plan, PROVENANCE))
    rejection = Reject(ID, TEXT, "r" * 10 * L.MAX_REASON_CHARS)
    sizes["job_rejected"] = envelope_size(decision_payload(rejection, PROVENANCE, spec))
    prices = {f"{i:0{L.MAX_TEXT_CHARS}d}": 1e300 for i in range(L.MAX_GPU_TYPES)}
    config = policy_from_mapping({"gpu_prices": prices}, "policy.yaml")
    announced = policy_configured(
        config,
        new_envelope(events_pb2.ClockTick(), producer="t"),
        partition=2**31 - 1,
        offset=2**63 - 1,
    )
    sizes["policy_configured"] = envelope_size(announced.policy_configured)
    too_big = {kind: size for kind, size in sizes.items() if size > L.MAX_RECORD_BYTES}
    assert too_big == {}, sizes

"""Malformed and absurd records, produced straight to every topic.

Three groups, the most destructive last, each followed by a canary job:

1. bytes that are no envelope (garbage, empty, tombstones, 1 MB near the broker's
   limit, over it), envelopes with no payload or no id or an unknown field, and
   events about nodes, jobs and tasks that never existed, on every topic
   (events, decisions, dead letters, the projector's changelogs);
2. absurd facts: nodes of no GPUs or a thousand, clocks in the year 9999 and at
   the epoch, usage of NaN and infinity;
3. absurd jobs and budgets: admissions of 0 GPUs, 2^32-1 GPUs, NaN durations, a
   100,000-task workflow; a budget tree with NaN weights and an empty one.

Records of the event log are sealed by the key of the role that writes them, as an
insider holding every key would (``tests/signed_log.py``), so that they pass the gate
and the core itself must answer them; those about nodes no agent hosts are signed by
keys no operator approved, and refused at the gate.

Forged placement decisions are left out: the audit is there to flag any decision
placement did not make. The one decision-shaped record names an input outside the
log (partition 99), which the audit ignores, and a node no agent hosts.
"""

from __future__ import annotations

import functools
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2

from libs.bus import KafkaSettings, Topics
from libs.core import simulated
from libs.events import encode, new_envelope

NEAR_LIMIT = 1_000_000  # bytes: under the broker's default message.max.bytes (1,048,588)
AT_LIMIT = 1_048_000  # fits alone; not with the headers a dead letter adds
OVER_LIMIT = 1_100_000
PRODUCER = "chaos-poison"
POISON_CLUSTER = "poison"  # absurd nodes and clocks go here, away from the workload's cluster
LONGEST = Duration(seconds=315_576_000_000)  # the longest a Duration holds (10,000 years)


@dataclass(frozen=True)
class Poison:
    topic: str  # a key of Topics: events, decisions, deadletter, jobs_view, nodes_view
    label: str
    value: bytes | None
    key: bytes = b"default"


@dataclass
class Produced:
    poison: Poison
    outcome: str  # "written" or the error that refused it
    seconds: float


def _env(payload: Message, cluster: str = "default") -> events_pb2.Envelope:
    return new_envelope(payload, producer=PRODUCER, cluster=cluster)


Seal = Callable[[events_pb2.Envelope], bytes]


def _event(
    topic: str, label: str, payload: Message, cluster: str = "default", seal: Seal = encode
) -> Poison:
    """A well-formed envelope around ``payload``, keyed by its cluster as producers key it,
    and sealed by ``seal`` (decisions are not: placement's topic has one writer)."""
    env = _env(payload, cluster)
    return Poison(topic, label, seal(env) if topic == "events" else encode(env), cluster.encode())


def _ghost() -> str:
    return f"ghost-{uuid.uuid4().hex[:8]}"


def undecodable(topic: str) -> list[Poison]:
    no_payload = events_pb2.Envelope(event_id=uuid.uuid4().hex, producer=PRODUCER)
    no_id = _env(events_pb2.ClockTick())
    no_id.event_id = ""
    # Field 1000, length-delimited: unknown to this schema; the envelope is otherwise fine.
    unknown_field = encode(_env(events_pb2.ClockTick(), POISON_CLUSTER)) + b"\xc2\x3e\x03abc"
    return [
        Poison(topic, "garbage bytes", b"\x08\x96\x01 not an envelope \xff\xfe"),
        Poison(topic, "empty value", b""),
        Poison(topic, "tombstone (null value)", None),
        Poison(topic, "1 MB of garbage (near the limit)", b"\xff" * NEAR_LIMIT),
        Poison(topic, "1,048,000 bytes (at the limit)", b"\xfe" * AT_LIMIT),
        Poison(topic, "1.1 MB (over the limit)", b"\xfd" * OVER_LIMIT),
        Poison(topic, "envelope without payload", encode(no_payload)),
        Poison(topic, "envelope without event_id", encode(no_id)),
        Poison(topic, "envelope with an unknown field", unknown_field, POISON_CLUSTER.encode()),
    ]


def ghosts(nodes: list[str], seal: Seal) -> list[Poison]:
    """Events about tasks, jobs and nodes that never existed; ``nodes`` are real ones."""
    event = functools.partial(_event, seal=seal)
    job, node = _ghost(), nodes[0]
    task = f"{job}/0"
    spec = types_pb2.JobSpec(gpus=1, allocation="nlp", user="bob", command=["x"])
    never_placed = types_pb2.Provenance(input_partition=99, input_offset=0)
    e = events_pb2
    return [
        event("events", "TaskStarted of a task never placed, on a real node",
               e.TaskStarted(job_id=job, task_id=task, node_id=node, pid=1)),
        event("events", "TaskFinished of an unknown job on an unknown node",
               e.TaskFinished(job_id=_ghost(), task_id="x/0", node_id="no-such-node")),
        event("events", "TaskFailed with a 500 kB reason",
               e.TaskFailed(job_id=job, task_id=task, node_id=node, exit_code=-9,
                            reason="r" * 500_000)),
        event("events", "TaskIdle with NaN utilisation",
               e.TaskIdle(job_id=job, task_id=task, node_id=node, idle=True,
                          utilization=math.nan)),
        event("events", "ModelLoaded of NaN MB on GPU 2^32-1 of an unknown node",
               e.ModelLoaded(node_id="no-such-node", gpu_index=2**32 - 1, model="m",
                             size_mb=math.nan, load_duration=LONGEST)),
        event("events", "ModelEvicted of an unknown model on a real node",
               e.ModelEvicted(node_id=nodes[-1], gpu_index=0, model="never-loaded")),
        event("events", "JobCancelRequested of an unknown job",
               e.JobCancelRequested(job_id=_ghost(), requested_by="x")),
        event("events", "JobSubmitted never admitted", e.JobSubmitted(job_id=_ghost(), spec=spec)),
        event("decisions", "TaskPlaced for an unknown job on a node no agent hosts",
               e.TaskPlaced(job_id=job, task_id=task, node_id="no-such-node", gpu_indices=[0],
                            provenance=never_placed)),
        event("decisions", "a ClockTick on the decisions topic", e.ClockTick(), POISON_CLUSTER),
    ]  # fmt: skip


def absurd_facts(seal: Seal) -> list[Poison]:
    event = functools.partial(_event, seal=seal)

    def node(node_id: str, gpus: list[types_pb2.Gpu]) -> events_pb2.NodeRegistered:
        return events_pb2.NodeRegistered(
            inventory=types_pb2.NodeInventory(
                node_id=node_id,
                cluster=POISON_CLUSTER,
                gpus=gpus,
                executor=types_pb2.EXECUTOR_SIMULATED,
                source="declared",
            )
        )

    thousand = [
        types_pb2.Gpu(index=i % 7, type="A100", memory_bytes=2**64 - 1) for i in range(1000)
    ]
    future = _env(events_pb2.ClockTick(), POISON_CLUSTER)
    future.occurred_at.FromDatetime(datetime(9999, 12, 31, tzinfo=UTC))
    epoch = _env(events_pb2.ClockTick(), POISON_CLUSTER)
    epoch.ClearField("occurred_at")
    # Past any datetime: an input that is decided (here rejected) would be stamped with it.
    beyond = _env(events_pb2.JobAdmitted(job_id="j-poison-beyond"), POISON_CLUSTER)
    beyond.occurred_at.seconds = 2**40
    usage = events_pb2.UsageSnapshot(
        window=LONGEST,
        usage=[
            types_pb2.AllocationUsage(allocation="nlp", allocated_gpu_s=math.nan),
            types_pb2.AllocationUsage(allocation="vision-detection", allocated_gpu_s=math.inf),
            types_pb2.AllocationUsage(allocation="no-such-allocation", unallocated_gpu_s=-1e308),
        ],
    )
    key = POISON_CLUSTER.encode()
    return [
        event("events", "NodeRegistered with no GPUs", node("poison-empty", []), POISON_CLUSTER),
        event("events", "NodeRegistered with 1,000 GPUs on 7 indices of 2^64-1 bytes",
               node("poison-huge", thousand), POISON_CLUSTER),
        Poison("events", "ClockTick in the year 9999", seal(future), key),
        Poison("events", "ClockTick at the epoch", seal(epoch), key),
        Poison("events", "JobAdmitted after the year 9999", seal(beyond), key),
        event("events", "UsageSnapshot of NaN and infinite usage (default cluster)", usage),
    ]  # fmt: skip


def absurd_jobs_and_budgets(tree: types_pb2.BudgetTree, seal: Seal) -> list[Poison]:
    event = functools.partial(_event, seal=seal)

    def admitted(label: str, change: Callable[[types_pb2.JobSpec], None]) -> Poison:
        spec = types_pb2.JobSpec(
            allocation="nlp",
            user="bob",
            gpus=1,
            gpu_type="A100",
            command=["x"],
            env={simulated.SECONDS: "1.0"},
            client_request_id=_ghost(),
        )
        change(spec)
        return event("events", label, events_pb2.JobAdmitted(job_id=_ghost(), spec=spec))

    def zero(spec: types_pb2.JobSpec) -> None:
        spec.gpus = 0

    def most(spec: types_pb2.JobSpec) -> None:
        spec.gpus = 2**32 - 1

    def nan(spec: types_pb2.JobSpec) -> None:
        spec.env[simulated.SECONDS] = "nan"
        spec.min_gpu_memory_gib = math.nan

    def stranger(spec: types_pb2.JobSpec) -> None:
        spec.allocation, spec.user = "no-such-allocation", "nobody"

    def wide(spec: types_pb2.JobSpec) -> None:
        """100,000 tasks of an id each, about 900 kB: it fits in a record."""
        spec.gpu_type = "T4"
        del spec.command[:]
        spec.workflow.name = "wide"
        for i in range(100_000):
            spec.workflow.tasks.add(task_id=f"{i:x}")

    nan_tree = types_pb2.BudgetTree()
    nan_tree.CopyFrom(tree)
    nan_tree.version += 1000
    for node in nan_tree.nodes:
        node.weight = math.nan
    empty = types_pb2.BudgetTree(version=tree.version + 2000)
    return [
        admitted("JobAdmitted of 0 GPUs", zero),
        admitted("JobAdmitted of 2^32-1 GPUs", most),
        admitted("JobAdmitted of NaN duration and GPU memory", nan),
        admitted("JobAdmitted of an unknown allocation and user", stranger),
        admitted("JobAdmitted of a 100,000-task workflow", wide),
        event("events", "BudgetChanged with NaN weights",
               events_pb2.BudgetChanged(tree=nan_tree, changed_by="x"), POISON_CLUSTER),
        event("events", "BudgetChanged to an empty tree",
               events_pb2.BudgetChanged(tree=empty, changed_by="x"), POISON_CLUSTER),
    ]  # fmt: skip


def groups(
    nodes: list[str], tree: types_pb2.BudgetTree, seal: Seal
) -> list[tuple[str, list[Poison]]]:
    """The three groups, in the order they are produced; the event log's records sealed
    by ``seal``."""
    topics = ("events", "decisions", "deadletter", "jobs_view", "nodes_view")
    every_topic = [poison for topic in topics for poison in undecodable(topic)]
    return [
        ("undecodable records and ghosts, every topic", [*every_topic, *ghosts(nodes, seal)]),
        ("absurd nodes, clocks and usage", absurd_facts(seal)),
        ("absurd jobs and budget trees", absurd_jobs_and_budgets(tree, seal)),
    ]


async def produce(settings: KafkaSettings, topics: Topics, poisons: list[Poison]) -> list[Produced]:
    """Write each record as it is; a refusal (too large, ...) is an outcome, not an error."""
    # Not KafkaBus's producer: an outsider's, that lets the broker judge what it is sent.
    producer = AIOKafkaProducer(
        **settings.client_kwargs(),
        client_id=PRODUCER,
        max_request_size=4 << 20,  # let the broker judge the oversized records
        request_timeout_ms=20_000,
    )
    await producer.start()
    done = []
    try:
        for poison in poisons:
            topic = getattr(topics, poison.topic).name
            began = time.monotonic()
            try:
                await producer.send_and_wait(topic, value=poison.value, key=poison.key)
                outcome = "written"
            except KafkaError as exc:
                outcome = f"refused: {type(exc).__name__}"
            done.append(Produced(poison, outcome, time.monotonic() - began))
    finally:
        await producer.stop()
    return done

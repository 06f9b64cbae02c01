"""Failover: two placement instances share four input partitions; one is killed (-9).

A fresh set of topics with four partitions, one cluster keyed onto each (a node of 64
GPUs per cluster node, ``nodes_per_cluster`` of them), and two placement processes
in one group, as the local stack runs them. Jobs are written to the event log at
``rate`` per second, round-robin over the clusters, for the whole run; a reader of the
decisions topic (read_committed, as every downstream reader) notes when each decision
arrives. Once each instance decides two partitions, one is killed with SIGKILL at t0.

- ``failover.seconds``: for each partition the dead instance decided, from t0 to the
  arrival of the first decision of a job written after t0; the worst partition.
- ``failover.duplicates``: decisions committed more than once (by event id: the input
  position and the decision's index) plus jobs placed more than once; must be 0.
- ``failover.lost``: jobs written that never got a decision; must be 0.
- ``failover.audit_ok``: 1 when ``qm audit verify`` reproduces every decision.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.partitioner import DefaultPartitioner
from qm.v1 import events_pb2, types_pb2

from libs.bus import EventProducer, KafkaBus, load_topic_config
from libs.events import DecodeError, decode, new_envelope
from tests.integration.stack import ROOT, Stack
from tests.perf.live_bench import broker
from tests.perf.options import option
from tests.perf.ranges import Figure
from tests.perf.stats import console, fmt, table
from tests.signed_log import Signers, sign

PARTITIONS = 4
INSTANCES = ("a", "b")
_OWNS = re.compile(r"partition (\d+): (deciding from offset|given up)")


@dataclass(frozen=True)
class FailoverParams:
    rate: float = option(40.0, "jobs written per second, over all clusters", flag="--jobs-rate")
    after_s: float = option(10.0, "seconds of jobs after the kill", flag="--after-kill")
    nodes_per_cluster: int = 8
    bootstrap: str = "127.0.0.1:19092"
    settle_s: float = 60.0  # at most this long for both instances to decide two partitions


@dataclass
class FailoverResult:
    seconds: float
    per_partition: dict[int, float]
    duplicates: int
    lost: int
    jobs: int
    audit_ok: bool
    victim_partitions: list[int] = field(default_factory=list)
    # What was doubled, to find out why: each event id committed more than once, and each
    # job placed more than once, with where each copy was read (``partition@offset``): one
    # record read twice is the reader's fault, two records are a decision made twice.
    doubled: dict[str, list[str]] = field(default_factory=dict)


def clusters() -> list[str]:
    """A cluster name keyed onto each partition (Kafka's default partitioner)."""
    partitioner, found = DefaultPartitioner(), dict[int, str]()
    index = 0
    while len(found) < PARTITIONS:
        name = f"dc-{index}"
        partition = partitioner(name.encode(), list(range(PARTITIONS)), list(range(PARTITIONS)))
        found.setdefault(partition, name)
        index += 1
    return [found[p] for p in range(PARTITIONS)]


def owned(stack: Stack, instance: str) -> set[int]:
    """The partitions an instance's log says it decides now."""
    mine: set[int] = set()
    path = stack.logs / f"placement-{instance}.log"
    for match in _OWNS.finditer(path.read_text(errors="replace") if path.exists() else ""):
        partition = int(match.group(1))
        if match.group(2) == "given up":
            mine.discard(partition)
        else:
            mine.add(partition)
    return mine


@dataclass
class Watcher:
    """Reads the decisions topic; notes each decision's arrival, and where it was read."""

    stack: Stack
    arrivals: list[tuple[float, events_pb2.Envelope, str]] = field(default_factory=list)

    async def run(self, topic: str) -> None:
        consumer = KafkaBus(self.stack.kafka_settings()).consumer(fetch_max_wait_ms=50)
        await consumer.start()
        consumer.subscribe([topic])
        try:
            while True:
                polled = await consumer.getmany(timeout_ms=200)
                now = time.time()
                for records in polled.values():
                    for record in records:
                        try:
                            envelope = decode(record.value)
                        except DecodeError:
                            continue
                        self.arrivals.append((now, envelope, f"{record.partition}@{record.offset}"))
        finally:
            await consumer.stop()


async def _scenario(stack: Stack, params: FailoverParams) -> FailoverResult:
    topics = load_topic_config(stack.topics_file)
    names = clusters()
    bus = KafkaBus(stack.kafka_settings())
    sent: dict[str, tuple[float, int]] = {}  # job id -> (written at, partition)
    watcher = Watcher(stack)
    watching = asyncio.create_task(watcher.run(topics.decisions.name))
    # Signed as their writers sign them, each node approved first (placement refuses
    # anything else).
    signers = Signers(stack.trust_file.parent)
    async with EventProducer(bus, client_id="failover-bench", sealer=signers) as producer:
        for cluster in names:
            for n in range(params.nodes_per_cluster):
                inventory = types_pb2.NodeInventory(
                    node_id=f"{cluster}-n{n}",
                    gpus=[
                        types_pb2.Gpu(index=i, type="H100", memory_bytes=80 << 30)
                        for i in range(64)
                    ],
                )
                env = new_envelope(
                    events_pb2.NodeRegistered(inventory=inventory),
                    producer="bench",
                    cluster=cluster,
                )
                for sealed in sign([env], signers):
                    await producer.send(topics.events.name, sealed)
        for instance in INSTANCES:
            stack.start_instance(
                f"placement-{instance}", "placement", {"QM_PLACEMENT_INSTANCE": instance}
            )

        count = 0

        async def write_jobs(until: float) -> None:
            nonlocal count
            interval = 1.0 / params.rate
            while (now := time.time()) < until:
                partition = count % PARTITIONS
                job_id = f"job-{count}"
                spec = types_pb2.JobSpec(allocation="a", user="u", gpus=1, command=["true"])
                env = new_envelope(
                    events_pb2.JobAdmitted(job_id=job_id, spec=spec),
                    producer="bench",
                    cluster=names[partition],
                )
                await producer.enqueue(topics.events.name, env)
                sent[job_id] = (now, partition)
                count += 1
                await asyncio.sleep(max(0.0, interval - (time.time() - now)))

        # Both instances decide two partitions each, steadily.
        deadline = time.monotonic() + params.settle_s
        while True:
            await write_jobs(time.time() + 1.0)
            split = [owned(stack, i) for i in INSTANCES]
            if all(len(s) == 2 for s in split) and not split[0] & split[1]:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the instances never split the partitions: {split}")
        victim = sorted(split[0])
        t0 = time.time()
        stack.kill(f"placement-{INSTANCES[0]}")
        await write_jobs(t0 + params.after_s)
        # Every job gets a decision (placed or pending) once the survivor catches up.
        drain = time.monotonic() + 60
        while time.monotonic() < drain:
            decided = {env.correlation_id for _, env, _ in watcher.arrivals}
            if decided >= sent.keys():
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)  # and a moment more, for any duplicate on its way
    watching.cancel()
    await asyncio.gather(watching, return_exceptions=True)

    per_partition = {}
    for partition in victim:
        firsts = [
            at
            for at, env, _ in watcher.arrivals
            if env.correlation_id in sent
            and sent[env.correlation_id][1] == partition
            and sent[env.correlation_id][0] > t0
        ]
        per_partition[partition] = (min(firsts) - t0) if firsts else float("inf")
    copies: dict[str, list[str]] = {}
    for _, env, where in watcher.arrivals:
        copies.setdefault(env.event_id, []).append(where)
        if env.HasField("task_placed"):
            copies.setdefault(f"placed {env.task_placed.job_id}", []).append(where)
    doubled = {k: where for k, where in copies.items() if len(where) > 1}
    duplicates = sum(len(where) - 1 for where in doubled.values())
    decided = {env.correlation_id for _, env, _ in watcher.arrivals}
    return FailoverResult(
        seconds=max(per_partition.values()),
        per_partition=per_partition,
        duplicates=duplicates,
        doubled=doubled,
        lost=len(sent.keys() - decided),
        jobs=len(sent),
        audit_ok=audit(stack),
        victim_partitions=victim,
    )


def audit(stack: Stack) -> bool:
    """``qm audit verify`` over the run's topics, as an auditor would run it."""
    done = subprocess.run(
        [sys.executable, "-m", "cli", "audit", "verify", "-o", "json"],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    try:
        return done.returncode == 0 and bool(json.loads(done.stdout)["ok"])
    except (ValueError, KeyError):
        console.print(f"audit: {done.stdout[-500:]} {done.stderr[-500:]}")
        return False


def scenario(workdir: Path, params: FailoverParams) -> FailoverResult:
    stack = Stack(workdir, bootstrap=params.bootstrap, partitions=PARTITIONS)
    stack.create_topics()
    try:
        return asyncio.run(_scenario(stack, params))
    finally:
        stack.down()


def run_failover(params: FailoverParams) -> list[Figure]:
    with broker(params.bootstrap), tempfile.TemporaryDirectory() as workdir:
        result = scenario(Path(workdir), params)
    table(
        f"failover: 2 placement instances × {PARTITIONS} partitions, one killed (-9); "
        f"{result.jobs} jobs at {params.rate:g}/s (target ≤ 5 s, no decision lost or doubled)",
        ["partition (killed owner's)", "first decision after the kill, s"],
        [[str(p), fmt(s)] for p, s in sorted(result.per_partition.items())],
    )
    console.print(
        f"failover: {fmt(result.seconds)} s worst; duplicates {result.duplicates}, "
        f"lost {result.lost}, audit {'reproduces' if result.audit_ok else 'FAILS'}"
    )
    if result.doubled:
        console.print(f"failover: doubled (id: where each copy was read) {result.doubled}")
    return [
        Figure("failover.seconds", result.seconds, "s"),
        Figure("failover.duplicates", result.duplicates, ""),
        Figure("failover.lost", result.lost, ""),
        Figure("failover.audit_ok", 1.0 if result.audit_ok else 0.0, ""),
    ]

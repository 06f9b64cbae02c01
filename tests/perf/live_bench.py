"""Live stack: submit-to-TaskPlaced latency through gRPC, Kafka and placement.

For each mode a fresh stack (``tests/integration/stack.py``: fresh topics, groups and
ports) runs on the broker with ``nodes`` simulated 8-GPU nodes in one node agent:

- ``placement``: the real placement service;
- ``echo``: ``tests.perf.echo`` in its place, the same Kafka hops and transaction
  shape with no scheduling: the baseline.

A seeded open-loop submitter (grpc.aio, ``concurrency`` callers, submission ``i`` due
at ``t0 + i / rate``) calls ``SubmitJob`` for ``duration_s``; a consumer of the
decisions topic (read_committed, like every downstream reader) notes when each
job's first TaskPlaced, and its first decision of any kind (TaskPlaced or
JobPending), arrive. Latency = bench receive time - client send time, both
``time.time()`` in this process: the whole path a node agent sees, transaction
commit included. "placed" depends on free GPUs (so on how fast node agents report
ends); "decided" does not: it is how fast placement answers at all. Each decision
envelope carries admission's timestamp of the JobAdmitted (``occurred_at``) and
Kafka's CreateTime (set when placement queued it), which split the path into
→admitted / →queued / →visible (same host, one clock). Per-process CPU over the
window comes from /proc; services run under ``tests.perf.phases``, whose timers
say where each one's wall time went.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import io
import itertools
import math
import os
import pstats
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import yaml
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2

from libs.bus import KafkaBus, load_topic_config
from libs.core import simulated
from libs.events import DecodeError, decode, event_type, occurred_at, wire_time
from tests.integration.stack import ROOT, Stack
from tests.perf.echo import node_name
from tests.perf.options import option
from tests.perf.phases import diff, read_snapshots
from tests.perf.ranges import Figure
from tests.perf.stats import console, fmt, percentile, ratio, table

TEST_KAFKA_DIR = ROOT / ".local" / "kafka-test"
# Services run under tests.perf.phases (wall-clock timers on their Kafka seams).
TIMED = {
    "admission": "services.admission.__main__",
    "placement": "services.placement.__main__",
    "node_agent": "services.node_agent.cli",
}
CLK_TCK = os.sysconf("SC_CLK_TCK")
INF = float("inf")
# The floor is saturated when it places less than this share of the offered rate; the
# second run offers this share of what it did place.
SATURATED = 0.9
SUSTAINED = 0.5


@dataclass(frozen=True)
class LiveParams:
    nodes: int = option(200, flag="--sim-nodes")
    gpus_per_node: int = 8
    rate: float = option(500.0, "submissions per second")
    duration_s: float = option(20.0, flag="--duration", metavar="S")
    concurrency: int = option(64)
    job_s: float = option(0.5, flag="--job-seconds", metavar="S")
    modes: tuple[str, ...] = option(("echo", "placement"), "echo,placement")
    bootstrap: str = option("127.0.0.1:19092")
    profile: str = option(
        "",
        "run this service under cProfile (skews its latency)",
        choices=("", "placement", "admission", "node_agent"),
    )
    warmup: int = 40
    drain_s: float = 30.0
    seed: int = 11


@dataclass
class PerfStack(Stack):
    """The integration Stack with many simulated nodes, and echo or a profiled placement."""

    mode: str = "placement"
    nodes: int = 200
    gpus_per_node: int = 8
    profile: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        nodes = [
            {
                "node_id": node_name(i),
                "gpu_type": "H100",
                "gpu_count": self.gpus_per_node,
                "gpu_memory_gib": 80,
                "executor": "simulated",
            }
            for i in range(self.nodes)
        ]
        (self.workdir / "nodes.yaml").write_text(yaml.safe_dump({"nodes": nodes}))
        self.profile_path = self.workdir / f"{self.profile}.prof"

    @property
    def env(self) -> dict[str, str]:
        # The production default: no span export (the tests print spans to the logs).
        return {**super().env, "OTEL_TRACES_EXPORTER": "none", "QM_ECHO_NODES": str(self.nodes)}

    def start(self, name: str, *args: str) -> None:
        module = TIMED.get(name)
        if name == "placement" and self.mode == "echo":
            module = "tests.perf.echo"
        command = [sys.executable, "-m", f"services.{name}", *args]
        if module is not None:
            command = [sys.executable, "-m", "tests.perf.phases", module, *args]
        if name == self.profile:
            command[1:1] = ["-m", "cProfile", "-o", str(self.profile_path)]
        log = (self.logs / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            command, cwd=ROOT, env=self.service_env(name), stdout=log, stderr=subprocess.STDOUT
        )


@dataclass
class Submission:
    index: int
    sent: float = 0.0  # time.time() just before the call
    replied: float = 0.0
    late_s: float = 0.0  # how far behind its due time it went out
    job_id: str = ""
    error: str = ""


@dataclass
class Seen:
    """One decision record for a job, as this process received it."""

    received: float  # time.time() when this process got the record
    created: float  # Kafka CreateTime: when placement queued the record
    admitted: float  # the JobAdmitted's occurred_at, set by admission


@dataclass
class ModeResult:
    mode: str
    submissions: list[Submission]
    placed: dict[str, Seen]  # job id -> its first TaskPlaced
    decided: dict[str, Seen]  # job id -> its first decision of any kind
    pending: int
    window_s: float
    cpu: dict[str, float] = field(default_factory=dict)  # process -> % of one core
    machine: dict[str, float] = field(default_factory=dict)  # busy/steal % of all cores
    phases: dict[str, dict[str, list[float]]] = field(default_factory=dict)

    @property
    def ok(self) -> list[Submission]:
        return [s for s in self.submissions if not s.error]

    def latencies_ms(
        self, subs: list[Submission] | None = None, *, decided: bool = False
    ) -> list[float]:
        """Per successful submission; a job never placed (decided) counts as infinitely late."""
        seen = self.decided if decided else self.placed
        return [
            (seen[s.job_id].received - s.sent) * 1e3 if s.job_id in seen else INF
            for s in (self.ok if subs is None else subs)
        ]

    def split_ms(self) -> tuple[list[float], list[float], list[float]]:
        """Per first decision: send→admitted, admitted→queued by placement, →received."""
        admission, decide, commit = [], [], []
        for s in self.ok:
            p = self.decided.get(s.job_id)
            if p is not None:
                admission.append((p.admitted - s.sent) * 1e3)
                decide.append((p.created - p.admitted) * 1e3)
                commit.append((p.received - p.created) * 1e3)
        return admission, decide, commit

    def throughput(self) -> float:
        """Jobs placed per second, from the first submission to the last placement seen."""
        sent = [s.sent for s in self.ok]
        received = [p.received for p in self.placed.values()]
        span = max(received, default=0.0) - min(sent, default=0.0)
        return len(received) / span if received and span > 0 else 0.0

    def achieved_rate(self) -> float:
        sent = sorted(s.sent for s in self.ok)
        return (len(sent) - 1) / (sent[-1] - sent[0]) if len(sent) > 1 else 0.0

    def timeline(self, parts: int = 4) -> list[float]:
        """p50 latency of the submissions in each successive part of the run."""
        ok = sorted(self.ok, key=lambda s: s.sent)
        size = max(1, len(ok) // parts)
        return [
            percentile(self.latencies_ms(ok[i * size : (i + 1) * size]), 50) for i in range(parts)
        ]


def _answers(bootstrap: str) -> bool:
    host, port = bootstrap.rsplit(":", 1)
    with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=1):
        return True
    return False


@contextlib.contextmanager
def broker(bootstrap: str) -> Iterator[None]:
    """Use the broker if it answers; otherwise start the test broker and stop it after."""
    if _answers(bootstrap):
        yield
        return
    if bootstrap != "127.0.0.1:19092":
        raise SystemExit(f"no broker answers on {bootstrap}")
    env = {**os.environ, "QM_KAFKA_DIR": str(TEST_KAFKA_DIR), "QM_KAFKA_PORT": "19092"}
    script = str(ROOT / "deploy" / "local" / "kafka.sh")
    subprocess.run([script, "start"], env=env, check=True, timeout=180)
    try:
        yield
    finally:
        subprocess.run([script, "stop"], env=env, check=False, timeout=60)


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def _pids(stack: Stack) -> dict[str, int]:
    pids = {name: process.pid for name, process in stack.processes.items()}
    pids["bench (this process)"] = os.getpid()
    pidfile = TEST_KAFKA_DIR / "kafka.pid"
    if stack.bootstrap.endswith(":19092") and pidfile.exists():
        with contextlib.suppress(ValueError):
            pids["kafka broker"] = int(pidfile.read_text().strip())
    return pids


class Collector:
    """Reads the decisions topic from the start; notes each job's first decisions."""

    def __init__(self, stack: Stack) -> None:
        self.topic = load_topic_config(stack.topics_file).decisions.name
        self.consumer = KafkaBus(stack.kafka_settings()).consumer(fetch_max_wait_ms=50)
        self.consumer.subscribe([self.topic])
        self.placed: dict[str, Seen] = {}
        self.decided: dict[str, Seen] = {}
        self.pending = 0

    async def run(self) -> None:
        while True:
            polled = await self.consumer.getmany(timeout_ms=200, max_records=2000)
            now = time.time()
            for records in polled.values():
                for record in records:
                    try:
                        env = decode(record.value)
                    except DecodeError:
                        continue
                    kind = event_type(env)
                    if kind not in ("task_placed", "job_pending"):
                        continue
                    seen = Seen(now, record.timestamp / 1e3, occurred_at(env))
                    job_id = env.correlation_id
                    self.decided.setdefault(job_id, seen)
                    if kind == "task_placed":
                        self.placed.setdefault(job_id, seen)
                    else:
                        self.pending += 1


async def _wait_nodes(stack: Stack, nodes: int, timeout: float) -> None:
    """Until every simulated node's NodeRegistered is in the event log."""
    consumer = KafkaBus(stack.kafka_settings()).consumer()
    consumer.subscribe([load_topic_config(stack.topics_file).events.name])
    await consumer.start()
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(seen) < nodes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(seen)} of {nodes} nodes registered")
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    with contextlib.suppress(DecodeError):
                        env = decode(record.value)
                        if event_type(env) == "node_registered":
                            seen.add(env.node_registered.inventory.node_id)
    finally:
        await consumer.stop()


def _request(rng: random.Random, job_s: float) -> js.SubmitJobRequest:
    return js.SubmitJobRequest(
        spec=types_pb2.JobSpec(
            allocation=rng.choice(("vision", "nlp")),
            gpus=rng.choice((1, 1, 1, 2, 2, 4)),
            command=["train.py"],
            min_runtime=wire_time.duration(rng.choice((0, 0, 600))),
            env={simulated.SECONDS: repr(job_s)},
        )
    )


async def _submit(
    stub: js_grpc.JobServiceStub,
    metadata: tuple[tuple[str, str], ...],
    requests: list[js.SubmitJobRequest],
    rate: float,
    concurrency: int,
) -> list[Submission]:
    loop = asyncio.get_running_loop()
    results = [Submission(i) for i in range(len(requests))]
    indices = itertools.count()
    start = loop.time() + 0.05

    async def caller() -> None:
        while (i := next(indices)) < len(requests):
            due = start + i / rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            sub = results[i]
            sub.late_s = max(0.0, loop.time() - due)
            sub.sent = time.time()
            try:
                reply = await stub.SubmitJob(requests[i], metadata=metadata, timeout=30)
                sub.job_id = reply.job_id
            except grpc.aio.AioRpcError as exc:
                sub.error = f"{exc.code().name}: {exc.details()}"
            sub.replied = time.time()

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    return results


def _machine() -> tuple[int, int, int]:
    """(busy, total, steal) jiffies over all CPUs, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait + steal, steal


def _snapshot(stack: PerfStack) -> None:
    """Ask every timed service for its phase totals (a QM-PHASES line in its log)."""
    for name in TIMED:
        process = stack.processes.get(name)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGUSR1)


async def _measure(stack: PerfStack, params: LiveParams) -> ModeResult:
    await _wait_nodes(stack, params.nodes, timeout=90)
    collector = Collector(stack)
    await collector.consumer.start()
    reader = asyncio.create_task(collector.run())
    rng = random.Random(params.seed)
    pids = _pids(stack)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.admission_port}") as channel:
            stub = js_grpc.JobServiceStub(channel)
            metadata = stack.auth("alice")
            # Warm-up (excluded): first RPCs, budget fetch, transactions, rebalances.
            warm = await _submit(
                stub, metadata, [_request(rng, params.job_s) for _ in range(params.warmup)], 20, 4
            )
            await _until_placed(collector, [s.job_id for s in warm if s.job_id], 60)
            count = int(params.rate * params.duration_s)
            requests = [_request(rng, params.job_s) for _ in range(count)]
            before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
            machine_before = _machine()
            _snapshot(stack)
            began = time.monotonic()
            pending_before = collector.pending
            subs = await _submit(stub, metadata, requests, params.rate, params.concurrency)
            await _until_placed(collector, [s.job_id for s in subs if s.job_id], params.drain_s)
            window = time.monotonic() - began
            _snapshot(stack)
            cpu = {
                name: (_cpu_seconds(pid) - before[name]) / window * 100
                for name, pid in pids.items()
            }
            busy, total, steal = (b - a for a, b in zip(machine_before, _machine(), strict=True))
            machine = {
                "busy": 100 * busy / max(total, 1),
                "steal": 100 * steal / max(total, 1),
                "load": os.getloadavg()[0],
            }
            await asyncio.sleep(0.5)  # let the services write their snapshots
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        await collector.consumer.stop()
    return ModeResult(
        stack.mode,
        subs,
        collector.placed,
        collector.decided,
        collector.pending - pending_before,
        window,
        cpu,
        machine,
    )


async def _until_placed(collector: Collector, job_ids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(j not in collector.placed for j in job_ids):
        await asyncio.sleep(0.1)


def run_mode(params: LiveParams, mode: str) -> ModeResult:
    workdir = Path(tempfile.mkdtemp(prefix=f"qm-bench-{mode}-"))
    stack = PerfStack(
        workdir,
        bootstrap=params.bootstrap,
        mode=mode,
        nodes=params.nodes,
        gpus_per_node=params.gpus_per_node,
        profile=params.profile if mode == "placement" or params.profile != "placement" else "",
    )
    console.print(f"live {mode}: stack logs in {workdir / 'logs'}")
    # Stop the stack on SIGTERM too (``make`` interrupted, a timeout).
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        stack.up()
        result = asyncio.run(_measure(stack, params))
    finally:
        stack.down()
        signal.signal(signal.SIGTERM, previous)
    for name in TIMED:
        path = stack.logs / f"{name}.log"
        snapshots = read_snapshots(path.read_text(errors="replace")) if path.exists() else []
        if len(snapshots) >= 2:
            result.phases[name] = diff(snapshots[-2][1], snapshots[-1][1])
    if stack.profile:
        _print_profile(stack.profile_path, stack.profile)
    return result


def _print_profile(path: Path, name: str) -> None:
    if not path.exists():
        console.print(f"no profile at {path}")
        return
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(20)
    text = out.getvalue()
    console.print(f"{name} cProfile, by own time (CPU only; awaits excluded):")
    console.print(text[text.find("   ncalls") :], markup=False)


def _ms(values: list[float], q: float) -> str:
    value = percentile(values, q)
    return "never" if value == INF else fmt(value)


def _versus(mine: list[list[float]], theirs: list[list[float]], index: int, q: float) -> str:
    return ratio(percentile(mine[index], q), percentile(theirs[index], q))


def report_live(params: LiveParams, results: list[ModeResult]) -> None:
    rows = []
    base = next((r for r in results if r.mode == "echo"), None)

    def columns(r: ModeResult) -> list[list[float]]:
        return [
            r.latencies_ms(),
            r.latencies_ms(decided=True),
            [(s.replied - s.sent) * 1e3 for s in r.ok],
            *r.split_ms(),
        ]

    for r in results:
        placed, decided, rpc, admitted, queued, visible = columns(r)
        late = [s.late_s * 1e3 for s in r.submissions]
        rows.append(
            [
                r.mode,
                f"{len(r.ok)}/{len(r.submissions)}",
                fmt(r.achieved_rate()),
                f"{sum(1 for s in r.ok if s.job_id in r.placed)}",
                *(_ms(placed, q) for q in (50, 90, 99)),
                _ms(decided, 50),
                _ms(decided, 99),
                *(fmt(percentile(v, 50)) for v in (rpc, admitted, queued, visible)),
                fmt(percentile(late, 99)),
            ]
        )
    if base is not None:
        for r in results:
            if r is base:
                continue
            mine, theirs = columns(r), columns(base)
            vs = functools.partial(_versus, mine, theirs)
            rows.append(
                [
                    f"{r.mode} ÷ echo",
                    "",
                    ratio(r.achieved_rate(), base.achieved_rate()),
                    "",
                    vs(0, 50),
                    vs(0, 90),
                    vs(0, 99),
                    vs(1, 50),
                    vs(1, 99),
                    *(vs(i, 50) for i in range(2, 6)),
                    "",
                ]
            )
    table(
        f"live: submit → decision received, ms ({params.nodes} simulated nodes × "
        f"{params.gpus_per_node} GPUs, {params.rate:g}/s for {params.duration_s:g} s, "
        f"{params.concurrency} callers, jobs {params.job_s:g} s; never = none within "
        f"{params.drain_s:g} s after the last submit; splits are p50 of first decisions)",
        [
            "mode",
            "ok",
            "rate/s",
            "placed",
            "placed p50",
            "p90",
            "p99",
            "decided p50",
            "p99",
            "rpc p50",
            "→admitted",
            "→queued",
            "→visible",
            "late p99",
        ],
        rows,
    )
    for r in results:
        errors = sorted({s.error for s in r.submissions if s.error})
        cpu = ", ".join(f"{k} {v:.0f}%" for k, v in sorted(r.cpu.items(), key=lambda kv: -kv[1]))
        quarters = " / ".join(_ms([v], 50) for v in r.timeline())
        machine = r.machine
        console.print(
            f"{r.mode}: window {r.window_s:.1f} s, JobPending {r.pending}, placed p50 by quarter "
            f"{quarters}; machine busy {machine.get('busy', 0):.0f}% of {os.cpu_count()} CPUs "
            f"(steal {machine.get('steal', 0):.0f}%, load {machine.get('load', 0):.1f}); "
            f"per process (% of one core): {cpu}" + (f"; errors: {errors[:3]}" if errors else "")
        )
        for name, phases in r.phases.items():
            shown = sorted(
                ((label, v) for label, v in phases.items() if v[0]), key=lambda kv: -kv[1][1]
            )
            parts = [
                f"{label} {v[1] / r.window_s * 100:.0f}% ({int(v[0])}× {v[1] / v[0] * 1e3:.2g} ms)"
                for label, v in shown
            ]
            console.print(f"  {r.mode}/{name} wall time by seam: " + "; ".join(parts))


def run_live(params: LiveParams) -> list[Figure]:
    """The modes at ``params.rate``; with both modes, both again at half the rate the floor
    placed (at most ``params.rate``): ``live.sustained.*``. Open-loop submissions past what
    the machine sustains grow a backlog, so a saturated run's tail measures how long it
    lasted as much as placement; ``live.saturated`` says whether the floor kept up."""
    with broker(params.bootstrap):
        results = [run_mode(params, mode) for mode in params.modes]
        report_live(params, results)
        figures = live_figures(results)
        floor = next((r for r in results if r.mode == "echo"), None)
        if floor is None or "placement" not in params.modes:
            return figures
        saturated = floor.throughput() < SATURATED * params.rate
        rate = min(params.rate, max(10.0, math.floor(floor.throughput() * SUSTAINED / 10) * 10))
        console.print(
            f"live: the floor placed {floor.throughput():.0f}/s of {params.rate:g}/s offered"
            f"{' (saturated)' if saturated else ''}; again at {rate:g}/s"
        )
        sustained = dataclasses.replace(params, rate=rate)
        again = [run_mode(sustained, mode) for mode in ("echo", "placement")]
    report_live(sustained, again)
    return [
        *figures,
        Figure("live.saturated", float(saturated), ""),
        Figure("live.sustained.rate_per_s", rate, "/s"),
        *live_figures(again, "sustained."),
    ]


def live_figures(results: list[ModeResult], scope: str = "") -> list[Figure]:
    """Placement's submit -> placed latency and throughput, echo's beside them (the floor:
    the same hops without scheduling), their ratios, and the share answered OK per mode;
    named ``live.<scope>...``."""
    figures: list[Figure] = []
    by_mode = {r.mode: r for r in results}
    for r in results:
        share = len(r.ok) / len(r.submissions) if r.submissions else math.nan
        figures.append(Figure(f"live.{scope}{r.mode}.ok_share", share, ""))
    measured: dict[str, dict[str, float]] = {}
    for mode, r in by_mode.items():
        latencies = r.latencies_ms()
        prefix = "" if mode == "placement" else f"{mode}_"
        measured[mode] = {
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "throughput": r.throughput(),
        }
        figures += [
            Figure(f"live.{scope}{prefix}p50_ms", measured[mode]["p50"], "ms"),
            Figure(f"live.{scope}{prefix}p99_ms", measured[mode]["p99"], "ms"),
            Figure(f"live.{scope}{prefix}throughput_per_s", measured[mode]["throughput"], "/s"),
        ]
    if {"echo", "placement"} <= measured.keys():
        mine, floor = measured["placement"], measured["echo"]
        throughput = _ratio(mine["throughput"], floor["throughput"])
        figures += [
            Figure(f"live.{scope}p99_vs_echo", _ratio(mine["p99"], floor["p99"]), "×"),
            Figure(f"live.{scope}throughput_vs_echo", throughput, "×"),
        ]
    return figures


def _ratio(mine: float, floor: float) -> float:
    return mine / floor if floor > 0 and math.isfinite(floor) else math.nan

"""One chaos run, phase by phase, inside its time budget.

1. faults: the workload flows while each service, a node agent and the broker are
   killed in turn (tests.chaos.faults);
2. fuzz: the workload flows while fuzzed requests hit every RPC (tests.chaos.fuzz);
3. drain: submissions stop, jobs the fuzzer got accepted are cancelled, every
   accepted job must end (or wait with a reason), every GPU must be free again
   within the node-loss timeout + 10 s; the log is judged (tests.chaos.invariants);
4. poison: malformed records on every topic, a canary job after each group, the
   projector killed to recover from its poisoned changelogs;
5. audit: ``qm audit verify`` over the whole log.

The load phases share what the budget leaves after the fixed costs of the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from qm.v1 import budget_service_pb2 as bs
from qm.v1 import cluster_service_pb2 as cs
from qm.v1 import job_service_pb2 as js

from libs.bus import KafkaSettings, Topics, load_topic_config
from tests.chaos import invariants
from tests.chaos.clients import Clients
from tests.chaos.exits import crashes
from tests.chaos.faults import (
    FREED_IN_LOG,
    FREED_IN_VIEW,
    STOPPED_BY_PLACEMENT,
    VIEW_LAG_S,
    Faults,
    Recovery,
)
from tests.chaos.fuzz import Fuzzer, FuzzResult
from tests.chaos.observer import Observer, read_log
from tests.chaos.poison import groups, produce
from tests.chaos.report import Report
from tests.chaos.stack import AGENTS, ChaosStack
from tests.chaos.workload import RETRYABLE, Submission, Workload, write_specs
from tests.integration.stack import ROOT
from tests.perf.options import option
from tests.perf.stats import summary
from tests.signed_log import Signers

log = logging.getLogger("chaos")

PHASES = frozenset({"faults", "fuzz", "poison"})
# Seconds the phases after the load need, at most; the load gets the rest.
DRAIN_S = 120.0  # at most; it ends once no job has ended for DRAIN_STALL_S
DRAIN_STALL_S = 45.0
AUDIT_S = 20.0
POISON_S = 90.0
TEARDOWN_S = 30.0
CANARY_TIMEOUT_S = 30.0
RECOVERY_BOUND_S = 60.0
BROKER_BOUND_S = 90.0
FAULT_SHARE = 0.4  # of the load time; the fuzzer gets the rest
RETRYABLE_NAMES = frozenset(code.name for code in RETRYABLE)
AGENT_OF = {node["node_id"]: agent for agent, nodes in AGENTS.items() for node in nodes}
PROCESS_NODES = frozenset(node["node_id"] for node in AGENTS["p"])


@dataclass(frozen=True)
class Settings:
    budget_s: float = option(
        600.0,
        "seconds for the whole run, setup and teardown included (default: %(default)s)",
        flag="--budget",
    )
    jobs: int = option(2000, "jobs the workload must get accepted (default: %(default)s)")
    fuzz_requests: int = option(10_000, "fuzzed gRPC requests (default: %(default)s)")
    node_loss_timeout_s: float = option(
        30.0,
        "seconds after which placement must have freed a lost node's GPUs; GPUs must be "
        "free this + 10 s after the run (default: %(default)s)",
        flag="--node-loss-timeout",
    )
    seed: int = option(1)
    phases: frozenset[str] = option(PHASES, "which of faults, fuzz, poison to run (default: all)")


@dataclass
class Run:
    stack: ChaosStack
    settings: Settings
    started: float  # monotonic
    report: Report = field(default_factory=Report)
    windows: dict[str, tuple[float, float]] = field(default_factory=dict)  # phase -> wall times

    @property
    def deadline(self) -> float:
        return self.started + self.settings.budget_s

    def left(self) -> float:
        return self.deadline - time.monotonic()


async def drive(run: Run) -> None:
    """Every phase; the stack is up. Fills ``run.report``."""
    stack, settings, report = run.stack, run.settings, run.report
    kafka = stack.kafka_settings()
    topics = load_topic_config(stack.topics_file)
    clients = Clients.connect(stack)
    observer = Observer(kafka, topics)
    workload = Workload(clients.jobs, stack.auth, seed=settings.seed, run_id=stack.run_id)
    faults = Faults(stack, clients, observer, workload, settings.node_loss_timeout_s)
    fuzzed = FuzzResult()
    await observer.start()
    try:
        reserve = DRAIN_S + settings.node_loss_timeout_s + 10 + AUDIT_S + TEARDOWN_S
        reserve += POISON_S if "poison" in settings.phases else 0
        load_s = max(60.0, run.left() - reserve)
        load_end = time.monotonic() + load_s
        rate = settings.jobs / load_s * 1.1
        log.info("load for %.0f s at %.1f jobs/s", load_s, rate)
        stop = asyncio.Event()
        flow = asyncio.create_task(workload.run(rate, stop))

        async with _phase(run, workload, "faults"):
            if "faults" in settings.phases:
                await faults.run(load_s * FAULT_SHARE)
        async with _phase(run, workload, "fuzz"):
            fuzz_s = max(30.0, load_end - time.monotonic())
            if "fuzz" in settings.phases:
                fuzzer = Fuzzer(
                    clients,
                    stack.signer,
                    seed=settings.seed,
                    run_id=stack.run_id,
                    known_jobs=lambda: [
                        (s.job_id, s.user) for s in workload.submissions[-200:] if s.accepted
                    ],
                )
                loop_deadline = asyncio.get_running_loop().time() + fuzz_s
                fuzzed = await fuzzer.run(settings.fuzz_requests, loop_deadline)
            await asyncio.sleep(max(0.0, load_end - time.monotonic()))  # the load goes on
        stop.set()
        await flow

        snapshot: invariants.Log | None = None
        busy: list[str] = []
        async with _phase(run, workload, "drain"):
            await workload.settle(30)
            report.facts["cancel fuzz-accepted jobs"] = await _cancel_all(
                clients, stack, fuzzed.accepted_jobs
            )
            await faults.finish(timeout=settings.node_loss_timeout_s + 10 + VIEW_LAG_S)
            accepted = {s.job_id for s in workload.submissions if s.accepted}
            accepted |= {job_id for job_id, _ in fuzzed.accepted_jobs}
            snapshot = await _drain(kafka, topics, accepted, DRAIN_S)
            busy = await _gpus_busy_after(clients, stack, settings.node_loss_timeout_s + 10)
        if snapshot is not None:
            _judge_load(run, workload, fuzzed, snapshot, accepted, busy, faults.drained_jobs)
        _judge_recoveries(report, faults.recoveries, settings.node_loss_timeout_s)
        _judge_kept(report, faults.kept_ends)
        if "poison" in settings.phases:
            async with _phase(run, workload, "poison"):
                await _poison(run, kafka, topics, clients, workload, faults)
        # Placement commits no input it could not decide, so the audit stops before any
        # poison record that stopped placement: it covers every decision of the run.
        async with _phase(run, workload, "audit"):
            await _audit(run)
        _judge_crashes(run, faults.killed_pids)
        report.add(
            "phases",
            ", ".join(f"{name} {end - begin:.0f} s" for name, (begin, end) in run.windows.items()),
            "",
            None,
        )
        write_specs(stack.workdir / "submissions.txt", workload.submissions)
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(observer.stop(), 15)
        await clients.close()


@contextlib.asynccontextmanager
async def _phase(run: Run, workload: Workload, name: str) -> AsyncIterator[None]:
    """A phase's wall-clock window; an error ends the phase, not the run, and fails it."""
    workload.phase = name
    begin = time.time()
    try:
        yield
    except Exception as exc:
        log.exception("phase %s stopped", name)
        run.report.add(
            f"phase {name}", f"stopped: {type(exc).__name__}: {exc}"[:200], "completes", False
        )
    finally:
        run.windows[name] = (begin, time.time())


# --- drain ----------------------------------------------------------------------------


async def _cancel_all(
    clients: Clients, stack: ChaosStack, jobs: list[tuple[str, str]]
) -> dict[str, int]:
    """Cancel the jobs the fuzzer got accepted (some would wait forever: unknown clusters).

    Returns how many cancels got which answer.
    """
    answers: Counter[str] = Counter()
    semaphore = asyncio.Semaphore(16)

    async def cancel(job_id: str, user: str) -> None:
        async with semaphore:
            try:
                await clients.jobs.CancelJob(
                    js.CancelJobRequest(job_id=job_id), metadata=stack.auth(user), timeout=10
                )
                answers["OK"] += 1
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.PERMISSION_DENIED:
                    # The fuzzer's own job, yet not its own: worth a look, so named.
                    answers[f"PERMISSION_DENIED: {job_id} of {user}"] += 1
                else:
                    answers[error.code().name] += 1

    await asyncio.gather(*(cancel(j, u) for j, u in set(jobs)))
    return {text: n for text, n in answers.most_common()}


async def _drain(
    kafka: KafkaSettings, topics: Topics, accepted: set[str], timeout: float
) -> invariants.Log:
    """Read the log until every accepted job has ended or waits with a reason.

    Gives up after ``timeout``, or once no job has ended for ``DRAIN_STALL_S``: a
    backlog that still moves is waited for, jobs stuck for good are not.
    """
    deadline = time.monotonic() + timeout
    fewest, since = len(accepted) + 1, time.monotonic()
    while True:
        snapshot = await read_log(kafka, topics)
        open_jobs = len(invariants.lost_jobs(accepted, snapshot))
        log.info("drain: %d jobs not ended", open_jobs)
        if open_jobs < fewest:
            fewest, since = open_jobs, time.monotonic()
        stalled = time.monotonic() - since > DRAIN_STALL_S
        if not open_jobs or stalled or time.monotonic() > deadline:
            return snapshot
        await asyncio.sleep(5)


async def _gpus_busy_after(clients: Clients, stack: ChaosStack, within: float) -> list[str]:
    """Tasks ListNodes still shows after ``within`` seconds (empty as soon as none)."""
    deadline = time.monotonic() + within
    busy: list[str] = ["ListNodes never answered"]
    while True:
        try:
            reply = await clients.cluster.ListNodes(
                cs.ListNodesRequest(), metadata=stack.auth("alice"), timeout=10
            )
            busy = [
                f"{node.inventory.node_id} GPUs {list(task.gpu_indices)}: {task.task_id}"
                for node in reply.nodes
                if node.inventory.cluster in ("", "default")
                for task in node.running
            ]
        except grpc.aio.AioRpcError as error:
            busy = [f"ListNodes: {error.code().name} {error.details()}"]
        if not busy or time.monotonic() > deadline:
            return busy
        await asyncio.sleep(1)


# --- judging --------------------------------------------------------------------------


def _judge_load(
    run: Run,
    workload: Workload,
    fuzzed: FuzzResult,
    snapshot: invariants.Log,
    accepted: set[str],
    busy: list[str],
    drained: set[str],
) -> None:
    """``drained``: the jobs the drain fault requeued (none without the faults phase, or
    when none of its jobs ran on the node it drained)."""
    report, settings = run.report, run.settings
    subs = workload.submissions
    ok = [s for s in subs if s.accepted]
    by_kind = Counter(s.kind for s in ok)
    report.add(
        "jobs accepted through the API (workload)",
        f"{len(ok)} of {len(subs)}",
        f">= {settings.jobs}",
        len(ok) >= settings.jobs,
        [f"{kind}: {n}" for kind, n in sorted(by_kind.items())]
        + [f"retried submissions: {sum(len(s.attempts) > 1 for s in subs)}"],
    )
    report.facts["workload"] = {
        "submitted": len(subs),
        "accepted": len(ok),
        "by_kind": dict(by_kind),
        "answers": dict(Counter(s.answer for s in subs)),
        "cancelled": sum(any(a.code == "OK" for a in s.cancel) for s in subs),
        "resubmitted": sum(bool(s.resubmits) for s in subs),
    }
    lost = invariants.lost_jobs(accepted, snapshot)
    where = Counter(AGENT_OF.get(f.where.split(",")[0], "no node") for f in lost)
    spread = ", ".join(f"{agent}: {n}" for agent, n in where.most_common())
    report.add("jobs lost", len(lost), "0", not lost, [f"by node agent: {spread}", *_cap(lost)])
    report.count("jobs admitted more than once", _cap(invariants.duplicate_admissions(snapshot)))
    report.count("request id answered with another job or answer", _cap(_changed_answers(subs)))
    report.count("jobs running twice at once", _cap(invariants.double_runs(snapshot)))
    conflicts, _ = invariants.replay_holdings(snapshot)
    report.count("GPUs held by two tasks (placement's decisions)", _cap(conflicts))
    report.count(
        "GPUs held by two tasks (node agents' reports)",
        _cap(invariants.reported_conflicts(snapshot)),
    )
    report.count("GPUs still held after the run (log)", _cap(invariants.held_at_end(snapshot)))
    report.count(
        "attempts that failed to start on process nodes",
        _cap(invariants.launch_failures(snapshot, {s.job_id for s in ok}, PROCESS_NODES)),
    )
    requeued = invariants.requeued_starts(snapshot, PROCESS_NODES)
    report.add(
        "requeued attempts started on process nodes",
        requeued,
        ">= 1" if drained else "n/a: the drain requeued no job",
        requeued >= 1 if drained else None,
    )
    report.add(
        f"tasks on GPUs in ListNodes {settings.node_loss_timeout_s + 10:g} s after the run",
        len(busy),
        "0",
        not busy,
        _cap(busy),
    )
    for agent, delays in _by_agent(invariants.start_delays(snapshot)).items():
        p50, _, p99 = summary(delays)
        report.add(
            f"node agent {agent}: TaskPlaced -> TaskStarted",
            f"p50 {p50:.1f} s, p99 {p99:.1f} s, max {max(delays):.0f} s ({len(delays)} tasks)",
            "",
            None,
        )
    if "fuzz" in settings.phases:
        _judge_fuzz(run, fuzzed)


def _by_agent(per_node: dict[str, list[float]]) -> dict[str, list[float]]:
    merged: dict[str, list[float]] = {}
    for node, values in sorted(per_node.items()):
        merged.setdefault(AGENT_OF.get(node, node), []).extend(values)
    return merged


def _changed_answers(subs: list[Submission]) -> list[str]:
    """A request id answered once with one job (or refusal) and later otherwise."""
    found = []
    for sub in subs:
        if not sub.resubmits:
            continue
        first = sub.job_id or sub.answer
        for again in sub.resubmits:
            if again.code in RETRYABLE_NAMES:
                continue  # no answer about the job (judged by the fuzzing rows)
            later = again.job_id if again.code == "OK" else again.code
            if later != first:
                found.append(f"{sub.request_id} ({sub.kind}): first {first}, then {later}")
    return found


def _judge_fuzz(run: Run, fuzzed: FuzzResult) -> None:
    report = run.report
    report.add(
        "fuzzed gRPC requests",
        fuzzed.sent,
        f">= {run.settings.fuzz_requests}",
        fuzzed.sent >= run.settings.fuzz_requests,
    )
    report.add(
        "fuzz answers UNKNOWN/INTERNAL",
        fuzzed.improper_count,
        "0",
        fuzzed.improper_count == 0,
        _summarise(fuzzed.improper),
    )
    report.add(
        "fuzzed requests unanswered in 15 s",
        fuzzed.unanswered_count,
        "0",
        fuzzed.unanswered_count == 0,
        _summarise(fuzzed.unanswered),
    )
    report.add(
        "invalid fuzzed requests accepted",
        len(fuzzed.accepted_invalid),
        "0",
        not fuzzed.accepted_invalid,
        _summarise(fuzzed.accepted_invalid),
    )
    report.facts["fuzz_codes"] = {f"{m} {c}": n for (m, c), n in sorted(fuzzed.codes.items())}


def _summarise(examples: list[str]) -> list[str]:
    """Examples grouped by their text without numbers and ids, most frequent first."""
    counts = Counter(re.sub(r"j-[0-9a-f]{16}|\d+", "#", e)[:240] for e in examples)
    return [f"{n}x {text}" for text, n in counts.most_common(50)]


def _judge_recoveries(report: Report, recoveries: list[Recovery], node_loss_s: float) -> None:
    for r in recoveries:
        bound = BROKER_BOUND_S if "kafka" in r.fault else RECOVERY_BOUND_S
        if r.signal == FREED_IN_LOG:  # the invariant: free again within the timeout + 10 s
            bound = node_loss_s + 10
        elif r.signal == FREED_IN_VIEW:  # and the projector's view follows the log
            bound = node_loss_s + 10 + VIEW_LAG_S
        name, expected = f"recovery: {r.fault} -> {r.signal}", f"<= {bound:g} s"
        if r.detail.startswith("n/a"):
            report.add(name, r.detail, expected, None)
            continue
        value = "never" if r.seconds is None else f"{r.seconds:.1f} s"
        if r.submit_s is not None and "submit" not in r.signal:
            value += f" (next submit {r.submit_s:.1f} s)"
        ok = r.seconds is not None and r.seconds <= bound
        killed = time.strftime("%H:%M:%S", time.localtime(r.killed_at))
        report.add(
            name, value, expected, ok, [f"killed at {killed}", *([r.detail] * bool(r.detail))]
        )


def _judge_kept(report: Report, ends: dict[str, str]) -> None:
    """The process agent's restart: the tasks it found running end on their own
    (``task_finished``) or as placement asked (free work preempted), none stopped by
    the restart, lost or unended."""
    name = "node agent restarted with tasks running: tasks stopped"
    if not ends:
        report.add(name, "n/a: no task ran there at the kill", "0", None)
        return
    stopped = sorted(
        f"{task}: {end or 'not ended'}"
        for task, end in ends.items()
        if end not in ("task_finished", STOPPED_BY_PLACEMENT)
    )
    how = Counter(end or "not ended" for end in ends.values())
    running = f"{len(ends)} tasks running: " + ", ".join(f"{n} {e}" for e, n in sorted(how.items()))
    report.add(name, len(stopped), "0", not stopped, [running, *stopped])


def _judge_crashes(run: Run, killed: set[int]) -> None:
    for phase, (begin, end) in run.windows.items():
        found = crashes(run.stack.logs, killed, begin, end)
        run.report.count(f"service crashes during {phase} (exits nobody caused)", found)


def _cap(found: Sequence[object], at: int = 50) -> list[object]:
    """At most ``at`` examples (with the total), enough to look the rest up."""
    return list(found) if len(found) <= at else [*found[:at], f"... {len(found)} in all"]


# --- audit ----------------------------------------------------------------------------


async def _audit(run: Run) -> None:
    """``qm audit verify`` as an operator runs it, with placement's policy file and group."""
    name = "qm audit verify"
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "cli", "audit", "verify"],
            cwd=ROOT,
            env={**run.stack.env, **run.stack.principal_env("auditor"), "COLUMNS": "200"},
            capture_output=True,
            text=True,
            timeout=max(30.0, min(180.0, run.left())),
        )
    except subprocess.TimeoutExpired:
        run.report.add(name, "timed out", "100 %", False)
        return
    output = (done.stdout + done.stderr).strip()
    (run.stack.logs / "audit.txt").write_text(output)
    clean = re.search(r"(\d+) decisions, (\d+) reproduced", output)
    diverged = re.search(r"(\d+) decisions checked, (\d+) reproduced", output)
    if done.returncode == 0 and clean:
        checked, reproduced = int(clean[1]), int(clean[2])
        run.report.add(name, f"{reproduced} of {checked} (100 %)", "100 %", checked > 0)
        return
    lines = output.splitlines()
    if diverged:
        checked, reproduced = int(diverged[1]), int(diverged[2])
        value = f"{reproduced} of {checked}, then diverged"
    else:
        value = f"failed (exit {done.returncode})"
    run.report.add(name, value, "100 %", False, lines[:3] + lines[-12:])


# --- poison ---------------------------------------------------------------------------


async def _poison(
    run: Run,
    kafka: KafkaSettings,
    topics: Topics,
    clients: Clients,
    workload: Workload,
    faults: Faults,
) -> None:
    stack, report = run.stack, run.report
    tree = (
        await clients.budget.GetTree(bs.GetTreeRequest(), metadata=stack.auth("carol"), timeout=10)
    ).tree
    nodes = [n["node_id"] for n in AGENTS["a"]]
    written: Counter[str] = Counter()
    evidence: list[str] = []
    # An insider's keys: the services' and the nodes' (the gate lets their records in).
    insider = Signers(stack.trust_file.parent, Path(stack.env["QM_NODE_KEY_DIR"]))
    for index, (label, poisons) in enumerate(groups(nodes, tree, insider.seal), start=1):
        produced = await produce(kafka, topics, poisons)
        written.update(p.outcome for p in produced)
        evidence += [
            f"{p.poison.topic}: {p.poison.label}: {p.outcome} ({p.seconds:.1f} s)" for p in produced
        ]
        if index == 1:  # the projector rebuilds its tables from the poisoned changelogs
            await faults.kill("projector", "ListJobs answers", faults.lists_jobs, with_load=False)
            recovery = faults.recoveries[-1]
            recovery.fault += " after its changelogs were poisoned"
            _judge_recoveries(report, [recovery], run.settings.node_loss_timeout_s)
        await asyncio.sleep(5)
        outcome = await _canary(faults.observer, workload)
        report.add(
            f"canary job after poison group {index} ({label})",
            outcome,
            "FINISHED",
            outcome == "FINISHED",
        )
    report.add("poison records produced", dict(written), "written or refused", None, evidence)


async def _canary(observer: Observer, workload: Workload) -> str:
    """Submit one short job; FINISHED once the log has its end, else how far it got."""
    sub = workload.new_submission("canary")
    sent = time.time()
    await workload.submit(sub, give_up_s=CANARY_TIMEOUT_S)
    if not sub.accepted:
        return f"not accepted: {sub.answer} {sub.attempts[-1].detail[:80] if sub.attempts else ''}"
    ended = await observer.first_after(
        sent, lambda s: s.job_id == sub.job_id and s.kind == "task_finished", CANARY_TIMEOUT_S
    )
    if ended is not None:
        return "FINISHED"
    seen = [s.kind for s in observer.seen if s.job_id == sub.job_id]
    return f"not finished after {CANARY_TIMEOUT_S:g} s; the log has: {', '.join(seen) or 'nothing'}"

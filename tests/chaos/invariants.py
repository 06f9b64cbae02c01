"""What must hold after a chaos run, judged from the log itself (pure functions).

``Log`` is the events and decisions topics as read back after the run. The checks:

- lost jobs: every job the API accepted has its admission in the log and has
  ended, or waits with a reason (a job still placed or running has lost its way);
- duplicates: one admission per job, that is per (user, client request id), and no
  job running twice at once (two placements' tasks running together, or one task
  started twice without ending);
- GPUs held twice, by placement's own bookkeeping: each decision is applied right
  after the input it answers (its provenance), a task holds its GPUs from its
  TaskPlaced until its TaskFinished or TaskFailed; a batch task placed on a GPU
  still held, or a workflow task placed on a GPU a batch task holds, is a conflict
  (workflow tasks queue on their GPU, so two of them may share one);
- GPUs held twice, by the node agents' reports: two tasks started on one GPU and
  neither ended in between;
- GPUs still held at the end, by the same bookkeeping;
- attempts that failed to start on the nodes that run processes: a task the agent
  reported failed without having started it (its ``LaunchError``: exit 126 or 127 and
  why), such as a requeued job's next attempt that cannot open its log.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from qm.v1 import events_pb2, types_pb2

from libs.core.ids import attempt_of
from libs.events import event_type
from libs.readmodels import apply_job_event, has_ended

ENDS = ("task_finished", "task_failed")
_UNDER_WAY = (types_pb2.JOB_STATE_PLACED, types_pb2.JOB_STATE_RUNNING)
Gpu = tuple[str, int]  # (node id, GPU index)


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    timestamp_ms: int
    envelope: events_pb2.Envelope


@dataclass
class Log:
    events: list[Record] = field(default_factory=list)  # by partition, then offset
    decisions: list[Record] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    """One violation, with what a person needs to look it up."""

    subject: str
    why: str
    where: str = ""  # the nodes it concerns, comma-separated, if any

    def __str__(self) -> str:
        return f"{self.subject}: {self.why}"


def fold_jobs(log: Log) -> dict[str, types_pb2.Job]:
    """Every job as the projector's fold sees it, events and decisions merged by time."""
    jobs: dict[str, types_pb2.Job] = {}
    merged = sorted(
        [*log.events, *log.decisions], key=lambda r: (r.timestamp_ms, r.partition, r.offset)
    )
    for record in merged:
        kind = event_type(record.envelope)
        job_id = getattr(getattr(record.envelope, kind), "job_id", "")
        if job_id:
            job = apply_job_event(jobs.get(job_id), record.envelope)
            if job is not None:
                jobs[job_id] = job
    return jobs


def lost_jobs(accepted: Iterable[str], log: Log) -> list[Finding]:
    """Accepted jobs that have not ended and do not wait with a reason."""
    jobs = fold_jobs(log)
    kinds: dict[str, list[str]] = defaultdict(list)  # job id -> its events, in order
    for r in log.events:
        kind = event_type(r.envelope)
        job_id = getattr(getattr(r.envelope, kind), "job_id", "")
        if job_id:
            kinds[job_id].append(kind)
    found = []
    for job_id in sorted(set(accepted)):
        job = jobs.get(job_id)
        if job is None or "job_admitted" not in kinds[job_id]:
            seen = ", ".join(kinds[job_id]) or "nothing"
            found.append(Finding(job_id, f"accepted, but never admitted; the log has: {seen}"))
        elif has_ended(job) or (job.state == types_pb2.JOB_STATE_PENDING and job.reason):
            continue
        else:
            state = types_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
            # A workflow's tasks each have a node; the job has none of its own.
            open_tasks = {t.node_id for t in job.tasks if t.node_id and t.state in _UNDER_WAY}
            nodes = job.node_id or ",".join(sorted(open_tasks))
            where = f" on {nodes}" if nodes else ""
            found.append(Finding(job_id, f"still {state}{where} {job.reason!r}", nodes))
    return found


def duplicate_admissions(log: Log) -> list[Finding]:
    """Jobs admitted more than once (a job id is one user's one client request id)."""
    counts = Counter(
        r.envelope.job_admitted.job_id
        for r in log.events
        if event_type(r.envelope) == "job_admitted"
    )
    return [Finding(job_id, f"admitted {n} times") for job_id, n in sorted(counts.items()) if n > 1]


def _placements(log: Log) -> dict[str, events_pb2.TaskPlaced]:
    """Task id -> its (latest) placement."""
    return {
        r.envelope.task_placed.task_id: r.envelope.task_placed
        for r in log.decisions
        if event_type(r.envelope) == "task_placed"
    }


def _answers(log: Log, kind: str) -> dict[tuple[int, int], list[Any]]:
    """Placement's decisions of one kind by the input they answer (their provenance)."""
    by_input: dict[tuple[int, int], list[Any]] = defaultdict(list)
    for record in log.decisions:
        if event_type(record.envelope) == kind:
            decision = getattr(record.envelope, kind)
            cause = (decision.provenance.input_partition, decision.provenance.input_offset)
            by_input[cause].append(decision)
    return by_input


def _events(log: Log) -> Iterator[tuple[Record, str, list[events_pb2.TaskLost]]]:
    """The events in log order, each with its type and the tasks placement declared lost
    in answer to it: a task its node (or its agent's restart) took with it ends there,
    though no agent reports it."""
    losses = _answers(log, "task_lost")
    for record in log.events:
        yield record, event_type(record.envelope), losses.get((record.partition, record.offset), [])


def double_runs(log: Log) -> list[Finding]:
    """A task started again before it ended, or two placements of a job running together."""
    running: dict[str, set[str]] = defaultdict(set)  # job id -> task ids running
    found = []
    for record, kind, lost in _events(log):
        env = record.envelope
        for gone in lost:
            running[gone.job_id].discard(gone.task_id)
        if kind == "task_started":
            job_id, task_id = env.task_started.job_id, env.task_started.task_id
            tasks = running[job_id]
            if task_id in tasks:
                found.append(Finding(task_id, "started again while running"))
            others = {attempt_of(t) for t in tasks} - {attempt_of(task_id)}
            if others:
                found.append(
                    Finding(task_id, f"started while placement(s) {sorted(others)} still run")
                )
            tasks.add(task_id)
        elif kind in ENDS:
            payload = getattr(env, kind)
            running[payload.job_id].discard(payload.task_id)
    return found


@dataclass
class _Holder:
    task_id: str
    serving: bool


def _conflict(gpu: Gpu, held: list[_Holder], new: _Holder) -> Finding | None:
    if not held:
        return None
    if new.serving and all(h.serving for h in held):
        return None  # workflow tasks queue on their GPU
    holders = ", ".join(h.task_id for h in held)
    return Finding(f"{gpu[0]} GPU {gpu[1]}", f"{new.task_id} placed while held by {holders}")


def replay_holdings(log: Log) -> tuple[list[Finding], dict[Gpu, list[_Holder]]]:
    """Placement's GPU bookkeeping replayed from the log: conflicts, and what is held at the end.

    Decisions are applied after the input they answer; decisions naming an input
    the events topic does not hold (forged ones) are left out.
    """
    placements = _answers(log, "task_placed")
    held: dict[Gpu, list[_Holder]] = defaultdict(list)
    gpus_of: dict[str, list[Gpu]] = {}
    found = []

    def free(task_id: str) -> None:
        for gpu in gpus_of.pop(task_id, []):
            held[gpu] = [h for h in held[gpu] if h.task_id != task_id]

    for record, kind, lost in _events(log):
        ended = [getattr(record.envelope, kind).task_id] if kind in ENDS else []
        # A loss is decided before the pass that may place on the GPUs it frees.
        ended += [gone.task_id for gone in lost]
        if kind == "task_refused":  # off that GPU's queue, if it is still queued there
            refused = record.envelope.task_refused
            if (refused.node_id, refused.gpu_index) in gpus_of.get(refused.task_id, []):
                ended.append(refused.task_id)
        for task_id in ended:
            free(task_id)
        for placed in placements.get((record.partition, record.offset), []):
            new = _Holder(placed.task_id, placed.HasField("serving"))
            if new.serving:  # a workflow task sent again (refused, or moved) leaves its GPU
                free(placed.task_id)
            gpus = [(placed.node_id, index) for index in placed.gpu_indices]
            for gpu in gpus:
                conflict = _conflict(gpu, held[gpu], new)
                if conflict is not None:
                    found.append(conflict)
                held[gpu].append(new)
            gpus_of[placed.task_id] = gpus
    return found, {gpu: holders for gpu, holders in held.items() if holders}


def reported_conflicts(log: Log) -> list[Finding]:
    """Two tasks running on one GPU at once, as the node agents report starts and ends."""
    placements = _placements(log)
    running: dict[Gpu, tuple[str, str]] = {}  # -> (task id, when it started)
    gpus_of: dict[str, list[Gpu]] = {}
    found = []
    for record, kind, lost in _events(log):
        env = record.envelope
        ended = [getattr(env, kind).task_id] if kind in ENDS else []
        # A lost task's agent killed it before registering again (or is gone).
        ended += [gone.task_id for gone in lost]
        for task_id in ended:
            for gpu in gpus_of.pop(task_id, []):
                if running.get(gpu, ("",))[0] == task_id:
                    del running[gpu]
        if kind == "task_started":
            task_id = env.task_started.task_id
            placed = placements.get(task_id)
            if placed is None:
                continue  # nobody placed it: not placement's GPU to judge
            gpus = [(placed.node_id, index) for index in placed.gpu_indices]
            at = _clock(env)
            for gpu in gpus:
                other = running.get(gpu)
                if other is not None and other[0] != task_id:
                    why = f"{task_id} started at {at} while {other[0]} (started {other[1]}) runs"
                    found.append(Finding(f"{gpu[0]} GPU {gpu[1]}", why))
                running[gpu] = (task_id, at)
            gpus_of[task_id] = gpus
    return found


def _clock(env: events_pb2.Envelope) -> str:
    """The event's local time of day, to set it beside the kills in the run's log."""
    return time.strftime("%H:%M:%S", time.localtime(env.occurred_at.seconds))


def held_at_end(log: Log) -> list[Finding]:
    """GPUs that placement's bookkeeping still has held once everything should have ended."""
    _, held = replay_holdings(log)
    return [
        Finding(f"{node} GPU {index}", "held by " + ", ".join(h.task_id for h in holders))
        for (node, index), holders in sorted(held.items())
    ]


def start_delays(log: Log) -> dict[str, list[float]]:
    """Per node, seconds from each TaskPlaced to its TaskStarted (record CreateTimes)."""
    placed = {
        r.envelope.task_placed.task_id: r.timestamp_ms
        for r in log.decisions
        if event_type(r.envelope) == "task_placed"
    }
    delays: dict[str, list[float]] = defaultdict(list)
    for r in log.events:
        if event_type(r.envelope) == "task_started":
            started = r.envelope.task_started
            if started.task_id in placed:
                delays[started.node_id].append((r.timestamp_ms - placed[started.task_id]) / 1000)
    return delays


def launch_failures(log: Log, jobs: Iterable[str], nodes: Iterable[str]) -> list[Finding]:
    """Tasks of ``jobs`` on ``nodes`` that failed without having started."""
    wanted, on = set(jobs), set(nodes)
    started = {
        r.envelope.task_started.task_id
        for r in log.events
        if event_type(r.envelope) == "task_started"
    }
    found = []
    for record in log.events:
        if event_type(record.envelope) != "task_failed":
            continue
        failed = record.envelope.task_failed
        if failed.job_id in wanted and failed.node_id in on and failed.task_id not in started:
            why = f"never started on {failed.node_id}: exit {failed.exit_code}: {failed.reason}"
            found.append(Finding(failed.task_id, why, failed.node_id))
    return found


def requeued_starts(log: Log, nodes: Iterable[str]) -> int:
    """Attempts after a job's first (a requeue's) that started on ``nodes``."""
    on = set(nodes)
    return sum(
        1
        for r in log.events
        if event_type(r.envelope) == "task_started"
        and r.envelope.task_started.node_id in on
        and attempt_of(r.envelope.task_started.task_id) > 0
    )

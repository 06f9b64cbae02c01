"""How jobs, nodes, budgets and errors look in a terminal."""

from __future__ import annotations

import itertools
import shlex
from collections import Counter
from datetime import UTC, datetime

import typer
from google.protobuf.timestamp_pb2 import Timestamp
from qm.v1 import budget_service_pb2, cluster_service_pb2, job_service_pb2, types_pb2
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table

from cli.params import CONDITIONS
from libs.config.duration import format_duration
from libs.core.ids import array_of
from libs.events import wire_time
from libs.events.convert import preemption_from_proto
from libs.readmodels import has_ended

_STYLE = {
    "FINISHED": "green",
    "RUNNING": "cyan",
    "PLACED": "cyan",
    "PENDING": "yellow",
    "SUBMITTED": "yellow",
    "FAILED": "red",
    "REJECTED": "red",
    "CANCELLED": "magenta",
    "PREEMPTED": "magenta",
    "LOST": "red",
    "TIMEOUT": "red",
}


def _error_line(message: object) -> str:
    """``error: ...`` for the error console; the message is shown as written (key paths
    such as ``children[0]`` are not markup)."""
    return f"[red]error:[/] {escape(str(message))}"


# Errors are one line whatever the terminal's width: people copy them.
errors = Console(stderr=True, soft_wrap=True)


def fail(message: object, code: int = 2) -> typer.Exit:
    """Print ``message`` as the error line; the exit to raise (2: a bad flag or setting)."""
    errors.print(_error_line(message), highlight=False)
    return typer.Exit(code)


def state_name(state: types_pb2.JobState.ValueType) -> str:
    return types_pb2.JobState.Name(state).removeprefix("JOB_STATE_")


def styled_state(state: types_pb2.JobState.ValueType) -> str:
    name = state_name(state)
    return f"[{_STYLE.get(name, 'white')}]{name}[/]"


def job_state(job: types_pb2.Job) -> str:
    """Its state, styled; a held job says so."""
    return styled_state(job.state) + (" [yellow](held)[/]" if job.held else "")


def change(job: types_pb2.Job) -> str:
    """One line of ``qm watch``: the job's state and what it is doing or how it ended."""
    detail = job.reason or (f"{job.node_id} {list(job.gpu_indices)}" if job.node_id else "")
    if job.spec.HasField("workflow") and not job.reason:
        detail = workflow_progress(job)
    if job.state in (types_pb2.JOB_STATE_FINISHED, types_pb2.JOB_STATE_FAILED):
        detail = f"exit code {job.exit_code}"
    if job.state == types_pb2.JOB_STATE_RUNNING and job.protection:
        detail = f"{detail}; {protection(job)}"
    return f"{job.job_id} {styled_state(job.state)} {detail}"


def protection_at_submission(spec: types_pb2.JobSpec) -> str:
    """What will protect a job from preemption once it starts, as its spec asks."""
    if spec.HasField("workflow"):
        return f"a workflow: its tasks run on GPUs serving holds, charged to {_share(spec)}"
    min_runtime = wire_time.seconds(spec.min_runtime)
    if not min_runtime:
        return (
            "free work: it runs on idle GPUs and yields them whenever charged work needs "
            "them (--min-runtime to be protected)"
        )
    return (
        f"charged: protected for {format_duration(round(min_runtime))} from its start if "
        f"placed within {_share(spec)}; beyond it, on borrowed GPUs, a team below its share "
        "may take them back at once"
    )


def _share(spec: types_pb2.JobSpec) -> str:
    return f"{spec.allocation}'s share" if spec.allocation else "its allocation's share"


def protection(job: types_pb2.Job) -> str:
    """How the job's latest placement is protected from preemption, and until when."""
    share = f"{job.spec.allocation}'s share"
    match job.protection:
        case types_pb2.PROTECTION_FREE:
            return "free work: it yields its GPUs whenever charged work needs them"
        case types_pb2.PROTECTION_BORROWED:
            return (
                f"unprotected: on GPUs borrowed beyond {share}; a team below its share "
                "may take them back at once"
            )
        case types_pb2.PROTECTION_CONTRACT if job.HasField("protected_until"):
            return f"protected until {when(job.protected_until)} (within {share})"
        case types_pb2.PROTECTION_CONTRACT:
            protected_s = round(wire_time.seconds(job.protected_for))
            return f"protected for {format_duration(protected_s)} from its start (within {share})"
    return f"once it starts: {protection_at_submission(job.spec)}"


def preempted(job: types_pb2.Job) -> str:
    """Who the job was last preempted for and by which rule; empty if it never was."""
    last = preemption_from_proto(job.preemption) if job.HasField("preemption") else None
    return str(last) if last is not None else ""


def explanation(answer: job_service_pb2.ExplainJobResponse) -> RenderableType:
    """A job's state, then each part of the reason on a line of its own."""
    lines = [f"{answer.job_id} {styled_state(answer.state)}"]
    lines += [f"  • {part}" for part in answer.reason.split("; ")]
    if answer.HasField("estimated_start"):
        lines.append(f"  • estimated start: {when(answer.estimated_start)}")
    return "\n".join(lines)


def when(ts: Timestamp) -> str:
    if not ts.seconds:
        return "-"
    return datetime.fromtimestamp(ts.seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _table(key: str, *headers: str) -> Table:
    table = Table()
    table.add_column(key, no_wrap=True)  # ids stay whole: people copy them
    for header in headers:
        table.add_column(header)
    return table


def jobs_table(jobs: list[types_pb2.Job]) -> Table:
    table = _table("JOB", "STATE", "ALLOCATION", "USER", "GPUS", "NODE", "SUBMITTED", "DETAIL")
    for job in jobs:
        detail = job.reason
        if job.state in (types_pb2.JOB_STATE_FINISHED, types_pb2.JOB_STATE_FAILED):
            detail = f"exit {job.exit_code}" + (f": {job.reason}" if job.reason else "")
        if job.attempts > 1:
            detail = f"attempt {job.attempts}; {detail}"
        node = job.node_id or "-"
        if len(job.placements) > 1:  # a gang
            node = f"{len(job.placements)} nodes"
        if job.spec.HasField("workflow"):
            detail = "; ".join(part for part in (workflow_progress(job), detail) if part)
            nodes = sorted({t.node_id for t in job.tasks if t.node_id})
            node = nodes[0] if len(nodes) == 1 else f"{len(nodes)} nodes" if nodes else "-"
        table.add_row(
            job.job_id,
            job_state(job),
            job.spec.allocation,
            job.spec.user,
            str(job.spec.gpus),
            node,
            when(job.submitted_at),
            detail,
        )
    return table


def array(array_id: str, elements: list[types_pb2.Job], *, whole: bool = True) -> RenderableType:
    """A job array: how many of its elements are in each state, then each element.
    ``whole``: ``elements`` are all the array has (not some states' alone), so that fewer
    than it was submitted with says its submission was cut short."""
    submitted = max((job.spec.array.count for job in elements), default=0)
    states = Counter(state_name(job.state) for job in elements)
    counts = ", ".join(f"{n} {name}" for name, n in sorted(states.items()))
    short = whole and len(elements) < submitted
    seen = f"{len(elements)} of {submitted}" if short else str(len(elements))
    heading = f"array {array_id}: {seen} {elements_word(submitted if short else len(elements))}"
    heading += f": {counts}" if counts else ""
    return Group(heading, jobs_table(elements))


def elements_word(count: int) -> str:
    return "element" if count == 1 else "elements"


def _where(job: types_pb2.Job) -> str:
    """Where a batch job runs: its node's GPUs, or each node of a gang."""
    if len(job.placements) > 1:
        return "; ".join(f"{p.node_id} GPUs {list(p.gpu_indices)}" for p in job.placements)
    return f"{job.node_id} GPUs {list(job.gpu_indices)}" if job.node_id else "-"


def job_detail(job: types_pb2.Job) -> RenderableType:
    """One job; a workflow job also gets a table of its tasks."""
    table = Table.grid(padding=(0, 2))
    workflow = job.spec.HasField("workflow")
    min_runtime = wire_time.seconds(job.spec.min_runtime)
    estimate = wire_time.seconds(job.spec.runtime_estimate)
    time_limit = round(wire_time.seconds(job.spec.time_limit))
    rows = [
        ("job", job.job_id),
        ("state", job_state(job)),
        ("allocation", job.spec.allocation),
        ("user", job.spec.user),
        ("gpus", _gpus(job.spec)),
        ("contract", f"min runtime {min_runtime:g} s, resumable {job.spec.resumable}"),
        ("estimate", f"{estimate:g} s" if estimate else "-"),
        ("time limit", format_duration(time_limit) if time_limit else "-"),
        ("command", escape(shlex.join(job.spec.command)) or "-"),  # as a shell reads it
        (
            ("workflow", f"{job.spec.workflow.name}: {workflow_progress(job)}")
            if workflow
            else ("nodes" if len(job.placements) > 1 else "node", _where(job))
        ),
        *([("array", _element(job))] if job.spec.HasField("array") else []),
        *([("after", _after(job.spec))] if job.spec.after else []),
        *(
            [("warning", _warning(job.spec.stop_warning))]
            if job.spec.HasField("stop_warning")
            else []
        ),
        *([("checkpointed", when(job.checkpointed_at))] if job.HasField("checkpointed_at") else []),
        ("submitted", when(job.submitted_at)),
        ("started", when(job.started_at)),
        ("finished", when(job.finished_at)),
    ]
    if job.state in (types_pb2.JOB_STATE_FINISHED, types_pb2.JOB_STATE_FAILED):
        rows.append(("exit code", str(job.exit_code)))
    if not workflow and not has_ended(job):
        rows.append(("protection", protection(job)))
    if job.HasField("preemption"):
        rows.append(("preempted", preempted(job)))
    if job.reason:
        rows.append(("reason", job.reason))
    for key, value in rows:
        table.add_row(f"[bold]{key}[/]", value)
    if not workflow:
        return table
    return Group(table, workflow_tasks_table(job))


def _gpus(spec: types_pb2.JobSpec) -> str:
    """``16×H100 (2 nodes × 8)``: a job's GPUs, and how it spans nodes when it names them."""
    shown = f"{spec.gpus}×{spec.gpu_type or 'any'}"
    if spec.HasField("workflow"):
        return f"{shown} per task"
    return f"{shown} ({spec.nodes} nodes × {spec.gpus // spec.nodes})" if spec.nodes > 1 else shown


def _warning(warning: types_pb2.StopWarning) -> str:
    """``SIGUSR1 2m before SIGTERM``: what ``--signal`` asked for."""
    before = format_duration(round(wire_time.seconds(warning.before)))
    return f"SIG{warning.signal} {before} before SIGTERM"


# ``--after``'s words for each condition (an unspecified one is ok).
_CONDITION_WORDS = {condition: word for word, condition in CONDITIONS.items()}


def _after(spec: types_pb2.JobSpec) -> str:
    """The jobs it waits for, as ``--after`` takes them: ``j-1:ok, j-2:any``; the
    elements of an array it waits for as one: ``a-1f (10 elements):ok``."""
    words = []
    for (array_id, condition), group in itertools.groupby(
        spec.after, key=lambda d: (array_of(d.job_id), d.condition)
    ):
        word = _CONDITION_WORDS.get(condition, "ok")
        named = [d.job_id for d in group]
        if array_id is not None and len(named) > 1:
            words.append(f"{array_id} ({len(named)} {elements_word(len(named))}):{word}")
        else:
            words += [f"{job_id}:{word}" for job_id in named]
    return ", ".join(words)


def _element(job: types_pb2.Job) -> str:
    """Which element of which array the job is: ``a-1f, element 3 of 10``."""
    element = job.spec.array
    return f"{array_of(job.job_id)}, element {element.index} of {element.count}"


def workflow_progress(job: types_pb2.Job) -> str:
    """``2/5 tasks finished`` for a workflow job; empty for any other."""
    if not job.spec.HasField("workflow"):
        return ""
    done = sum(t.state == types_pb2.JOB_STATE_FINISHED for t in job.tasks)
    return f"{done}/{len(job.spec.workflow.tasks)} tasks finished"


def workflow_tasks_table(job: types_pb2.Job) -> Table:
    """A workflow job's tasks: the read model's in workflow order, then any the log has
    not mentioned yet, as the spec lists them."""
    table = _table("TASK", "MODEL", "STATE", "GPU", "PLANNED", "DETAIL")
    specs = {t.task_id: t for t in job.spec.workflow.tasks}
    seen = {t.name: t for t in job.tasks}
    names = [t.name for t in job.tasks] + [n for n in specs if n not in seen]
    for name in names:
        spec = specs.get(name)
        model = f"{spec.model} ({spec.model_mb:g} MB)" if spec and spec.model else "-"
        task = seen.get(name)
        if task is None:
            table.add_row(name, model, "-", "-", "-", "")
            continue
        gpu = f"{task.node_id} GPU {task.gpu_index}" if task.node_id else "-"
        planned = (
            f"{task.planned_node_id} GPU {task.planned_gpu_index}" if task.planned_node_id else "-"
        )
        detail = ""
        if task.state in (types_pb2.JOB_STATE_FINISHED, types_pb2.JOB_STATE_FAILED):
            detail = f"exit {task.exit_code}" + (f": {task.reason}" if task.reason else "")
        table.add_row(name, model, styled_state(task.state), gpu, planned, detail)
    return table


def nodes_table(nodes: list[types_pb2.Node]) -> Table:
    table = _table("NODE", "CLUSTER", "STATE", "GPUS", "FREE", "SERVING", "EXECUTOR", "TASKS")
    for node in nodes:
        inv = node.inventory
        held = {g for task in node.running for g in task.gpu_indices}
        held |= {gpu.gpu_index for gpu in node.serving}
        free = [gpu.index for gpu in inv.gpus if gpu.index not in held]
        serving = Counter(gpu.allocation for gpu in node.serving)
        types = sorted({gpu.type for gpu in inv.gpus})
        table.add_row(
            inv.node_id,
            inv.cluster,
            "[red]lost[/]" if node.lost else "[yellow]cordoned[/]" if node.cordoned else "up",
            f"{len(inv.gpus)}×{'/'.join(types) or '?'}",
            "0" if node.lost else str(len(free)),
            ", ".join(f"{n} {a}" for a, n in sorted(serving.items())) or "-",
            types_pb2.Executor.Name(inv.executor).removeprefix("EXECUTOR_").lower(),
            ", ".join(task.job_id for task in node.running) or "-",
        )
    return table


def pending_nodes_table(nodes: list[cluster_service_pb2.PendingNode], now: float) -> Table:
    """``qm node pending``: nodes whose offered key no operator has approved yet."""
    table = _table("NODE", "CLUSTER", "FINGERPRINT", "OFFERED", "NOTE")
    for node in nodes:
        note = "[yellow]replaces an approved key[/]" if node.replaces_key else ""
        table.add_row(node.node_id, node.cluster, node.fingerprint, ago(node.offered_at, now), note)
    return table


def ago(ts: Timestamp, now: float) -> str:
    """How long before ``now`` ``ts`` was, to the second under an hour, to the minute
    under a day, else to the hour: ``5m3s ago``, ``2d4h ago``."""
    if not ts.seconds:
        return "-"
    seconds = max(0, int(now) - ts.seconds)
    step = 3600 if seconds >= 86400 else 60 if seconds >= 3600 else 1
    return f"{format_duration(seconds - seconds % step)} ago"


def tree_table(
    tree: types_pb2.BudgetTree, balances: budget_service_pb2.GetBalancesResponse
) -> Table:
    by_leaf = {b.allocation: b for b in balances.balances}
    table = Table("NODE", "WEIGHT", "ENTITLEMENT", "GPU-HOURS", "MEMBERS", "MANAGERS")
    children: dict[str, list[types_pb2.BudgetNode]] = {}
    for node in tree.nodes:
        children.setdefault(node.parent, []).append(node)

    def walk(parent: str, depth: int) -> None:
        for node in sorted(children.get(parent, []), key=lambda n: n.name):
            balance = by_leaf.get(node.name)
            table.add_row(
                "  " * depth + node.name,
                f"{node.weight:g}",
                f"{balance.entitlement:.1%}" if balance else "",
                f"{balance.gpu_seconds / 3600:.2f}" if balance else "",
                ", ".join(node.members),
                ", ".join(node.managers),
            )
            walk(node.name, depth + 1)

    walk("", 0)
    return table


def _headline_line(h: budget_service_pb2.ServiceHeadline) -> str:
    """The worst team over the floor, the weighted figure, and the small teams apart."""
    worst = _pct_or_dash(h.owed_delivered_min_pct if h.HasField("owed_delivered_min_pct") else None)
    weighted = h.owed_delivered_weighted_pct if h.HasField("owed_delivered_weighted_pct") else None
    line = f"worst team: {worst}; weighted: {_pct_or_dash(weighted)}"
    small = h.owed_small_teams
    if small.count:
        least = small.min_pct if small.HasField("min_pct") else None
        line += (
            f"; small teams (owed under 0.1% of the cluster's GPU-hours): {small.count}, "
            f"{small.owed_pct:.2f}% of owed, worst {_pct_or_dash(least)}"
        )
    return line


def _pct_or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def usage_table(usage: budget_service_pb2.GetUsageResponse) -> Table:
    """``qm budget usage``: owed against delivered GPU-hours, one allocation a row."""
    window, covered = (round(wire_time.seconds(d)) for d in (usage.window, usage.covered))
    span = format_duration(window)
    if covered < window:
        span += f" (the log covers {format_duration(covered)})"
    table = _table(
        "ALLOCATION", "ENTITLED", "OWED GPU-H", "DELIVERED GPU-H", "FREE GPU-H", "DELIVERED/OWED"
    )
    end = f", to {when(usage.as_of)} UTC" if usage.as_of.seconds else " (the log is empty)"
    table.caption = (
        f"over the last {span}{end}; target: {usage.target_pct:g}% of owed delivered\n"
        + _headline_line(usage.headline)
    )
    for level in usage.allocations:
        owed = level.owed_gpu_hours
        pct = level.delivered_pct if level.HasField("delivered_pct") else None
        shown = _pct_or_dash(pct)
        if pct is not None and pct < usage.target_pct and not level.small:
            shown = f"[yellow]{shown}[/]"
        if level.small:
            shown += " (small team)"
        table.add_row(
            level.allocation,
            f"{level.entitlement:.1%}",
            f"{owed:.2f}",
            f"{level.allocated_gpu_hours:.2f}",
            f"{level.unallocated_gpu_hours:.2f}",
            shown,
        )
    return table

"""How jobs, nodes, budgets and errors look in a terminal."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import typer
from google.protobuf.timestamp_pb2 import Timestamp
from qm.v1 import budget_service_pb2, job_service_pb2, types_pb2
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table

from libs.events import wire_time

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
    return f"{job.job_id} {styled_state(job.state)} {detail}"


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
    rows = [
        ("job", job.job_id),
        ("state", job_state(job)),
        ("allocation", job.spec.allocation),
        ("user", job.spec.user),
        (
            "gpus",
            f"{job.spec.gpus}×{job.spec.gpu_type or 'any'}" + (" per task" if workflow else ""),
        ),
        ("contract", f"min runtime {min_runtime:g} s, resumable {job.spec.resumable}"),
        ("estimate", f"{estimate:g} s" if estimate else "-"),
        ("command", " ".join(job.spec.command) or "-"),
        (
            ("workflow", f"{job.spec.workflow.name}: {workflow_progress(job)}")
            if workflow
            else ("nodes" if len(job.placements) > 1 else "node", _where(job))
        ),
        ("submitted", when(job.submitted_at)),
        ("started", when(job.started_at)),
        ("finished", when(job.finished_at)),
    ]
    if job.state in (types_pb2.JOB_STATE_FINISHED, types_pb2.JOB_STATE_FAILED):
        rows.append(("exit code", str(job.exit_code)))
    if job.reason:
        rows.append(("reason", job.reason))
    for key, value in rows:
        table.add_row(f"[bold]{key}[/]", value)
    if not workflow:
        return table
    return Group(table, workflow_tasks_table(job))


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

"""How jobs, nodes and budgets look in a terminal."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp
from qm.v1 import budget_service_pb2, types_pb2
from rich.table import Table

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
}


def state_name(state: types_pb2.JobState.ValueType) -> str:
    return types_pb2.JobState.Name(state).removeprefix("JOB_STATE_")


def styled_state(state: types_pb2.JobState.ValueType) -> str:
    name = state_name(state)
    return f"[{_STYLE.get(name, 'white')}]{name}[/]"


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
        table.add_row(
            job.job_id,
            styled_state(job.state),
            job.spec.allocation,
            job.spec.user,
            str(job.spec.gpus),
            job.node_id or "-",
            when(job.submitted_at),
            detail,
        )
    return table


def job_detail(job: types_pb2.Job) -> Table:
    table = Table.grid(padding=(0, 2))
    rows = [
        ("job", job.job_id),
        ("state", styled_state(job.state)),
        ("allocation", job.spec.allocation),
        ("user", job.spec.user),
        ("gpus", f"{job.spec.gpus}×{job.spec.gpu_type or 'any'}"),
        ("contract", f"min runtime {job.spec.min_runtime_s} s, resumable {job.spec.resumable}"),
        ("command", " ".join(job.spec.command)),
        ("node", f"{job.node_id} GPUs {list(job.gpu_indices)}" if job.node_id else "-"),
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
    return table


def nodes_table(nodes: list[types_pb2.Node]) -> Table:
    table = _table("NODE", "CLUSTER", "GPUS", "FREE", "EXECUTOR", "TASKS")
    for node in nodes:
        inv = node.inventory
        held = {g for task in node.running for g in task.gpu_indices}
        free = [gpu.index for gpu in inv.gpus if gpu.index not in held]
        types = sorted({gpu.type for gpu in inv.gpus})
        table.add_row(
            inv.node_id,
            inv.cluster,
            f"{len(inv.gpus)}×{'/'.join(types) or '?'}",
            str(len(free)),
            types_pb2.Executor.Name(inv.executor).removeprefix("EXECUTOR_").lower(),
            ", ".join(task.job_id for task in node.running) or "-",
        )
    return table


def tree_table(tree: types_pb2.BudgetTree, balances: budget_service_pb2.Balances) -> Table:
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

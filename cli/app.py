"""The ``qm`` command line (typer + rich), over gRPC."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, TypeVar

import grpc
import typer
from qm.v1 import (
    budget_service_pb2,
    budget_service_pb2_grpc,
    cluster_service_pb2,
    cluster_service_pb2_grpc,
    types_pb2,
)
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from rich.console import Console

from cli import render
from cli.audit import audit_app
from cli.connection import Connection, NotSignedIn
from cli.sim import sim_app

app = typer.Typer(no_args_is_help=True, help="Quartermaster: budget-based GPU scheduling.")
budget_app = typer.Typer(no_args_is_help=True, help="The budget tree and balances.")
token_app = typer.Typer(no_args_is_help=True, help="Operator tools for tokens.")
app.add_typer(budget_app, name="budget")
app.add_typer(token_app, name="token")
app.add_typer(audit_app, name="audit")
app.add_typer(sim_app, name="sim")
console = Console()
errors = Console(stderr=True)
T = TypeVar("T")

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smh]?)$")


def parse_duration(text: str) -> int:
    """``90``, ``90s``, ``30m`` or ``2h`` to seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise typer.BadParameter(f"{text!r} is not a duration like 90s, 30m or 2h")
    value, unit = float(match.group(1)), match.group(2) or "s"
    return int(value * {"s": 1, "m": 60, "h": 3600}[unit])


@contextmanager
def _rpc() -> Iterator[Connection]:
    try:
        yield Connection.from_env()
    except NotSignedIn as exc:
        errors.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    except grpc.RpcError as exc:
        code = exc.code()
        details = exc.details()
        if code == grpc.StatusCode.UNAVAILABLE:
            details = f"{details} (is the stack running? `make up`)"
        errors.print(f"[red]error:[/] {code.name}: {details}")
        raise typer.Exit(1) from exc


def _jobs(conn: Connection) -> js_grpc.JobServiceStub:
    return js_grpc.JobServiceStub(conn.channel())


def _call(method: Callable[..., T], request: object, conn: Connection) -> T:
    return method(request, metadata=conn.metadata, timeout=30)


@app.command()
def submit(
    command: Annotated[list[str], typer.Argument(help="The program and its arguments, after --")],
    gpus: Annotated[int, typer.Option(help="GPUs on one node")] = 1,
    gpu_type: Annotated[str, typer.Option(help="e.g. H100; empty for any")] = "",
    allocation: Annotated[str, typer.Option(help="Budget leaf to charge")] = "",
    min_runtime: Annotated[
        str, typer.Option(help="Contract: protected runtime, e.g. 30m; 0 = free, preemptible")
    ] = "0",
    resumable: Annotated[
        bool, typer.Option(help="Requeue instead of failing on preemption")
    ] = False,
    priority: Annotated[int, typer.Option(help="Order within your allocation")] = 0,
    request_id: Annotated[str, typer.Option(help="Idempotency key (default: random)")] = "",
    env: Annotated[list[str] | None, typer.Option(help="KEY=VALUE for the task")] = None,
    sim_duration: Annotated[float, typer.Option(help="Simulated nodes: run time, s")] = 0.0,
    sim_exit_code: Annotated[int, typer.Option(help="Simulated nodes: exit code")] = 0,
    sim_utilization: Annotated[
        float, typer.Option(help="Simulated nodes: GPU utilisation the task reports, 0..1")
    ] = 1.0,
    wait: Annotated[bool, typer.Option(help="Follow the job until it ends")] = False,
) -> None:
    """Submit a job: qm submit --gpus 2 -- python train.py"""
    pairs = dict(item.split("=", 1) for item in env or [] if "=" in item)
    spec = types_pb2.JobSpec(
        allocation=allocation,
        gpus=gpus,
        gpu_type=gpu_type,
        min_runtime_s=parse_duration(min_runtime),
        resumable=resumable,
        priority=priority,
        command=command,
        client_request_id=request_id or uuid.uuid4().hex,
        env=pairs,
        simulated_duration_s=sim_duration,
        simulated_exit_code=sim_exit_code,
        simulated_utilization=sim_utilization,
    )
    with _rpc() as conn:
        reply = _call(_jobs(conn).SubmitJob, js.SubmitJobRequest(spec=spec), conn)
        note = " (already submitted with this request id)" if reply.duplicate else ""
        console.print(f"submitted [bold]{reply.job_id}[/]{note}")
        if wait:
            _follow(conn, reply.job_id)
        else:
            console.print(f"follow it with: qm status {reply.job_id}")


@app.command()
def status(
    job_id: Annotated[
        str | None, typer.Argument(help="One job; all recent jobs if omitted")
    ] = None,
    allocation: Annotated[str, typer.Option(help="Only this allocation")] = "",
    limit: Annotated[int, typer.Option(help="How many jobs")] = 50,
) -> None:
    """Show one job in detail, or recent jobs."""
    with _rpc() as conn:
        stub = _jobs(conn)
        if job_id:
            console.print(
                render.job_detail(_call(stub.GetJob, js.GetJobRequest(job_id=job_id), conn))
            )
        else:
            request = js.ListJobsRequest(allocation=allocation, limit=limit)
            console.print(render.jobs_table(list(_call(stub.ListJobs, request, conn).jobs)))


@app.command()
def watch(job_id: str) -> None:
    """Print every state change of a job until it ends."""
    with _rpc() as conn:
        _follow(conn, job_id)


def _follow(conn: Connection, job_id: str) -> None:
    stream = _jobs(conn).WatchJob(js.WatchJobRequest(job_id=job_id), metadata=conn.metadata)
    for job in stream:
        detail = job.reason or (f"{job.node_id} {list(job.gpu_indices)}" if job.node_id else "")
        if job.state in (types_pb2.JOB_STATE_FINISHED, types_pb2.JOB_STATE_FAILED):
            detail = f"exit code {job.exit_code}"
        console.print(f"{job.job_id} {render.styled_state(job.state)} {detail}")


@app.command()
def cancel(job_id: str) -> None:
    """Cancel a job (yours, or one in an allocation you manage)."""
    with _rpc() as conn:
        _call(_jobs(conn).CancelJob, js.CancelJobRequest(job_id=job_id), conn)
        console.print(f"cancel requested for {job_id}")


@app.command()
def why(job_id: str) -> None:
    """Why a job is waiting (or what it is doing)."""
    with _rpc() as conn:
        answer = _call(_jobs(conn).ExplainJob, js.ExplainJobRequest(job_id=job_id), conn)
        console.print(f"{answer.job_id} {render.styled_state(answer.state)}")
        for part in answer.reason.split("; "):
            console.print(f"  • {part}")


@app.command()
def nodes(cluster: Annotated[str, typer.Option(help="Only this cluster")] = "") -> None:
    """List nodes with their free GPUs and running jobs."""
    with _rpc() as conn:
        stub = cluster_service_pb2_grpc.ClusterServiceStub(conn.channel())
        reply = _call(stub.ListNodes, cluster_service_pb2.ListNodesRequest(cluster=cluster), conn)
        console.print(render.nodes_table(list(reply.nodes)))


@budget_app.command("tree")
def budget_tree() -> None:
    """The budget tree with entitlements and charged GPU-hours."""
    with _rpc() as conn:
        stub = budget_service_pb2_grpc.BudgetServiceStub(conn.budget_channel())
        tree = _call(stub.GetTree, budget_service_pb2.GetTreeRequest(), conn)
        balances = _call(stub.GetBalances, budget_service_pb2.GetBalancesRequest(), conn)
        console.print(render.tree_table(tree, balances))


@budget_app.command("set")
def budget_set(
    name: str,
    parent: Annotated[str, typer.Option(help="Parent node (required unless root)")] = "",
    weight: Annotated[float, typer.Option(help="Share among siblings, > 0")] = 1.0,
    member: Annotated[list[str] | None, typer.Option(help="May submit (repeat)")] = None,
    manager: Annotated[list[str] | None, typer.Option(help="May change the subtree")] = None,
) -> None:
    """Add or replace a node of the budget tree (managers only)."""
    node = types_pb2.BudgetNode(
        name=name, parent=parent, weight=weight, members=member or [], managers=manager or []
    )
    with _rpc() as conn:
        stub = budget_service_pb2_grpc.BudgetServiceStub(conn.budget_channel())
        tree = _call(stub.SetAllocation, budget_service_pb2.SetAllocationRequest(node=node), conn)
        console.print(f"budget tree is now version {tree.version}")


@token_app.command("issue")
def token_issue(user: str) -> None:
    """Print a token for USER, signed with this installation's secret."""
    from libs.auth import AuthError, issue_token, load_secret

    try:
        print(issue_token(user, load_secret()))
    except (AuthError, ValueError) as exc:
        errors.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc


def main() -> None:
    app(prog_name="qm")


if __name__ == "__main__":
    main()

"""The ``qm`` command line (typer + rich), over gRPC."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

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
from cli.budget import NodeEdit, edited_node
from cli.connection import CallFailed, Connection, NotSignedIn
from cli.params import INT32, UINT32_MAX, duration, input_file, key_value
from cli.secrets import secret_app
from cli.sim import sim_app
from cli.tokens import login, token_app
from libs.config.document import ConfigError, load
from libs.config.workflow import WorkflowFile
from libs.core import simulated
from libs.core.simulated import SimulatedRun
from libs.events import wire_time

app = typer.Typer(no_args_is_help=True, help="Quartermaster: budget-based GPU scheduling.")
budget_app = typer.Typer(no_args_is_help=True, help="The budget tree and balances.")
app.add_typer(budget_app, name="budget")
app.add_typer(token_app, name="token")
app.add_typer(secret_app, name="secret")
app.command()(login)
app.add_typer(audit_app, name="audit")
app.add_typer(sim_app, name="sim")
# In a pipe or a file, every column whole: rich would cut lines to 80 columns.
console = Console() if sys.stdout.isatty() else Console(width=1 << 16)


@contextmanager
def _rpc() -> Iterator[Connection]:
    """The connection for a command; a failure ends it with one line and a non-zero exit."""
    try:
        yield Connection.from_env()
    except (NotSignedIn, ConfigError) as exc:
        raise render.fail(exc) from exc
    except CallFailed as exc:
        raise render.fail(exc, 1) from exc


def _jobs(conn: Connection) -> js_grpc.JobServiceStub:
    return js_grpc.JobServiceStub(conn.admission.channel())


def _budget(conn: Connection) -> budget_service_pb2_grpc.BudgetServiceStub:
    return budget_service_pb2_grpc.BudgetServiceStub(conn.budget.channel())


@app.command()
def submit(
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The program and its arguments, after --; optional with --workflow"),
    ] = None,
    gpus: Annotated[int, typer.Option(min=0, max=UINT32_MAX, help="GPUs on one node")] = 1,
    gpu_type: Annotated[str, typer.Option(help="e.g. H100; empty for any")] = "",
    allocation: Annotated[str, typer.Option(help="Budget leaf to charge")] = "",
    min_runtime: Annotated[
        float, duration("0", "Contract: protected runtime, e.g. 30m; 0 = free, preemptible")
    ] = 0.0,
    estimate: Annotated[
        float, duration("0", "Expected run time, e.g. 2h, for planning only; 0 = not given")
    ] = 0.0,
    resumable: Annotated[
        bool, typer.Option(help="Requeue instead of failing on preemption")
    ] = False,
    priority: Annotated[
        int, typer.Option(min=INT32[0], max=INT32[1], help="Order within your allocation")
    ] = 0,
    request_id: Annotated[
        str, typer.Option(help="Idempotency key (default: random; the same on every retry)")
    ] = "",
    env: Annotated[
        list[str] | None, typer.Option(parser=key_value, help="KEY=VALUE for the task (repeat)")
    ] = None,
    secret: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME of your secret for the task, set as variable NAME from the node's "
            "secret store, never sent with the job (repeat)"
        ),
    ] = None,
    sim_duration: Annotated[float, duration("0", "Simulated nodes: run time")] = 0.0,
    sim_exit_code: Annotated[
        int, typer.Option(min=INT32[0], max=INT32[1], help="Simulated nodes: exit code")
    ] = 0,
    sim_utilization: Annotated[
        float,
        typer.Option(min=0, max=1, help="Simulated nodes: GPU utilisation the task reports"),
    ] = 1.0,
    workflow: Annotated[
        Path | None,
        input_file(
            "A workflow (JSON or YAML): a DAG of model-serving tasks, one GPU each; "
            "e.g. deploy/examples/workflow-translation.yaml"
        ),
    ] = None,
    workflow_name: Annotated[
        str, typer.Option(help="Which workflow of a file that holds several (workflows: {...})")
    ] = "",
    wait: Annotated[bool, typer.Option(help="Follow the job until it ends")] = False,
) -> None:
    """Submit a job: qm submit --gpus 2 -- python train.py, or qm submit --workflow FILE"""
    if not command and workflow is None:
        raise typer.BadParameter("give the command after --, or a --workflow FILE")
    spec = types_pb2.JobSpec(
        allocation=allocation,
        gpus=gpus,
        gpu_type=gpu_type,
        min_runtime=wire_time.duration(int(min_runtime)) if min_runtime else None,
        runtime_estimate=wire_time.duration(estimate) if estimate else None,
        resumable=resumable,
        priority=priority,
        command=command or [],
        # gRPC resends this very request on a retry: the id makes the retries one job.
        client_request_id=request_id or uuid.uuid4().hex,
        # A simulated node reads how to "run" the job from its environment.
        env=dict(item.split("=", 1) for item in env or [])
        | simulated.to_env(SimulatedRun(sim_duration, sim_exit_code, sim_utilization)),
        secrets=secret or [],
    )
    if workflow is not None:
        try:
            spec.workflow.CopyFrom(load_workflow(workflow, workflow_name))
        except ConfigError as exc:
            raise typer.BadParameter(str(exc), param_hint="--workflow") from exc
    with _rpc() as conn:
        reply = conn.call(conn.admission, _jobs(conn).SubmitJob, js.SubmitJobRequest(spec=spec))
        note = " (already submitted with this request id)" if reply.duplicate else ""
        console.print(f"submitted [bold]{reply.job_id}[/]{note}")
        if wait:
            _follow(conn, reply.job_id)
        else:
            console.print(f"follow it with: qm status {reply.job_id}")


def load_workflow(path: Path, name: str = "") -> types_pb2.Workflow:
    """One workflow of a workflow file (``libs.config.workflow`` describes the shapes);
    ``name`` picks one of several. The rules of a DAG are admission's to check."""
    file = load(WorkflowFile, path)
    chosen, tasks = file.chosen(path, name)
    return types_pb2.Workflow(
        name=chosen,
        tasks=[
            types_pb2.WorkflowTask(
                task_id=task.id,
                model=task.model or "",
                model_mb=file.model_mb(task),
                run_duration=wire_time.duration_ms(task.run_ms),
                in_kb=task.in_kb,
                out_kb=task.out_kb,
                parents=task.parents,
            )
            for task in tasks
        ],
    )


@app.command()
def status(
    job_id: Annotated[
        str | None, typer.Argument(help="One job; all recent jobs if omitted")
    ] = None,
    allocation: Annotated[str, typer.Option(help="Only this allocation")] = "",
    limit: Annotated[int, typer.Option(min=1, max=UINT32_MAX, help="How many jobs")] = 50,
) -> None:
    """Show one job in detail, or recent jobs."""
    with _rpc() as conn:
        stub = _jobs(conn)
        if job_id:
            reply = conn.call(conn.admission, stub.GetJob, js.GetJobRequest(job_id=job_id))
            console.print(render.job_detail(reply.job))
        else:
            request = js.ListJobsRequest(allocation=allocation, limit=limit)
            reply = conn.call(conn.admission, stub.ListJobs, request)
            console.print(render.jobs_table(list(reply.jobs)))


@app.command()
def watch(job_id: str) -> None:
    """Print every state change of a job until it ends."""
    with _rpc() as conn:
        _follow(conn, job_id)


def _follow(conn: Connection, job_id: str) -> None:
    """Follow a job's stream; it has no deadline (a job may run for days), but gRPC retries
    its start like any call, and a broken stream ends the command with one line."""
    started = time.monotonic()
    stream = _jobs(conn).WatchJob(js.WatchJobRequest(job_id=job_id), metadata=conn.metadata)
    try:
        for change in stream:
            job = change.job
            detail = job.reason or (f"{job.node_id} {list(job.gpu_indices)}" if job.node_id else "")
            if job.spec.HasField("workflow") and not job.reason:
                detail = render.workflow_progress(job)
            if job.state in (types_pb2.JOB_STATE_FINISHED, types_pb2.JOB_STATE_FAILED):
                detail = f"exit code {job.exit_code}"
            console.print(f"{job.job_id} {render.styled_state(job.state)} {detail}")
    except grpc.RpcError as exc:
        raise CallFailed(conn.admission.failure(exc, time.monotonic() - started)) from exc


@app.command()
def cancel(job_id: str) -> None:
    """Cancel a job (yours, or one in an allocation you manage)."""
    with _rpc() as conn:
        conn.call(conn.admission, _jobs(conn).CancelJob, js.CancelJobRequest(job_id=job_id))
        console.print(f"cancel requested for {job_id}")


@app.command()
def why(job_id: str) -> None:
    """Why a job is waiting (or what it is doing)."""
    with _rpc() as conn:
        request = js.ExplainJobRequest(job_id=job_id)
        answer = conn.call(conn.admission, _jobs(conn).ExplainJob, request)
        console.print(f"{answer.job_id} {render.styled_state(answer.state)}")
        for part in answer.reason.split("; "):
            console.print(f"  • {part}")


@app.command()
def nodes(cluster: Annotated[str, typer.Option(help="Only this cluster")] = "") -> None:
    """List nodes with their free GPUs and running jobs."""
    with _rpc() as conn:
        stub = cluster_service_pb2_grpc.ClusterServiceStub(conn.admission.channel())
        request = cluster_service_pb2.ListNodesRequest(cluster=cluster)
        console.print(
            render.nodes_table(list(conn.call(conn.admission, stub.ListNodes, request).nodes))
        )


@budget_app.command("tree")
def budget_tree() -> None:
    """The budget tree with entitlements and charged GPU-hours."""
    with _rpc() as conn:
        stub = _budget(conn)
        tree = conn.call(conn.budget, stub.GetTree, budget_service_pb2.GetTreeRequest()).tree
        balances = conn.call(conn.budget, stub.GetBalances, budget_service_pb2.GetBalancesRequest())
        console.print(render.tree_table(tree, balances))


@budget_app.command("set")
def budget_set(
    name: str,
    parent: Annotated[
        str | None, typer.Option(help="Parent node (a new node needs one, unless root)")
    ] = None,
    weight: Annotated[
        float | None, typer.Option(min=1e-6, max=1e9, help="Share among siblings (new: 1)")
    ] = None,
    member: Annotated[
        list[str] | None, typer.Option(help="The members, all of them (repeat)")
    ] = None,
    manager: Annotated[
        list[str] | None, typer.Option(help="The managers, all of them (repeat)")
    ] = None,
    add_member: Annotated[list[str] | None, typer.Option(help="Add a member (repeat)")] = None,
    remove_member: Annotated[
        list[str] | None, typer.Option(help="Remove a member (repeat)")
    ] = None,
    add_manager: Annotated[list[str] | None, typer.Option(help="Add a manager (repeat)")] = None,
    remove_manager: Annotated[
        list[str] | None, typer.Option(help="Remove a manager (repeat)")
    ] = None,
) -> None:
    """Add a node to the budget tree, or change what you name of one (managers only)."""
    edit = NodeEdit(
        parent=parent,
        weight=weight,
        members=member,
        managers=manager,
        add_members=add_member or (),
        remove_members=remove_member or (),
        add_managers=add_manager or (),
        remove_managers=remove_manager or (),
    )
    with _rpc() as conn:
        stub = _budget(conn)
        current = conn.call(conn.budget, stub.GetTree, budget_service_pb2.GetTreeRequest()).tree
        request = budget_service_pb2.SetAllocationRequest(
            node=edited_node(current, name, edit), expected_version=current.version
        )
        tree = conn.call(conn.budget, stub.SetAllocation, request).tree
        console.print(f"budget tree is now version {tree.version}")


def main() -> None:
    app(prog_name="qm")


if __name__ == "__main__":
    main()

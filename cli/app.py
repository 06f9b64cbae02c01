"""The ``qm`` command line (typer + rich), over gRPC."""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import grpc
import typer
import yaml
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
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The program and its arguments, after --; optional with --workflow"),
    ] = None,
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
    workflow: Annotated[
        Path | None,
        typer.Option(
            help="A workflow (JSON or YAML): a DAG of model-serving tasks, one GPU each; "
            "e.g. deploy/examples/workflow-translation.yaml"
        ),
    ] = None,
    workflow_name: Annotated[
        str, typer.Option(help="Which workflow of a file that holds several (workflows: {...})")
    ] = "",
    wait: Annotated[bool, typer.Option(help="Follow the job until it ends")] = False,
) -> None:
    """Submit a job: qm submit --gpus 2 -- python train.py, or qm submit --workflow FILE"""
    pairs = dict(item.split("=", 1) for item in env or [] if "=" in item)
    if not command and workflow is None:
        raise typer.BadParameter("give the command after --, or a --workflow FILE")
    spec = types_pb2.JobSpec(
        allocation=allocation,
        gpus=gpus,
        gpu_type=gpu_type,
        min_runtime_s=parse_duration(min_runtime),
        resumable=resumable,
        priority=priority,
        command=command or [],
        client_request_id=request_id or uuid.uuid4().hex,
        env=pairs,
        simulated_duration_s=sim_duration,
        simulated_exit_code=sim_exit_code,
        simulated_utilization=sim_utilization,
    )
    if workflow is not None:
        try:
            spec.workflow.CopyFrom(load_workflow(workflow, workflow_name))
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--workflow") from exc
    with _rpc() as conn:
        reply = _call(_jobs(conn).SubmitJob, js.SubmitJobRequest(spec=spec), conn)
        note = " (already submitted with this request id)" if reply.duplicate else ""
        console.print(f"submitted [bold]{reply.job_id}[/]{note}")
        if wait:
            _follow(conn, reply.job_id)
        else:
            console.print(f"follow it with: qm status {reply.job_id}")


def load_workflow(path: Path, name: str = "") -> types_pb2.Workflow:
    """Read a workflow file (YAML, or JSON, which YAML reads too).

    Either one workflow, ``{name, tasks: [{id, model, model_mb, run_ms, in_kb, out_kb,
    parents}]}``, or the Compass profile shape, ``{models: {MODEL: MB}, workflows: {NAME:
    {tasks: [...]}}}`` (``name`` picks one; optional when there is one). A task without
    ``model_mb`` takes its model's size from a top-level ``models`` table; a null or
    missing model is glue code with no model. The rules of a DAG are admission's to check.
    """
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: expected a mapping with tasks (or workflows)")
    models = raw.get("models") or {}
    if not isinstance(models, Mapping):
        raise ValueError(f"{path}: models must map model names to sizes in MB")
    chosen: Any = raw
    default_name = str(raw.get("name") or path.stem)
    if "workflows" in raw:
        flows = raw["workflows"]
        if not isinstance(flows, Mapping) or not flows:
            raise ValueError(f"{path}: workflows must map names to workflows")
        if not name and len(flows) > 1:
            raise ValueError(f"{path} holds several workflows ({', '.join(flows)}): pick one")
        default_name = name or next(iter(flows))
        if default_name not in flows:
            raise ValueError(f"{path}: no workflow {default_name!r}; has {', '.join(flows)}")
        chosen = flows[default_name]
    elif name and name != default_name:
        raise ValueError(f"{path} holds one workflow, {default_name!r}, not {name!r}")
    tasks = chosen.get("tasks") if isinstance(chosen, Mapping) else None
    if not isinstance(tasks, list) or not tasks:
        raise ValueError(f"{path}: a workflow needs a list of tasks")
    workflow = types_pb2.Workflow(name=str(chosen.get("name") or default_name))
    for position, task in enumerate(tasks):
        if not isinstance(task, Mapping):
            raise ValueError(f"{path}: task {position} is not a mapping")
        task_id = str(task.get("id", task.get("task_id", "")))
        where = f"{path}: task {task_id or position}"
        model = str(task.get("model") or "")
        size: Any = task.get("model_mb")
        if size is None:
            size = models.get(model, 0) if model else 0
            if model and model not in models:
                raise ValueError(f"{where}: no model_mb, and model {model!r} is not in models")
        parents = task.get("parents") or []
        if not isinstance(parents, list):
            raise ValueError(f"{where}: parents must be a list of task ids")
        workflow.tasks.append(
            types_pb2.WorkflowTask(
                task_id=task_id,
                model=model,
                model_mb=_number(size, f"{where}: model_mb"),
                run_ms=_number(task.get("run_ms", 0), f"{where}: run_ms"),
                in_kb=_number(task.get("in_kb", 0), f"{where}: in_kb"),
                out_kb=_number(task.get("out_kb", 0), f"{where}: out_kb"),
                parents=[str(p) for p in parents],
            )
        )
    return workflow


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{where} must be a number, got {json.dumps(value, default=str)}")
    return float(value)


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
        if job.spec.HasField("workflow") and not job.reason:
            detail = render.workflow_progress(job)
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

"""The ``qm`` command line (typer + rich), over gRPC."""

from __future__ import annotations

import math
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
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

from cli import exits, render
from cli.arrays import array_indexes
from cli.audit import audit_app
from cli.budget import NodeEdit, changes, edited_node
from cli.connection import CallFailed, Connection, NotSignedIn
from cli.export import export
from cli.groups import group
from cli.output import Format, OutputFlag, emit, emit_one, message, stdout_console
from cli.params import (
    INT32,
    JOB_STATES,
    UINT32_MAX,
    dependency,
    duration,
    input_file,
    job_states,
    key_value,
    number,
    stop_warning,
)
from cli.params import (
    mount as mount_flag,
)
from cli.progress import counting
from cli.secrets import secret_app
from cli.sim import sim_app
from cli.tokens import login, token_app
from libs.config.document import ConfigError, load
from libs.config.workflow import WorkflowFile
from libs.core import simulated
from libs.core.ids import array_of, is_array_id, name_in_job
from libs.core.limits import MAX_ARRAY_ELEMENTS, MAX_GANG_NODES, MAX_NODE_GPUS
from libs.core.simulated import SimulatedRun
from libs.events import wire_time

app = group("Quartermaster: budget-based GPU scheduling.")
budget_app = group("The budget tree and balances.")
app.add_typer(budget_app, name="budget")
node_app = group("Steer nodes (operators only).")
app.add_typer(node_app, name="node")
app.add_typer(token_app, name="token")
app.add_typer(secret_app, name="secret")
app.command()(login)
app.add_typer(audit_app, name="audit")
app.command()(export)
app.add_typer(sim_app, name="sim")
console = stdout_console()


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
    gpus: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=UINT32_MAX,
            show_default="1",
            help="GPUs, on one node (more: --nodes N --gpus-per-node M)",
        ),
    ] = None,
    # Bounded by the protocol's limits, so that their product fits the request.
    nodes: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=MAX_GANG_NODES,
            help="Nodes the job spans, with --gpus-per-node: a part on each, started together",
        ),
    ] = None,
    gpus_per_node: Annotated[
        int | None,
        typer.Option(
            min=1, max=MAX_NODE_GPUS, help="GPUs on each node (without --nodes: on one node)"
        ),
    ] = None,
    gpu_type: Annotated[str, typer.Option(help="e.g. H100; empty for any")] = "",
    allocation: Annotated[str, typer.Option(help="Budget leaf to charge")] = "",
    min_runtime: Annotated[
        float, duration("0", "Contract: protected runtime, e.g. 30m; 0 = free, preemptible")
    ] = 0.0,
    estimate: Annotated[
        float, duration("0", "Expected run time, e.g. 2h, for planning only; 0 = not given")
    ] = 0.0,
    time_limit: Annotated[
        float,
        duration(
            "0",
            "Wall-time limit from its start, e.g. 2h (whole seconds, rounded up): then it is "
            "stopped and ends TIMEOUT; also its estimate unless --estimate gives one; 0 = none",
            "--time",
        ),
    ] = 0.0,
    after: Annotated[
        list[types_pb2.Dependency] | None,
        typer.Option(
            parser=dependency,
            metavar="JOB[:ok|:any]",
            help="Start only after JOB finished with exit code 0 (:ok, the default) or ended "
            "however (:any); a job that can no longer start so is cancelled (repeat)",
        ),
    ] = None,
    signal: Annotated[
        types_pb2.StopWarning | None,
        typer.Option(
            parser=stop_warning,
            metavar="SIG@DURATION",
            help="Warn the job with SIG (USR1, USR2, INT, HUP, QUIT or TERM) that long "
            "before SIGTERM when it is preempted, drained or reaches --time, e.g. USR1@2m, "
            "so it can save a checkpoint (touch $QM_CHECKPOINT_SAVED once saved: it is "
            "then stopped at once); at most the cluster's max_stop_warning_s",
        ),
    ] = None,
    image: Annotated[
        str,
        typer.Option(
            metavar="REF",
            help="Run the command in this OCI image, its registry named (e.g. "
            "localhost/qm-example:1), as your account, with your scratch folder and only your "
            "GPUs; empty: as a process on the node",
        ),
    ] = "",
    mount: Annotated[
        list[types_pb2.Mount] | None,
        typer.Option(
            parser=mount_flag,
            metavar="NAME:/path",
            help="Mount a volume the cluster declares (its sandbox file's volumes:) at /path "
            "in the job's image (repeat); nothing undeclared can be mounted",
        ),
    ] = None,
    workdir: Annotated[
        str,
        typer.Option(metavar="DIR", help="Working directory; empty: your home or scratch folder"),
    ] = "",
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
        number(
            "Simulated nodes: GPU utilisation the task reports (with --sim-duration or "
            "--sim-exit-code, which ask for a simulated run)",
            least=0,
            most=1,
        ),
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
    array: Annotated[
        str | None,
        typer.Option(
            metavar="INDEXES",
            help="A job array: one id, an element per index (e.g. 0-9, 1,3,5 or 0-15:4), "
            "each told QM_ARRAY_INDEX; qm status and qm cancel take the array or one element",
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option(help=f"Follow the job until it ends; exit with {exits.described()}")
    ] = False,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            "-q",
            help="Print only the job id (or the array's), for scripts: "
            "JOB=$(qm submit -q -- ...); with --wait, no changes either",
        ),
    ] = False,
) -> None:
    """Submit a job: qm submit --gpus 2 -- python train.py, or qm submit --workflow FILE"""
    if not command and workflow is None:
        raise typer.BadParameter("give the command after --, or a --workflow FILE")
    if array is not None and (wait or workflow is not None):
        raise typer.BadParameter("an array is of batch jobs, and is not followed")
    try:
        indexes = array_indexes(array) if array is not None else None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--array") from None
    gpus, nodes = _gpus_and_nodes(gpus, nodes, gpus_per_node)
    spec = types_pb2.JobSpec(
        allocation=allocation,
        gpus=gpus,
        nodes=nodes,
        gpu_type=gpu_type,
        min_runtime=wire_time.duration(int(min_runtime)) if min_runtime else None,
        runtime_estimate=wire_time.duration(estimate) if estimate else None,
        # Rounded up: a limit of 0.5 s is not "none".
        time_limit=wire_time.duration(math.ceil(time_limit)) if time_limit else None,
        after=after or [],
        stop_warning=signal,
        image=image,
        mounts=mount or [],
        workdir=workdir,
        resumable=resumable,
        priority=priority,
        command=command or [],
        # gRPC resends this very request on a retry: the id makes the retries one job.
        client_request_id=request_id or uuid.uuid4().hex,
        # A simulated node reads how to "run" the job from its environment; a job that
        # asks for no simulated run carries none of it (its command must really run).
        env=dict(item.split("=", 1) for item in env or [])
        | (
            simulated.to_env(SimulatedRun(sim_duration, sim_exit_code, sim_utilization))
            if sim_duration or sim_exit_code
            else {}
        ),
        secrets=secret or [],
    )
    if workflow is not None:
        try:
            spec.workflow.CopyFrom(load_workflow(workflow, workflow_name))
        except ConfigError as exc:
            raise typer.BadParameter(str(exc), param_hint="--workflow") from exc
    with _rpc() as conn:
        if indexes is not None:
            _submit_array(conn, spec, indexes, quiet)
            return
        reply = conn.call(conn.admission, _jobs(conn).SubmitJob, js.SubmitJobRequest(spec=spec))
        if quiet:
            console.print(reply.job_id, highlight=False)
        else:
            note = " (already submitted with this request id)" if reply.duplicate else ""
            console.print(f"submitted [bold]{reply.job_id}[/]{note}")
            if not reply.duplicate:
                console.print(render.protection_at_submission(spec), highlight=False)
            if not wait:
                console.print(f"follow it with: qm status {reply.job_id}")
        if not wait:
            return
        last = _follow(conn, reply.job_id, None if quiet else Format.TABLE)
    raise typer.Exit(exits.exit_code(last))


def _gpus_and_nodes(
    gpus: int | None, nodes: int | None, gpus_per_node: int | None
) -> tuple[int, int]:
    """The job's GPUs in all and the nodes it spans (0: one, not named), from --gpus,
    --nodes and --gpus-per-node."""
    if nodes is None and gpus_per_node is None:
        return (1 if gpus is None else gpus), 0
    if gpus_per_node is None:
        raise typer.BadParameter(
            "give the GPUs on each node with --gpus-per-node M", param_hint="--nodes"
        )
    nodes = nodes or 1
    total = nodes * gpus_per_node
    if gpus is not None and gpus != total:
        raise typer.BadParameter(
            f"{gpus} GPUs are not --nodes {nodes} × --gpus-per-node {gpus_per_node} "
            f"({total}); give either",
            param_hint="--gpus",
        )
    return total, nodes


def _submit_array(
    conn: Connection, spec: types_pb2.JobSpec, indexes: tuple[int, ...], quiet: bool
) -> None:
    """An element per index, all with the array's request id (admission names each
    ``ARRAY_INDEX``, so a retry makes the same elements); ``quiet``: only the array's id."""
    replies = []
    with counting(console, "jobs submitted", len(indexes)) as advance:
        for index in indexes:
            element = types_pb2.JobSpec()
            element.CopyFrom(spec)
            element.array.index = index
            element.array.count = len(indexes)
            request = js.SubmitJobRequest(spec=element)
            replies.append(conn.call(conn.admission, _jobs(conn).SubmitJob, request))
            advance(1)
    array_id = array_of(replies[0].job_id) or replies[0].job_id
    if quiet:
        console.print(array_id, highlight=False)
        return
    note = " (already submitted with this request id)" if all(r.duplicate for r in replies) else ""
    console.print(
        f"submitted array [bold]{array_id}[/]{note}: {len(replies)} jobs, "
        f"{replies[0].job_id} … {replies[-1].job_id}",
        highlight=False,
    )
    if not note:  # every element is protected alike
        console.print(render.protection_at_submission(spec), highlight=False)
    console.print(
        f"follow it with: qm status {array_id}; cancel it (or one element) with: "
        f"qm cancel {array_id}"
    )


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
    user: Annotated[str, typer.Option(help="Only jobs this user submitted")] = "",
    state: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Only jobs in these states (repeat, or a comma list): {', '.join(JOB_STATES)}"
        ),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=UINT32_MAX, help="How many jobs")] = 50,
    output: OutputFlag = Format.TABLE,
) -> None:
    """Show one job in detail, a job array's elements, or recent jobs (yours and your
    allocations').

    -o json|yaml: one job is a qm.v1.Job; a list is {"jobs": [qm.v1.Job, ...]}, newest
    first (an array's elements by index).
    """
    array_id = job_id if job_id and is_array_id(job_id) else ""
    if job_id and not array_id and (allocation or user or state):
        raise typer.BadParameter("--allocation, --user and --state filter a list, not one job")
    states = job_states(state or [])
    with _rpc() as conn:
        stub = _jobs(conn)
        if job_id and not array_id:
            job = conn.call(conn.admission, stub.GetJob, js.GetJobRequest(job_id=job_id)).job
            emit(console, output, lambda: message(job), lambda: render.job_detail(job))
            return
        request = js.ListJobsRequest(
            allocation=allocation,
            user=user,
            states=states,
            # An array is listed whole: every element, by index.
            limit=MAX_ARRAY_ELEMENTS if array_id else limit,
            array_id=array_id,
        )
        reply = conn.call(conn.admission, stub.ListJobs, request)
        if not array_id:
            table = partial(render.jobs_table, list(reply.jobs))
            emit(console, output, lambda: message(reply), table)
            return
        if not reply.jobs and not states:
            raise render.fail(f"no job array {array_id!r}", 1)
        elements = sorted(reply.jobs, key=lambda job: job.spec.array.index)
        del reply.jobs[:]
        reply.jobs.extend(elements)
        emit(
            console,
            output,
            lambda: message(reply),
            partial(render.array, array_id, elements, whole=not states),
        )


@app.command()
def watch(job_id: str, output: OutputFlag = Format.TABLE) -> None:
    """Print every state change of a job until it ends.

    -o json: a qm.v1.Job per line (JSON Lines) at each change; -o yaml: a document each.
    """
    with _rpc() as conn:
        _follow(conn, job_id, output)


def _follow(
    conn: Connection, job_id: str, output: Format | None = Format.TABLE
) -> types_pb2.Job | None:
    """Follow a job's stream, printing each change as ``output`` says (None: not at all);
    it has no deadline (a job may run for days), but gRPC retries its start like any
    call, and a broken stream ends the command with one line. Returns the job as last
    seen (None: never seen): the stream ends when the job does."""
    started = time.monotonic()
    stream = _jobs(conn).WatchJob(js.WatchJobRequest(job_id=job_id), metadata=conn.metadata)
    job = None
    try:
        for change in stream:
            job = change.job
            if output is not None:
                emit_one(console, output, partial(message, job), partial(render.change, job))
    except grpc.RpcError as exc:
        raise CallFailed(conn.admission.failure(exc, time.monotonic() - started)) from exc
    return job


@app.command()
def logs(
    job_id: str,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Wait for it to start; stream until it ends (requeues too)"
        ),
    ] = False,
    attempt: Annotated[
        int | None,
        typer.Option(min=1, max=UINT32_MAX, help="Only this attempt (1: its first placement)"),
    ] = None,
) -> None:
    """Print a job's output (stdout and stderr, in whole lines, as its tasks wrote them):
    every attempt in order, and every part of a gang's attempt, each under a header
    (=== attempt 2, part 1 (j-x/1.0) on node-1 ===). Following, the parts running at once
    interleave, a header before each change of task."""
    with _rpc() as conn:
        started = time.monotonic()
        request = js.StreamLogsRequest(job_id=job_id, follow=follow, attempt=attempt or 0)
        stream = _jobs(conn).StreamLogs(request, metadata=conn.metadata)
        out = sys.stdout.buffer
        task, line_start = "", True
        try:
            for piece in stream:
                if piece.task_id != task:
                    out.write((b"" if line_start else b"\n") + _log_header(job_id, piece))
                    task = piece.task_id
                out.write(piece.data)
                out.flush()
                line_start = piece.data.endswith(b"\n") if piece.data else line_start
        except grpc.RpcError as exc:
            raise CallFailed(conn.admission.failure(exc, time.monotonic() - started)) from exc


def _log_header(job_id: str, piece: js.StreamLogsResponse) -> bytes:
    """The line that names the task whose output follows."""
    if piece.attempt:
        what = f"attempt {piece.attempt}" + (f", part {piece.part}" if piece.part else "")
    else:
        what = f"task {name_in_job(job_id, piece.task_id)}"
    return f"=== {what} ({piece.task_id}) on {piece.node_id} ===\n".encode()


@app.command()
def cancel(job_id: str) -> None:
    """Cancel a job (yours, or one in an allocation you manage); a job array's id cancels
    every element that has not ended, ARRAY_N element N alone."""
    with _rpc() as conn:
        request = js.CancelJobRequest(job_id=job_id)
        reply = conn.call(conn.admission, _jobs(conn).CancelJob, request)
        if reply.cancelled:
            _array_steered("cancel requested for", job_id, reply.cancelled)
        else:
            console.print(f"cancel requested for {job_id}")


@app.command()
def hold(job_id: str) -> None:
    """Hold a waiting job back: it does not start until released; a job array's id holds
    every element that waits."""
    with _rpc() as conn:
        reply = conn.call(conn.admission, _jobs(conn).HoldJob, js.HoldJobRequest(job_id=job_id))
        if reply.held:
            _array_steered("held", job_id, reply.held)
        console.print(f"{job_id} held: it starts once released (qm release {job_id})")


@app.command()
def update(
    job_id: str,
    gpus: Annotated[int | None, typer.Option(min=1, max=UINT32_MAX, help="GPUs")] = None,
    gpu_type: Annotated[str | None, typer.Option(help="e.g. H100; empty for any")] = None,
    allocation: Annotated[str | None, typer.Option(help="Budget leaf to charge")] = None,
    min_runtime: Annotated[
        float | None, duration("unchanged", "Contract: protected runtime, e.g. 30m")
    ] = None,
    estimate: Annotated[
        float | None, duration("unchanged", "Expected run time, e.g. 2h, for planning only")
    ] = None,
    resumable: Annotated[
        bool | None, typer.Option(help="Requeue instead of failing on preemption")
    ] = None,
    priority: Annotated[
        int | None, typer.Option(min=INT32[0], max=INT32[1], help="Order within your allocation")
    ] = None,
) -> None:
    """Change a waiting job: only the flags given; it keeps its place in line."""
    spec = types_pb2.JobSpec()
    changed: list[str] = []
    for field, value in (("gpus", gpus), ("gpu_type", gpu_type), ("allocation", allocation),
                         ("resumable", resumable), ("priority", priority)):  # fmt: skip
        if value is not None:
            setattr(spec, field, value)
            changed.append(field)
    for field, seconds in (("min_runtime", min_runtime), ("runtime_estimate", estimate)):
        if seconds is not None:
            getattr(spec, field).CopyFrom(wire_time.duration(seconds))
            changed.append(field)
    if not changed:
        raise typer.BadParameter("name at least one thing to change (see qm update --help)")
    request = js.UpdateJobRequest(job_id=job_id, spec=spec)
    request.update_mask.paths.extend(changed)
    with _rpc() as conn:
        job = conn.call(conn.admission, _jobs(conn).UpdateJob, request).job
        console.print(f"{job_id} updated ({', '.join(changed)}):")
        console.print(render.job_detail(job))


@app.command()
def release(job_id: str) -> None:
    """Release a held job into its old place in line; a job array's id releases every
    element that is held."""
    with _rpc() as conn:
        request = js.ReleaseJobRequest(job_id=job_id)
        reply = conn.call(conn.admission, _jobs(conn).ReleaseJob, request)
        if reply.released:
            _array_steered("released", job_id, reply.released)
            return
        console.print(f"{job_id} released")


def _array_steered(done: str, array_id: str, elements: Sequence[str]) -> None:
    """Which of an array's elements a cancel, hold or release was recorded for."""
    word = render.elements_word(len(elements))
    line = f"{done} {len(elements)} {word} of {array_id}: {' '.join(elements)}"
    console.print(line, highlight=False)


@app.command()
def why(job_id: str, output: OutputFlag = Format.TABLE) -> None:
    """Why a job is waiting (or what it is doing).

    -o json|yaml: a qm.v1.Explanation (job_id, state, reason, allocation, rank, ranks,
    fair_share_ratio, jobs_ahead).
    """
    with _rpc() as conn:
        request = js.ExplainJobRequest(job_id=job_id)
        answer = conn.call(conn.admission, _jobs(conn).ExplainJob, request)
        emit(console, output, lambda: message(answer), lambda: render.explanation(answer))


def _cluster(conn: Connection) -> cluster_service_pb2_grpc.ClusterServiceStub:
    return cluster_service_pb2_grpc.ClusterServiceStub(conn.admission.channel())


@node_app.command("cordon")
def node_cordon(node_id: str) -> None:
    """Place nothing new on a node; what runs there runs on."""
    with _rpc() as conn:
        request = cluster_service_pb2.CordonNodeRequest(node_id=node_id)
        conn.call(conn.admission, _cluster(conn).CordonNode, request)
        console.print(
            f"{node_id} cordoned: nothing new is placed there (qm node uncordon {node_id})"
        )


@node_app.command("drain")
def node_drain(
    node_id: str,
    wait: Annotated[
        bool, typer.Option(help="Wait until nothing runs there (Ctrl-C stops waiting only)")
    ] = True,
) -> None:
    """Cordon a node and stop what runs there; stopped jobs are requeued to run elsewhere
    (a job that cannot resume starts over)."""
    with _rpc() as conn:
        request = cluster_service_pb2.CordonNodeRequest(node_id=node_id, drain=True)
        node = conn.call(conn.admission, _cluster(conn).CordonNode, request).node
        console.print(f"{node_id} draining: {len(node.running)} task(s) asked to stop")
        if wait:
            _until_empty(conn, node_id, len(node.running))
            console.print(f"{node_id} drained: nothing runs there")


def _until_empty(conn: Connection, node_id: str, tasks: int) -> None:
    """Poll the node until it runs nothing, with a progress bar on a terminal."""
    listing = cluster_service_pb2.ListNodesRequest()
    stopped = 0
    with counting(console, f"tasks stopped on {node_id}", tasks) as advance:
        while True:
            nodes = conn.call(conn.admission, _cluster(conn).ListNodes, listing).nodes
            node = next((n for n in nodes if n.inventory.node_id == node_id), None)
            running = len(node.running) if node is not None else 0
            if tasks - running > stopped:
                advance(tasks - running - stopped)
                stopped = tasks - running
            if not running:
                return
            time.sleep(1)


@node_app.command("uncordon")
def node_uncordon(node_id: str) -> None:
    """Give a cordoned node back to scheduling."""
    with _rpc() as conn:
        request = cluster_service_pb2.UncordonNodeRequest(node_id=node_id)
        conn.call(conn.admission, _cluster(conn).UncordonNode, request)
        console.print(f"{node_id} uncordoned")


@node_app.command("pending")
def node_pending(
    cluster: Annotated[str, typer.Option(help="Only this cluster")] = "",
    output: OutputFlag = Format.TABLE,
) -> None:
    """List the nodes whose agents offered a key no operator has approved: their events
    are refused until one is (qm node approve). Compare FINGERPRINT with what
    `python -m services.node_agent --show-keys` prints on the node; "replaces an approved
    key" marks a node that had a key approved before (a reinstalled node, a revoked one,
    or a forgery).

    -o json|yaml: {"nodes": [qm.v1.PendingNode, ...]} (node_id, cluster, fingerprint,
    offered_at, replaces_key), by cluster, then node id.
    """
    with _rpc() as conn:
        request = cluster_service_pb2.ListPendingNodesRequest(cluster=cluster)
        reply = conn.call(conn.admission, _cluster(conn).ListPendingNodes, request)
        emit(
            console,
            output,
            lambda: message(reply),
            lambda: render.pending_nodes_table(list(reply.nodes), time.time()),
        )


@node_app.command("approve")
def node_approve(
    node_id: str,
    fingerprint: Annotated[
        str,
        typer.Option(
            help="The key's fingerprint as the node prints it (python -m "
            "services.node_agent --show-keys): refused if the node offers another"
        ),
    ] = "",
    cluster: Annotated[
        str, typer.Option(help="The node's cluster (needed where it is pending in several)")
    ] = "",
) -> None:
    """Trust the key a pending node offered (qm node pending): its events are refused
    until then."""
    with _rpc() as conn:
        request = cluster_service_pb2.ApproveNodeRequest(
            node_id=node_id, fingerprint=fingerprint, cluster=cluster
        )
        node = conn.call(conn.admission, _cluster(conn).ApproveNode, request).node
        console.print(
            f"approved node {node.node_id} (key {node.fingerprint}): "
            "its events are trusted from now on",
            highlight=False,
        )


@node_app.command("revoke")
def node_revoke(
    node_id: str,
    cluster: Annotated[
        str, typer.Option(help="The node's cluster (needed where it is approved in several)")
    ] = "",
) -> None:
    """Stop trusting a node's key: its events are refused and it is lost (what ran there
    is requeued). It shows in qm node pending again once its agent offers a key anew."""
    with _rpc() as conn:
        request = cluster_service_pb2.RevokeNodeRequest(node_id=node_id, cluster=cluster)
        reply = conn.call(conn.admission, _cluster(conn).RevokeNode, request)
        console.print(
            f"revoked node {reply.node_id}: its events are refused from now on, and it is lost",
            highlight=False,
        )


@app.command()
def nodes(
    cluster: Annotated[str, typer.Option(help="Only this cluster")] = "",
    output: OutputFlag = Format.TABLE,
) -> None:
    """List nodes with their free GPUs and running jobs.

    -o json|yaml: {"nodes": [qm.v1.Node, ...]}, by node id.
    """
    with _rpc() as conn:
        stub = _cluster(conn)
        request = cluster_service_pb2.ListNodesRequest(cluster=cluster)
        reply = conn.call(conn.admission, stub.ListNodes, request)
        emit(console, output, lambda: message(reply), lambda: render.nodes_table(list(reply.nodes)))


@budget_app.command("tree")
def budget_tree(output: OutputFlag = Format.TABLE) -> None:
    """The budget tree with entitlements and charged GPU-hours.

    -o json|yaml: {"tree": qm.v1.BudgetTree, "balances": qm.v1.Balances}; a leaf's
    balance has its entitlement (a fraction) and the GPU-seconds charged in the window.
    """
    with _rpc() as conn:
        stub = _budget(conn)
        tree = conn.call(conn.budget, stub.GetTree, budget_service_pb2.GetTreeRequest()).tree
        balances = conn.call(conn.budget, stub.GetBalances, budget_service_pb2.GetBalancesRequest())
        emit(
            console,
            output,
            lambda: {"tree": message(tree), "balances": message(balances)},
            lambda: render.tree_table(tree, balances),
        )


@budget_app.command("usage")
def budget_usage(output: OutputFlag = Format.TABLE) -> None:
    """Owed against delivered GPU-hours of each allocation you may see, over the lookback
    window (the console's figures; members see their allocations, managers their subtree,
    operators and the root's managers all).

    Owed: at every moment, an allocation is owed the smaller of its entitlement times the
    GPUs of the nodes not lost, and the GPUs its charged work holds plus those its
    charged waiting jobs ask for (a job no node could fit asks for nothing). Delivered:
    the GPUs its charged (allocated: minimum runtime > 0) work held; free (unallocated)
    work is delivered too but owed to nobody, shown apart. DELIVERED/OWED is the share
    of owed delivered ("-": nothing was owed); the table's caption gives the target
    (target_pct) and the headline: the worst team among those owed at least 0.1% of the
    cluster's GPU-hours, Σ min(delivered, owed) ÷ Σ owed over every team, and the teams
    under that floor apart (marked "small team").

    -o json|yaml: a qm.v1.GetUsageResponse: {"window", "covered", "as_of", "target_pct",
    "allocations": [{"allocation", "entitlement", "owed_gpu_hours",
    "allocated_gpu_hours", "unallocated_gpu_hours", "delivered_pct", "small"}],
    "headline": {"owed_delivered_min_pct", "owed_delivered_weighted_pct",
    "owed_small_teams": {"count", "owed_pct", "min_pct"}}}; a percentage is absent when
    nothing was owed.
    """
    with _rpc() as conn:
        stub = _budget(conn)
        usage = conn.call(conn.budget, stub.GetUsage, budget_service_pb2.GetUsageRequest())
        emit(console, output, lambda: message(usage), lambda: render.usage_table(usage))


@budget_app.command("set")
def budget_set(
    name: str,
    parent: Annotated[
        str | None, typer.Option(help="Parent node (a new node needs one, unless root)")
    ] = None,
    weight: Annotated[
        float | None, number("Share among siblings (new: 1)", least=1e-6, most=1e9)
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
    """Add a node to the budget tree, or change what you name of one (managers only).

    Prints what changed, field by field (weight: 1 -> 2, members: +bob); a change to
    what the node already is changes nothing ("no change"), and the tree keeps its version.
    """
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
        before = next((n for n in current.nodes if n.name == name), None)
        request = budget_service_pb2.SetAllocationRequest(
            node=edited_node(before, name, edit), expected_version=current.version
        )
        tree = conn.call(conn.budget, stub.SetAllocation, request).tree
    after = next(n for n in tree.nodes if n.name == name)
    if tree.version == current.version:
        console.print(f"no change: {name} is already so (budget tree version {tree.version})")
        return
    verb = "added" if before is None else "changed"
    console.print(f"{verb} {name}; budget tree version {current.version} -> {tree.version}")
    for line in changes(before, after):
        console.print(f"  {line}", highlight=False, markup=False)


def main() -> None:
    app(prog_name="qm")


if __name__ == "__main__":
    main()

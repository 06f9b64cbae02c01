"""The rules a job spec and a node must keep. Each violation names the field and the rule.

Two layers: the protocol's limits (``libs.core.limits``), which the scheduler enforces
on everything it reads, and a site's narrower ``Limits``, which admission adds.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from libs.core import limits as L
from libs.core import simulated
from libs.core.compass.workflow import Task, Workflow, WorkflowError, build_workflow
from libs.core.decisions import WARNING_SIGNALS, Reject
from libs.core.ids import JobId
from libs.core.model import JobSpec, NodeKind, NodeSpec

HOUR = 3600


@dataclass(frozen=True)
class Limits:
    """A site's limits, within the protocol's."""

    max_gpus: int = 64
    max_min_runtime_s: int = 8 * HOUR
    # GPU types accepted before any node of them registers (an operator's word that
    # such nodes are coming); the types the cluster's nodes offer are accepted anyway.
    gpu_types: frozenset[str] = frozenset()
    # The largest GPU a workflow's model may need, in MB (10^6 bytes); inf: unknown,
    # any size is accepted (a model too large for every GPU then waits for one).
    gpu_memory_mb: float = math.inf
    # Every node the cluster has registered, now or ever (lost ones too), as the core
    # sees them: a job none of them can take is refused, not left waiting forever.
    # Empty: unknown (no node yet, or no view of them), nothing is refused for it.
    nodes: tuple[NodeSpec, ...] = ()


@dataclass(frozen=True)
class Violation:
    field: str
    rule: str

    def __str__(self) -> str:
        return f"{self.field}: {self.rule}"


def validate_job(
    spec: JobSpec, limits: Limits | None = None, allocations: Collection[str] | None = None
) -> list[Violation]:
    """All the ways ``spec`` breaks the rules; empty when it is valid.

    Without ``limits`` only the protocol's rules apply: what the scheduler checks.
    ``allocations`` (the budget tree's leaves) also checks the allocation exists;
    membership is a permission question, checked by the caller. A workflow is judged
    as submitted (``spec_from_proto(..., workflow_as_given=True)``): its tasks in any
    order, checked here as a DAG; the first broken rule is reported, its field naming
    the task.
    """
    found = _ids(spec, allocations)
    found += _gpus(spec, limits)
    if limits is not None:
        found += _site(spec, limits)
    found += _command(spec, required=limits is not None)
    found += _env(spec.env)
    found += _secrets(spec)
    found += _numbers(spec)
    found += _after(spec)
    found += _container(spec)
    if spec.workflow is not None:
        memory_mb = limits.gpu_memory_mb if limits is not None else math.inf
        found += _workflow_violations(spec.workflow, memory_mb)
    return found


def rejection(job_id: JobId, spec: JobSpec) -> Reject | None:
    """How every policy answers a job that breaks the protocol's rules; None: it is valid."""
    violations = validate_job(spec)
    if not 0 < len(job_id) <= L.MAX_NAME_CHARS:
        violations.insert(0, Violation("job_id", f"must be 1 to {L.MAX_NAME_CHARS} characters"))
    if not violations:
        return None
    return Reject(JobId(job_id[: L.MAX_NAME_CHARS]), violations[0].field, joined(violations))


def joined(violations: list[Violation]) -> str:
    """Every rule broken, for people."""
    return "; ".join(str(v) for v in violations)


def validate_node(node: NodeSpec) -> list[Violation]:
    """The ways a node's registration breaks the protocol's rules."""
    found: list[Violation] = []
    if not node.node_id or len(node.node_id) > L.MAX_NAME_CHARS:
        found.append(Violation("node_id", f"must be 1 to {L.MAX_NAME_CHARS} characters"))
    if len(node.gpu_type) > L.MAX_TEXT_CHARS:
        found.append(Violation("gpu_type", f"must be at most {L.MAX_TEXT_CHARS} characters"))
    if len(node.address) > L.MAX_ADDRESS_CHARS or any(c.isspace() for c in node.address):
        found.append(
            Violation("address", f"a host name or IP: at most {L.MAX_ADDRESS_CHARS} characters")
        )
    indices = node.gpu_indices
    if not 1 <= len(indices) <= L.MAX_NODE_GPUS:
        found.append(
            Violation("gpus", f"a node has 1 to {L.MAX_NODE_GPUS} GPUs, got {len(indices)}")
        )
    elif len(set(indices)) != len(indices) or not all(0 <= i <= L.MAX_GPU_INDEX for i in indices):
        found.append(Violation("gpus", f"indices must be distinct, 0 to {L.MAX_GPU_INDEX}"))
    if not 0 <= node.gpu_memory_gib <= L.MAX_GPU_MEMORY_GIB:
        found.append(
            Violation("gpus.memory", f"must be between 0 and {L.MAX_GPU_MEMORY_GIB:g} GiB")
        )
    return found


def _site(spec: JobSpec, limits: Limits) -> list[Violation]:
    """A site's own rules: what its nodes offer and its cap on the contract."""
    found = _unoffered(spec, limits.nodes, limits.gpu_types)
    if not 0 <= spec.min_runtime_s <= limits.max_min_runtime_s:
        found.append(
            Violation(
                "min_runtime",
                f"must be between 0 and {limits.max_min_runtime_s} s "
                f"({limits.max_min_runtime_s / HOUR:g} h), got {spec.min_runtime_s}",
            )
        )
    return found


def _unoffered(
    spec: JobSpec, nodes: Collection[NodeSpec], allowed: frozenset[str]
) -> list[Violation]:
    """A GPU type, or a memory size, that no registered node offers the job (by what the
    nodes run: ``JobSpec.node_kinds``), naming what they do offer. ``allowed`` types are
    accepted whatever has registered."""
    if not nodes or spec.gpu_type in allowed:
        return []
    takes = [n for n in nodes if n.kind in spec.node_kinds]
    typed = [n for n in takes if spec.wants_type(n.gpu_type)]
    if not typed:
        nodes_of = f"{spec.gpu_type} node" if spec.gpu_type else "node"
        rule = f"no {nodes_of} here takes {_work(spec)}"
        return [Violation("gpu_type", f"{rule}; {offered(nodes, allowed)}")]
    largest = max(n.gpu_memory_gib for n in typed)
    if spec.min_gpu_memory_gib > largest:
        rule = f"no node here has {spec.min_gpu_memory_gib:g} GiB per GPU for {_work(spec)}"
        return [Violation("min_gpu_memory_gib", f"{rule}; {offered(nodes, allowed)}")]
    return []


def _work(spec: JobSpec) -> str:
    if spec.workflow is not None:
        return "workflow tasks"
    return "a job's command" if NodeKind.SIMULATED not in spec.node_kinds else "batch jobs"


def offered(nodes: Iterable[NodeSpec], allowed: Collection[str] = ()) -> str:
    """What the nodes offer, for people: each GPU type with its memory and GPUs, and
    what its nodes take when that is not every job."""
    gpus: dict[tuple[str, float, NodeKind], int] = {}
    for node in nodes:
        key = (node.gpu_type, node.gpu_memory_gib, node.kind)
        gpus[key] = gpus.get(key, 0) + node.gpu_count
    notes = {NodeKind.SIMULATED: ", simulated", NodeKind.SERVING: ", workflows only"}
    types = [
        f"{gpu_type} ({memory:g} GiB, {count} GPUs{notes.get(kind, '')})"
        for (gpu_type, memory, kind), count in sorted(gpus.items(), key=lambda i: i[0][:2])
    ]
    types += [f"{gpu_type} (no node yet)" for gpu_type in sorted(allowed)]
    return "GPU types here: " + ", ".join(types)


def _ids(spec: JobSpec, allocations: Collection[str] | None) -> list[Violation]:
    found: list[Violation] = []
    if not spec.allocation:
        found.append(Violation("allocation", "is required"))
    elif allocations is not None and spec.allocation not in allocations:
        known = ", ".join(sorted(allocations)) or "none"
        found.append(
            Violation("allocation", f"unknown allocation {spec.allocation!r}; known: {known}")
        )
    if not spec.user:
        found.append(Violation("user", "is required"))
    for name in ("allocation", "user", "gpu_type", "cluster", "client_request_id"):
        if len(getattr(spec, name)) > L.MAX_TEXT_CHARS:
            found.append(Violation(name, f"must be at most {L.MAX_TEXT_CHARS} characters"))
    return found


def _gpus(spec: JobSpec, limits: Limits | None) -> list[Violation]:
    if spec.workflow is not None:
        if spec.nodes > 1:
            return [Violation("nodes", "a workflow's tasks each run on one GPU of one node")]
        if spec.gpus == 1:
            return []
        rule = f"must be 1 for a workflow (each task runs on one GPU), got {spec.gpus}"
        return [Violation("gpus", rule)]
    if spec.gpus < 1:
        return [
            Violation(
                "gpus",
                f"must be at least 1, got {spec.gpus}: Quartermaster schedules GPU work; "
                "run CPU-only jobs elsewhere",
            )
        ]
    most = min(limits.max_gpus, L.MAX_GPUS) if limits is not None else L.MAX_GPUS
    if spec.gpus > most:
        return [Violation("gpus", f"must be between 1 and {most}, got {spec.gpus}")]
    if not 0 <= spec.nodes <= L.MAX_GANG_NODES:
        return [Violation("nodes", f"must be between 1 and {L.MAX_GANG_NODES}, got {spec.nodes}")]
    if spec.nodes > 1 and spec.gpus % spec.nodes:
        return [
            Violation(
                "nodes",
                f"{spec.gpus} GPUs do not split into {spec.nodes} equal parts: gpus is "
                "nodes × GPUs per node",
            )
        ]
    return []


def _container(spec: JobSpec) -> list[Violation]:
    """Where and how it runs: the image reference, volumes and working directory (the
    node agent checks what it alone knows: the image's registry, the declared volumes)."""
    found: list[Violation] = []
    if len(spec.image) > L.MAX_IMAGE_CHARS or not spec.image.isprintable() or " " in spec.image:
        found.append(Violation("image", f"a reference of at most {L.MAX_IMAGE_CHARS} characters"))
    if spec.mounts and not spec.image:
        found.append(Violation("mounts", "only a job in an image (--image) mounts volumes"))
    if len(spec.mounts) > L.MAX_MOUNTS:
        found.append(Violation("mounts", f"at most {L.MAX_MOUNTS}, got {len(spec.mounts)}"))
    for volume, path in spec.mounts:
        if not 0 < len(volume) <= L.MAX_NAME_CHARS or not _absolute(path):
            found.append(Violation("mounts", "each is VOLUME:/absolute/path"))
            break
    if spec.workdir and not _absolute(spec.workdir):
        found.append(Violation("workdir", "an absolute path"))
    return found


def _absolute(path: str) -> bool:
    return path.startswith("/") and len(path) <= L.MAX_PATH_CHARS and "\0" not in path


def _after(spec: JobSpec) -> list[Violation]:
    if spec.after and spec.workflow is not None:
        return [Violation("after", "a workflow cannot wait for other jobs (yet)")]
    if len(spec.after) > L.MAX_DEPENDENCIES:
        return [Violation("after", f"at most {L.MAX_DEPENDENCIES} jobs, got {len(spec.after)}")]
    for dependency in spec.after:
        if not 0 < len(dependency.job_id) <= L.MAX_NAME_CHARS:
            return [Violation("after", f"a job id is 1 to {L.MAX_NAME_CHARS} characters")]
    return []


def _command(spec: JobSpec, *, required: bool) -> list[Violation]:
    """A batch job's command is the site's requirement: the scheduler needs none (a
    simulated node runs nothing, and a process node fails a job without one)."""
    argv = spec.command
    if required and spec.workflow is None and (not argv or not argv[0]):
        return [Violation("command", "is required (the program and its arguments)")]
    # Optional for a workflow: a simulated node runs its tasks without one; on a
    # process node every task runs it (and fails at once without one).
    if argv and not argv[0]:
        return [Violation("command", "the program must not be empty")]
    if len(argv) > L.MAX_COMMAND_ARGS:
        return [Violation("command", f"at most {L.MAX_COMMAND_ARGS} arguments, got {len(argv)}")]
    size = _utf8(argv)
    if size > L.MAX_COMMAND_BYTES:
        return [Violation("command", f"at most {L.MAX_COMMAND_BYTES} bytes, got {size}")]
    if any("\0" in arg for arg in argv):
        return [Violation("command", "an argument holds a NUL character")]
    return []


def _env(env: tuple[tuple[str, str], ...]) -> list[Violation]:
    if len(env) > L.MAX_ENV_VARS:
        return [Violation("env", f"at most {L.MAX_ENV_VARS} variables, got {len(env)}")]
    size = _utf8(part for pair in env for part in pair)
    if size > L.MAX_ENV_BYTES:
        return [Violation("env", f"at most {L.MAX_ENV_BYTES} bytes, got {size}")]
    for key, value in env:
        if not key or "=" in key or "\0" in key or "\0" in value:
            return [
                Violation(f"env[{key[: L.MAX_NAME_CHARS]}]", "names a variable without = or NUL")
            ]
    unread = simulated.unread_entries(dict(env))
    return [Violation(f"env[{key}]", must) for key, must in sorted(unread.items())]


# A secret becomes the variable of its name in the task's environment.
_SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def _secrets(spec: JobSpec) -> list[Violation]:
    if len(spec.secrets) > L.MAX_SECRETS:
        return [Violation("secrets", f"at most {L.MAX_SECRETS} names, got {len(spec.secrets)}")]
    set_in_env = {key for key, _ in spec.env}
    for name in spec.secrets:
        where = f"secrets[{name[: L.MAX_NAME_CHARS]}]"
        if not _SECRET_NAME.fullmatch(name):
            return [Violation(where, "a name of letters, digits and _ (not first a digit)")]
        if name in set_in_env:
            return [Violation(where, "is also in env: a secret's value comes from the store")]
    return []


def _numbers(spec: JobSpec) -> list[Violation]:
    """Finite and in range; a NaN fails every comparison, so each rule is written to pass."""
    found: list[Violation] = []
    if not 0 <= spec.simulated_duration_s <= L.MAX_SIMULATED_DURATION_S:
        found.append(
            Violation(
                f"env[{simulated.SECONDS}]",
                f"must be between 0 and {L.MAX_SIMULATED_DURATION_S} s",
            )
        )
    if not 0 <= spec.runtime_estimate_s <= L.MAX_RUNTIME_ESTIMATE_S:
        found.append(
            Violation("runtime_estimate", f"must be between 0 and {L.MAX_RUNTIME_ESTIMATE_S} s")
        )
    if spec.warning_signal and spec.warning_signal not in WARNING_SIGNALS:
        signals = ", ".join(sorted(WARNING_SIGNALS))
        found.append(Violation("stop_warning.signal", f"one of {signals}, without SIG"))
    if bool(spec.warning_signal) != (spec.warning_s > 0) or spec.warning_s > L.MAX_TIME_LIMIT_S:
        found.append(
            Violation(
                "stop_warning.before", "a signal and a time before the stop, > 0 s, go together"
            )
        )
    if not 0 <= spec.time_limit_s <= L.MAX_TIME_LIMIT_S:
        found.append(Violation("time_limit", f"must be between 0 and {L.MAX_TIME_LIMIT_S} s"))
    if not 0.0 <= spec.simulated_utilization <= 1.0:
        found.append(Violation(f"env[{simulated.UTILIZATION}]", "must be between 0 and 1"))
    if not 0 <= spec.min_gpu_memory_gib <= L.MAX_GPU_MEMORY_GIB:
        found.append(
            Violation("min_gpu_memory_gib", f"must be between 0 and {L.MAX_GPU_MEMORY_GIB:g}")
        )
    return found


def _workflow_violations(workflow: Workflow, gpu_memory_mb: float) -> list[Violation]:
    """The first broken rule of a workflow, its field naming the task.

    ``workflow`` is taken as submitted: its tasks in any order, nothing checked yet.
    """
    if not workflow.name:
        return [Violation("workflow.name", "is required")]
    if len(workflow.name) > L.MAX_TEXT_CHARS:
        return [Violation("workflow.name", f"must be at most {L.MAX_TEXT_CHARS} characters")]
    tasks = workflow.tasks
    if len(tasks) > L.MAX_WORKFLOW_TASKS:
        rule = f"at most {L.MAX_WORKFLOW_TASKS} tasks, got {len(tasks)}"
        return [Violation("workflow.tasks", rule)]
    edges = sum(len(t.parents) for t in tasks)
    if edges > L.MAX_WORKFLOW_EDGES:
        rule = f"at most {L.MAX_WORKFLOW_EDGES} parent links in all, got {edges}"
        return [Violation("workflow.tasks", rule)]
    for task in tasks:
        if broken := _task_rule(task):
            return [Violation(_task_field(task.task_id), broken)]
    try:
        build_workflow(workflow.name, tasks, gpu_memory_mb)
    except WorkflowError as exc:
        return [_violation(workflow, str(exc))]
    return []


_TASK_MAXIMA = (
    ("model_mb", L.MAX_MODEL_MB),
    ("run_ms", L.MAX_RUN_MS),
    ("in_kb", L.MAX_TRANSFER_KB),
    ("out_kb", L.MAX_TRANSFER_KB),
)


def _task_rule(task: Task) -> str:
    """The first size rule a task breaks (its DAG rules are build_workflow's); empty: none."""
    for name, most in _TASK_MAXIMA:
        value = getattr(task, name)
        if not math.isfinite(value):
            return f"{name} must be a finite number"
        if value > most:
            return f"{name} must be at most {most:g}"
    if len(task.task_id) > L.MAX_NAME_CHARS or any(len(p) > L.MAX_NAME_CHARS for p in task.parents):
        return f"task ids must be at most {L.MAX_NAME_CHARS} characters"
    if len(task.model) > L.MAX_TEXT_CHARS:
        return f"model must be at most {L.MAX_TEXT_CHARS} characters"
    return ""


def _violation(workflow: Workflow, message: str) -> Violation:
    """``WorkflowError`` text is "<workflow>/<task>: <rule>" or "<workflow>: <rule>"."""
    located = message.removeprefix(f"{workflow.name}/")
    if located != message:
        # The longest task id that fits: ids may themselves hold "/" or ": ".
        ids = sorted({t.task_id for t in workflow.tasks if t.task_id}, key=len, reverse=True)
        for task_id in ids:
            if located.startswith(f"{task_id}: "):
                return Violation(_task_field(task_id), located.removeprefix(f"{task_id}: "))
    return Violation("workflow.tasks", message.removeprefix(f"{workflow.name}: "))


def _task_field(task_id: str) -> str:
    return f"workflow.tasks[{task_id[: L.MAX_NAME_CHARS]}]"


def _utf8(parts: Iterable[str]) -> int:
    return sum(len(part.encode("utf-8", "surrogatepass")) for part in parts)

"""What the core knows of jobs and nodes: frozen values converted once at the edge."""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from libs.core.compass.workflow import Workflow
from libs.core.ids import NodeId

DEBUG_MAX_GPUS = 2
DEBUG_MAX_MIN_RUNTIME_S = 15 * 60


class WorkClass(enum.Enum):
    """How the contract classes a job; the simulator reports waits per class."""

    DEBUG = "debug"  # few GPUs, short protected runtime: the fast path
    ALLOCATED = "allocated"  # minimum runtime > 0: charged and protected
    UNALLOCATED = "unallocated"  # minimum runtime 0: free, preemptible, fills idle GPUs

    # Enum's own hash hashes the member's name on every call, and every pass looks tiers
    # up in dicts dozens of times; members are singletons, so identity hashes as well.
    __hash__ = object.__hash__


class NodeKind(enum.Enum):
    """What a node runs, and so which jobs it takes: a job's command runs only where
    processes run, so that nothing reports success it did not have."""

    PROCESS = "process"  # the job's command, as processes: any job
    SIMULATED = "simulated"  # nothing (it times the run): simulated batch jobs, workflows
    SERVING = "serving"  # workflow tasks only, whatever runs them

    __hash__ = object.__hash__  # as WorkClass: looked up on every fit


_ANY_KIND = frozenset(NodeKind)
_BATCH_KINDS = frozenset({NodeKind.PROCESS, NodeKind.SIMULATED})
_PROCESS_ONLY = frozenset({NodeKind.PROCESS})


@dataclass(frozen=True)
class Dependency:
    """A job that another waits for (``qm submit --after JOB[:ok|:any]``)."""

    job_id: str
    any_end: bool = False  # True: however it ends; False: it must finish with exit 0

    def __str__(self) -> str:
        return f"{self.job_id}:{'any' if self.any_end else 'ok'}"


@dataclass(frozen=True)
class JobSpec:
    allocation: str
    user: str
    gpus: int
    command: tuple[str, ...]
    gpu_type: str = ""
    min_runtime_s: int = 0
    resumable: bool = False
    priority: int = 0
    client_request_id: str = ""
    cluster: str = "default"
    env: tuple[tuple[str, str], ...] = ()
    simulated_duration_s: float = 0.0
    simulated_exit_code: int = 0
    min_gpu_memory_gib: float = 0.0
    simulated_utilization: float = 0.0
    # How long the job is expected to run, in seconds (0: none given): the user's or
    # the trace's requested limit, for planning only, never for charging.
    runtime_estimate_s: float = 0.0
    # Set: a DAG of model-serving tasks, each on one GPU, planned by the
    # serving planner (libs.core.compass) instead of the batch tiers.
    workflow: Workflow | None = None
    # Names of the submitter's secrets, resolved by the node agent (values never here).
    # Not a scheduling fact: left out of ``fact`` (the repr), so that logs recorded before
    # the field existed replay to the same state digests.
    secrets: tuple[str, ...] = field(default=(), repr=False)
    # Wall-time limit from its start, whole seconds (0: none): then it is stopped, TIMEOUT.
    time_limit_s: int = 0
    # Jobs it waits for: it is not placed until each has ended as asked.
    after: tuple[Dependency, ...] = ()
    # Nodes it spans as equal parts of ``gpus // nodes`` GPUs (0 or 1: one node, or a
    # trace's job larger than any node on whole nodes).
    nodes: int = 0
    # A signal its node agent sends ``warning_s`` before SIGTERM when it is preempted,
    # drained or reaches its time limit ("": none), so it can save a checkpoint.
    warning_signal: str = ""
    warning_s: int = 0
    # How its node agent runs it, not scheduling facts (left out of ``fact``, as
    # ``secrets``): an OCI image ("": a process), declared volumes to mount in it as
    # (volume, path), its working directory ("": its home or scratch folder), and
    # which element of a job array it is.
    image: str = field(default="", repr=False)
    mounts: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    workdir: str = field(default="", repr=False)
    # (index, count): its node agent tells it (QM_ARRAY_INDEX, QM_ARRAY_COUNT).
    array: tuple[int, int] | None = field(default=None, repr=False)

    # Cached (the fields are frozen): planning asks these of every running job.
    @cached_property
    def allocated(self) -> bool:
        return self.min_runtime_s > 0 or self.workflow is not None

    @cached_property
    def fact(self) -> str:
        """Every field, hashed once per spec: how the state digest counts a job's spec
        (a waiting or running job's fact is written out many times)."""
        return hashlib.blake2b(repr(self).encode(), digest_size=16).hexdigest()

    @cached_property
    def parts(self) -> int:
        """How many equal parts it runs as when it names its nodes (1 otherwise)."""
        return self.nodes if self.nodes > 1 else 1

    @cached_property
    def block(self) -> int:
        """The GPUs it needs free on one node: a part's, or all of them (a job larger
        than any node takes whole nodes instead; ``capacity.fit``)."""
        return self.gpus // self.parts

    def wants_type(self, gpu_type: str) -> bool:
        """Whether GPUs of ``gpu_type`` are of the type it asks for (any, when it names none)."""
        return not self.gpu_type or gpu_type == self.gpu_type

    def may_use(self, gpu_type: str, memory_gib: float, kind: NodeKind) -> bool:
        """Whether a node of GPUs of ``gpu_type`` and ``memory_gib`` each, running
        ``kind``, may take it: the one rule placement and admission judge nodes by."""
        return (
            self.wants_type(gpu_type)
            and memory_gib >= self.min_gpu_memory_gib
            and kind in self.node_kinds
        )

    @cached_property
    def simulated(self) -> bool:
        """It asks a simulated node for a run (``QM_SIMULATED_SECONDS`` or ``_EXIT``): no
        command of it runs. The utilisation alone asks for none: it only says what a
        simulated run reports."""
        return bool(self.simulated_duration_s or self.simulated_exit_code)

    @cached_property
    def node_kinds(self) -> frozenset[NodeKind]:
        """The nodes that may take it: a workflow's tasks any; a batch job whose command
        must really run only process nodes; one that asks for a simulated run (or has no
        command to run) process or simulated nodes, never serving-only ones."""
        if self.workflow is not None:
            return _ANY_KIND
        if self.command and not self.simulated:
            return _PROCESS_ONLY
        return _BATCH_KINDS

    @cached_property
    def work_class(self) -> WorkClass:
        if not self.allocated:
            return WorkClass.UNALLOCATED
        if self.gpus <= DEBUG_MAX_GPUS and self.min_runtime_s <= DEBUG_MAX_MIN_RUNTIME_S:
            return WorkClass.DEBUG
        return WorkClass.ALLOCATED


GIB = 1 << 30


def node_gpu_memory_gib(gpu_memory_bytes: Iterable[int]) -> float:
    """A node's GPU memory, from each of its GPUs': the smallest, since a job asking for
    ``min_gpu_memory_gib`` may be given any of them (0 without GPUs)."""
    return min(gpu_memory_bytes, default=0) / GIB


@dataclass(frozen=True)
class NodeSpec:
    node_id: NodeId
    gpu_type: str
    gpu_indices: tuple[int, ...] = field(default=())
    # What each of its GPUs holds at least (``node_gpu_memory_gib``): the one figure
    # admission, placement and compass judge a job's fit by.
    gpu_memory_gib: float = 0.0
    kind: NodeKind = NodeKind.PROCESS
    # Where other nodes reach it: a multi-node job's parts rendezvous at rank 0's.
    address: str = ""

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_indices)

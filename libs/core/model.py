"""What the core knows of jobs and nodes: frozen values converted once at the edge."""

from __future__ import annotations

import enum
import hashlib
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
    def work_class(self) -> WorkClass:
        if not self.allocated:
            return WorkClass.UNALLOCATED
        if self.gpus <= DEBUG_MAX_GPUS and self.min_runtime_s <= DEBUG_MAX_MIN_RUNTIME_S:
            return WorkClass.DEBUG
        return WorkClass.ALLOCATED


@dataclass(frozen=True)
class NodeSpec:
    node_id: NodeId
    gpu_type: str
    gpu_indices: tuple[int, ...] = field(default=())
    gpu_memory_gib: float = 0.0

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_indices)

"""The scheduler's input: one totally ordered stream of these, each with its time.

Time is ``at`` (seconds since the epoch, from the event's timestamp); the core
never reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.core.budget_tree import BudgetTree
from libs.core.ids import JobId, NodeId, TaskId
from libs.core.model import JobSpec, NodeSpec


@dataclass(frozen=True)
class JobArrived:
    at: float
    job_id: JobId
    spec: JobSpec


@dataclass(frozen=True)
class NodeJoined:
    """A node agent registered a node.

    ``incarnation`` is new each time an agent process starts: a node registered again
    with another one lost the tasks it ran. ``heartbeat_s`` > 0 gives the node a lease:
    it is declared lost once it stops heartbeating (0: never, as simulated nodes).
    ``cache_model``: how its agent's GPU caches make room ("": not stated).
    """

    at: float
    node: NodeSpec
    incarnation: str = ""
    heartbeat_s: float = 0.0
    cache_model: str = ""


@dataclass(frozen=True)
class NodeHeartbeat:
    at: float
    node_id: NodeId
    incarnation: str


@dataclass(frozen=True)
class TaskStarted:
    """The contract's clock starts when the task really starts, not when placed."""

    at: float
    job_id: JobId
    task_id: TaskId
    node_id: NodeId


@dataclass(frozen=True)
class TaskEnded:
    at: float
    job_id: JobId
    task_id: TaskId
    node_id: NodeId
    exit_code: int = 0


@dataclass(frozen=True)
class TaskCheckpointed:
    """A task said it saved a checkpoint (its node agent saw it, at ``at``): from now on
    stopping its job throws away what it did since its last one."""

    at: float
    job_id: JobId
    task_id: TaskId
    node_id: NodeId


@dataclass(frozen=True)
class TaskRefused:
    """A GPU refused a workflow task: it would have kept it waiting ``wait_ms``, past
    the task's ``wait_limit_ms``. The task never queued there."""

    at: float
    job_id: JobId
    task_id: TaskId
    node_id: NodeId
    gpu_index: int
    wait_ms: float


@dataclass(frozen=True)
class TaskIdle:
    """A task's GPUs went idle (``idle``) or busy again, as its node agent measured."""

    at: float
    job_id: JobId
    task_id: TaskId
    idle: bool


@dataclass(frozen=True)
class ModelLoaded:
    """A node agent loaded a model into one GPU's memory (its model cache)."""

    at: float
    node_id: NodeId
    gpu_index: int
    model: str
    size_mb: float


@dataclass(frozen=True)
class ModelEvicted:
    at: float
    node_id: NodeId
    gpu_index: int
    model: str


@dataclass(frozen=True)
class PeerTask:
    """A workflow task of another planner's on one GPU: what it takes there, and when
    it is expected there."""

    task_id: TaskId
    node_id: NodeId
    gpu_index: int
    model: str  # empty: none
    model_mb: float
    run_ms: float
    ready_ms: float  # ms on the input clock; see PeerPlaced and PeerPlanned


@dataclass(frozen=True)
class PeerPlaced:
    """A workflow task another planner sent to a GPU, as this planner reads that
    planner's ``Place`` off the log (late): it counts in the GPU's queue here until
    the task ends (its ``ready_ms``: when its inputs arrive at the GPU). With several
    planners each plans a share of the arrivals, and this, their plans
    (``PeerPlanned``) and arrivals (``PeerArrived``), with the node agents' reports,
    is all they share."""

    at: float
    job_id: JobId
    task: PeerTask


@dataclass(frozen=True)
class PeerPlanned:
    """A workflow another planner planned, as this planner reads that planner's
    ``Planned`` off the log (late): each task not yet sent holds its place in its
    GPU's queue here, as this planner's own planned tasks do, till the peer sends it
    (``PeerPlaced``, perhaps elsewhere). A task's ``ready_ms`` is when the plan has
    the GPU take it: its estimated start less its load."""

    at: float
    job_id: JobId
    tasks: tuple[PeerTask, ...]


@dataclass(frozen=True)
class PeerArrived:
    """A workflow another planner was handed, as this planner reads its arrival off
    the log (late): its work counts in the load here (``compass.load``), as this
    planner's share of it is what it admits."""

    at: float
    job_id: JobId
    gpu_type: str  # "" for any
    work_ms: float  # the GPU run time of its tasks, all together


@dataclass(frozen=True)
class CancelRequested:
    at: float
    job_id: JobId


@dataclass(frozen=True)
class NodeCordoned:
    """An operator took a node out of scheduling (``cordoned``) or gave it back. With
    ``drain`` the work running there is stopped too, and requeued."""

    at: float
    node_id: NodeId
    cordoned: bool
    drain: bool = False
    requested_by: str = ""


@dataclass(frozen=True)
class NodeApproved:
    """An operator approved a node's key: records it signs about itself are trusted."""

    at: float
    node_id: NodeId
    public_key: bytes
    approved_by: str = ""


@dataclass(frozen=True)
class NodeRevoked:
    """An operator revoked a node's key: its records are refused, and the node is lost."""

    at: float
    node_id: NodeId
    revoked_by: str = ""


@dataclass(frozen=True)
class JobHeld:
    """A waiting job is held (it is not started until released) or released."""

    at: float
    job_id: JobId
    held: bool
    requested_by: str = ""


@dataclass(frozen=True)
class JobUpdated:
    """A waiting job's spec changed (its GPUs, allocation, contract ...); it keeps its
    place in line."""

    at: float
    job_id: JobId
    spec: JobSpec
    requested_by: str = ""


@dataclass(frozen=True)
class BudgetSet:
    at: float
    tree: BudgetTree


@dataclass(frozen=True)
class UsageSnapshot:
    """Charged GPU-seconds per allocation over the lookback window ending at ``at``."""

    at: float
    window_s: float
    usage: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Tick:
    at: float


Input = (
    JobArrived
    | NodeJoined
    | NodeHeartbeat
    | TaskStarted
    | TaskEnded
    | TaskCheckpointed
    | TaskRefused
    | TaskIdle
    | ModelLoaded
    | ModelEvicted
    | PeerPlaced
    | PeerPlanned
    | PeerArrived
    | CancelRequested
    | NodeCordoned
    | NodeApproved
    | NodeRevoked
    | JobHeld
    | JobUpdated
    | BudgetSet
    | UsageSnapshot
    | Tick
)

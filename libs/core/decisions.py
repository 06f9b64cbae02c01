"""What the scheduler decides. Each becomes one output event at the service edge."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from libs.core.ids import JobId, NodeId, TaskId
from libs.core.model import JobSpec
from libs.core.wait_reasons import WaitReason


@dataclass(frozen=True)
class ServingTask:
    """What a GPU needs to run one task of a workflow, sent when its inputs are ready."""

    name: str  # the task's id inside its workflow
    model: str
    model_mb: float
    run_ms: float
    input_delay_ms: float  # its inputs' transfer from other nodes
    upcoming: tuple[str, ...]  # models planned next on this GPU, soonest first: look-ahead
    planned: tuple[str, int] | None = None  # (node, GPU) of the plan, when adjusted away
    reason: str = ""  # why it was adjusted
    # The longest the GPU may keep it waiting (its queue and running task ahead of it,
    # as the node agent counts them); longer: it refuses the task (TaskRefused). None:
    # it never refuses.
    wait_limit_ms: float | None = None


class Protection(enum.Enum):
    """How a placed batch job is protected from preemption, decided as it is placed."""

    FREE = "free"  # no minimum runtime: it yields its GPUs whenever charged work needs them
    CONTRACT = "contract"  # charged, within its share: protected for its minimum runtime
    BORROWED = "borrowed"  # charged, beyond its share: a team below its share takes them back


@dataclass(frozen=True)
class GangPart:
    """One part of a job that spans nodes, as every part's task is told of it."""

    node_id: NodeId
    address: str  # its node's (``NodeSpec.address``)
    gpus: int


@dataclass(frozen=True)
class Place:
    """Start one task of a job on one node (a gang spanning nodes is one Place per node).

    A workflow task carries ``serving``: it runs on the one GPU in ``gpu_indices``. A
    batch task carries its job's ``protection``, and for ``CONTRACT`` how long from its
    start (``protected_s``).
    """

    job_id: JobId
    task_id: TaskId
    node_id: NodeId
    gpu_indices: tuple[int, ...]
    spec: JobSpec
    serving: ServingTask | None = None
    # The agent incarnation the node registered with last: an agent ignores placements
    # made for an earlier one, whose tasks the scheduler has already counted as lost.
    node_incarnation: str = ""
    protection: Protection | None = None
    protected_s: float = 0.0
    # A job spanning nodes: every part in rank order, and the port rank 0 listens on
    # for the rendezvous (reserved on its node while the job runs).
    gang: tuple[GangPart, ...] = ()
    master_port: int = 0


@dataclass(frozen=True)
class PlannedTask:
    name: str
    node_id: NodeId
    gpu_index: int
    start_ms: float  # estimated, on the input clock (ms since the epoch)
    finish_ms: float
    load_ms: float  # 0: its model is (or will be) resident


@dataclass(frozen=True)
class Planned:
    """A workflow's plan on arrival: every task's GPU and estimated start."""

    job_id: JobId
    mode: str
    tasks: tuple[PlannedTask, ...]


@dataclass(frozen=True)
class Wait:
    """The job cannot start now, and why (a code with fields); ``reason`` renders it
    in words, for the person who asks why."""

    job_id: JobId
    why: WaitReason

    @property
    def reason(self) -> str:
        return self.why.words()


# The signals a job may ask to be warned with (``JobSpec.warning_signal``, without "SIG").
WARNING_SIGNALS = frozenset({"USR1", "USR2", "INT", "HUP", "QUIT", "TERM"})


class StopCause(enum.Enum):
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    NODE_LOST = "node lost"  # a node of its gang was lost: the gang cannot go on
    DRAINED = "drained"  # an operator drained a node it runs on: it is requeued
    TIME_LIMIT = "time limit"  # it ran to its time limit: it ends TIMEOUT
    GANG_FAILED = "gang failed"  # another part of its gang exited non-zero: it ends FAILED


# The stops a job's warning comes before: those it did not ask for and can prepare for.
WARNED = frozenset({StopCause.PREEMPTED, StopCause.DRAINED, StopCause.TIME_LIMIT})


def requeues(cause: StopCause | None, resumable: bool) -> bool:
    """Whether a job waits again once its tasks ended, stopped for ``cause``: a drained
    job always (a drain moves work elsewhere; what cannot resume starts over), a preempted
    or lost one if it resumes; one that ended on its own or was cancelled never."""
    if cause is StopCause.DRAINED:
        return True
    return resumable and cause in (StopCause.PREEMPTED, StopCause.NODE_LOST)


class PreemptionRule(enum.Enum):
    """The rule that let a job be stopped for other work."""

    FREE_WORK = "free work yields its GPUs to charged work"
    BORROWED = "its GPUs were borrowed beyond its allocation's share and are taken back"
    CONTRACT_ENDED = "past its minimum runtime, it yields to higher-ranked work"


@dataclass(frozen=True)
class Preemption:
    """Who a job was preempted for: a waiting job (empty for workflow serving) of
    ``allocation``, and by which rule."""

    job_id: str
    allocation: str
    rule: PreemptionRule

    def __str__(self) -> str:
        whom = (
            f"{self.job_id} of {self.allocation}"
            if self.job_id
            else (f"workflow serving of {self.allocation} (its GPUs backed up)")
        )
        return f"preempted for {whom}: {self.rule.value}"


@dataclass(frozen=True)
class Stop:
    """Ask a node agent to stop a running task: SIGTERM, then SIGKILL after at most
    ``grace_s`` (0: the agent's own grace; ``stop_grace``). A preempted task says for
    whom and by which rule (``preemption``)."""

    job_id: JobId
    task_id: TaskId
    node_id: NodeId
    cause: StopCause
    reason: str
    grace_s: float = 0.0
    preemption: Preemption | None = None
    # The job's warning, when this stop gives one: ``warn_signal`` now, SIGTERM
    # ``warn_s`` later (or once the task saves a checkpoint, or ends).
    warn_signal: str = ""
    warn_s: float = 0.0


def stop_grace(asked_s: float, own_s: float) -> float:
    """How long a stopped task gets before SIGKILL: the stop's ``grace_s`` may shorten the
    agent's ``own_s``, never lengthen it; 0 (or anything not a positive number) leaves it."""
    return min(asked_s, own_s) if asked_s > 0 else own_s


@dataclass(frozen=True)
class Cancel:
    """A job that never started is withdrawn."""

    job_id: JobId
    reason: str


@dataclass(frozen=True)
class Requeue:
    """A preempted resumable job waits again; it keeps its place by submission order."""

    job_id: JobId
    reason: str


@dataclass(frozen=True)
class Preempted:
    """A preempted job that is not resumable ends here."""

    job_id: JobId
    reason: str


@dataclass(frozen=True)
class Reject:
    """A job the scheduler cannot act on: it breaks a rule and never runs."""

    job_id: JobId
    field: str  # the first field at fault
    reason: str  # every rule broken, for people


class _AboutNoJob:
    """A decision about no job. Every decision has a ``job_id`` (its record is
    correlated by it); this one's is empty."""

    @property
    def job_id(self) -> str:
        return ""


@dataclass(frozen=True)
class Refused(_AboutNoJob):
    """An input about no job that the scheduler cannot act on; nothing changed."""

    subject: str  # what it was about: a node id, a budget tree
    reason: str


@dataclass(frozen=True)
class NodeLost(_AboutNoJob):
    """A node was lost (silent too long, or its key revoked): its GPUs leave the pool
    until it registers again."""

    node_id: NodeId
    incarnation: str
    reason: str


@dataclass(frozen=True)
class TaskLost:
    """A task ended with its node (lost, or its agent restarted); no agent reports it."""

    job_id: JobId
    task_id: TaskId
    node_id: NodeId
    reason: str


@dataclass(frozen=True)
class JobLost:
    """A job that is not resumable lost a node it ran on: it ends here."""

    job_id: JobId
    reason: str


@dataclass(frozen=True)
class ServingHeld(_AboutNoJob):
    """Serving holds a GPU from batch work, charged to ``allocation`` from now on: it was
    taken for that allocation's workflows, or they used it after another's (the charge
    moves to them). Every second it is held is charged, busy or idle."""

    node_id: NodeId
    gpu_index: int
    allocation: str


@dataclass(frozen=True)
class ServingReleased(_AboutNoJob):
    """Serving gave a GPU back to batch work; ``allocation``'s charge for it ends."""

    node_id: NodeId
    gpu_index: int
    allocation: str


Decision = (
    Place
    | Planned
    | Wait
    | Stop
    | Cancel
    | Requeue
    | Preempted
    | Reject
    | Refused
    | NodeLost
    | TaskLost
    | JobLost
    | ServingHeld
    | ServingReleased
)

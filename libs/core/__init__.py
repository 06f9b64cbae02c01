"""The pure scheduling core: plain data in, decisions out. No I/O, no clock.

A test (tests/unit/libs/core/test_purity.py) keeps I/O imports out of this package.
"""

from libs.core.config import PolicyConfig
from libs.core.decisions import (
    Cancel,
    Decision,
    Place,
    Planned,
    PlannedTask,
    Preempted,
    Requeue,
    ServingTask,
    Stop,
    StopCause,
    Wait,
)
from libs.core.inputs import (
    BudgetSet,
    CancelRequested,
    Input,
    JobArrived,
    ModelEvicted,
    ModelLoaded,
    NodeJoined,
    TaskEnded,
    TaskIdle,
    TaskStarted,
    Tick,
    UsageSnapshot,
)
from libs.core.model import JobSpec, NodeSpec, WorkClass
from libs.core.scheduler import POLICY, POLICY_VERSION, Scheduler
from libs.core.validation import Limits, Violation, validate_job

__all__ = [
    "POLICY",
    "POLICY_VERSION",
    "BudgetSet",
    "Cancel",
    "CancelRequested",
    "Decision",
    "Input",
    "JobArrived",
    "JobSpec",
    "Limits",
    "ModelEvicted",
    "ModelLoaded",
    "NodeJoined",
    "NodeSpec",
    "Place",
    "Planned",
    "PlannedTask",
    "PolicyConfig",
    "Preempted",
    "Requeue",
    "Scheduler",
    "ServingTask",
    "Stop",
    "StopCause",
    "TaskEnded",
    "TaskIdle",
    "TaskStarted",
    "Tick",
    "UsageSnapshot",
    "Violation",
    "Wait",
    "WorkClass",
    "validate_job",
]

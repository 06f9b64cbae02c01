"""The pure scheduling core: plain data in, decisions out. No I/O, no clock.

A test (tests/unit/core/test_purity.py) keeps I/O imports out of this package.
"""

from libs.core.decisions import Cancel, Decision, Place, Stop, StopCause, Wait
from libs.core.inputs import CancelRequested, Input, JobArrived, NodeJoined, TaskEnded, Tick
from libs.core.model import JobSpec, NodeSpec
from libs.core.scheduler import POLICY, POLICY_VERSION, Scheduler
from libs.core.validation import Limits, Violation, validate_job

__all__ = [
    "POLICY",
    "POLICY_VERSION",
    "Cancel",
    "CancelRequested",
    "Decision",
    "Input",
    "JobArrived",
    "JobSpec",
    "Limits",
    "NodeJoined",
    "NodeSpec",
    "Place",
    "Scheduler",
    "Stop",
    "StopCause",
    "TaskEnded",
    "Tick",
    "Violation",
    "Wait",
    "validate_job",
]

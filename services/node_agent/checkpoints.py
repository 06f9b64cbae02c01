"""A task's checkpoints as its node agent sees them: the warning before a stop, and the
file a task touches to say it saved one.

A job may ask for a warning (``qm submit --signal USR1@20s``): placement's stop then
names the signal and how long before SIGTERM it comes (``TaskStopRequested.warn_signal``
and ``warn_for``), and the agent sends it at once. A task says it saved a checkpoint by
touching the file ``QM_CHECKPOINT_SAVED`` names (``$QM_CHECKPOINT_SAVED`` in a shell: a
path in its checkpoint folder, or in its scratch folder when the node declares none);
the agent reports each save (``TaskCheckpointed``), and a task that saves after its
warning is stopped at once instead of waiting out the rest of it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from qm.v1 import events_pb2

from libs.core.decisions import WARNING_SIGNALS
from libs.events.wire_time import seconds
from services.node_agent.names import safe_name

# How often the agent looks at the files tasks touch when they save.
POLL_S = 1.0
# A warning longer than a day is a corrupt record, not a job's wish.
LONGEST_WARNING_S = 86_400.0


@dataclass(frozen=True)
class StopWarning:
    """Send ``signal`` now, SIGTERM ``seconds`` later."""

    signal: signal.Signals
    seconds: float


def warning_of(request: events_pb2.TaskStopRequested) -> StopWarning | None:
    """The warning a stop asks for; None for none, or for one no job could have asked for
    (a signal not in ``WARNING_SIGNALS``, a time not a positive number of seconds)."""
    name, after = request.warn_signal, seconds(request.warn_for)
    if name not in WARNING_SIGNALS or not 0 < after <= LONGEST_WARNING_S:
        return None
    return StopWarning(signal.Signals[f"SIG{name}"], after)


def saved_file(folder: Path, task_id: str) -> Path:
    """The file a task touches when it saved a checkpoint: one per task (parts of a gang
    on one agent's nodes share their job's folders)."""
    return folder / f".qm-saved-{safe_name(task_id)}"


def saved_at(path: Path) -> float | None:
    """When the task last said it saved (the file's mtime, never through a link); None:
    never."""
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return None

"""Comparison policies for the simulator: the styles budget scheduling replaces.

Pure like the rest of the core (no I/O, no clock) and driven through the same
``handle(input) -> list[Decision]`` interface as ``libs.core.Scheduler``.
"""

from libs.core.baselines.easy import EasyPolicy
from libs.core.baselines.fifo import FifoPolicy
from libs.core.baselines.priority import Level, PriorityPolicy, level_of

__all__ = ["EasyPolicy", "FifoPolicy", "Level", "PriorityPolicy", "level_of"]

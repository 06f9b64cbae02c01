"""Compass-style workflow placement (Yang et al., arXiv 2402.17652): pure planning.

GPU memory is a model cache; a workflow (a DAG of model-serving tasks) is
planned HEFT-style on arrival, with model loads, cache hits and transfers in
the estimate, and adjusted as it runs. ``workflow`` checks the DAG; ``planner``
plans (Compass and its baselines), playing each GPU's backlog forward
(``timeline``) and choosing each task's GPU (``choice``, ties in the planner's
``order``); ``serving`` (``Serving``) runs plans inside the core (``routing`` sends
each ready task, ``peers`` keeps other planners' tasks, ``touch`` folds a GPU's
change into the digest), over the GPUs its ``pool`` holds from batch work (sized by
the load ``busy`` measures; ``gpu``, ``flow`` and ``backlog`` are what it keeps of
GPUs, workflows and queues; ``load`` the work lately arrived and admitted, which
under overload keeps the largest workflows waiting); ``worker`` and ``cache`` are
one GPU's queue and model cache as the node agent and the simulators keep them.
"""

from libs.core.compass.cache import evict_for
from libs.core.compass.planner import Assignment, PlanMode, Planner
from libs.core.compass.timeline import GpuState
from libs.core.compass.worker import Eviction, GpuWorker, Queued, Start
from libs.core.compass.workflow import (
    CacheModel,
    Costs,
    Task,
    Workflow,
    WorkflowError,
    build_workflow,
)

__all__ = [
    "Assignment",
    "CacheModel",
    "Costs",
    "Eviction",
    "GpuState",
    "GpuWorker",
    "PlanMode",
    "Planner",
    "Queued",
    "Start",
    "Task",
    "Workflow",
    "WorkflowError",
    "build_workflow",
    "evict_for",
]

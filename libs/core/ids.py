"""Identifiers: what a job, task and node id is, and the one place a task id is
built and read back.

They are strings on the wire and in the log (so the log's bytes stay what they
are); the types only keep a node id from being passed where a job id is meant.
A task id names the job and which of its placements (and, in a gang, which rank)
or which workflow task it is; nothing outside this module takes one apart.
"""

import re
from typing import NewType

JobId = NewType("JobId", str)
TaskId = NewType("TaskId", str)
NodeId = NewType("NodeId", str)

# A batch task is named by its placement number, and a gang's tasks by the rank too.
_BATCH_NAME = re.compile(r"\d+(\.\d+)?")


def batch_task_id(job_id: str, attempt: int, rank: int | None = None) -> TaskId:
    """``j-1/2`` for placement 2 of job ``j-1``; ``j-1/2.0`` for rank 0 of a gang."""
    return TaskId(f"{job_id}/{attempt}" if rank is None else f"{job_id}/{attempt}.{rank}")


def workflow_task_id(job_id: str, name: str) -> TaskId:
    """``j-1/encode``: the task named ``encode`` in job ``j-1``'s workflow."""
    return TaskId(f"{job_id}/{name}")


def attempt_of(task_id: str) -> int:
    """The placement a batch task belongs to (``j-1/2`` and ``j-1/2.0`` -> 2).

    0 for an id without that suffix, such as a workflow task's.
    """
    number = task_id.rpartition("/")[2].partition(".")[0]
    return int(number) if number.isascii() and number.isdigit() else 0


def gang_rank(task_id: str) -> int | None:
    """A batch task's rank in its gang (``j-1/2.3`` -> 3); None for a task on one node."""
    rank = task_id.rpartition("/")[2].partition(".")[2]
    return int(rank) if rank.isascii() and rank.isdigit() else None


def in_job(job_id: str, task_id: str) -> bool:
    """Whether the task id names one of the job's tasks."""
    return task_id.startswith(f"{job_id}/")


def name_in_job(job_id: str, task_id: str) -> str:
    """What follows the job id: ``2.0`` for a batch task, ``encode`` for a workflow task."""
    return task_id.removeprefix(f"{job_id}/")


def is_batch_task_id(job_id: str, task_id: str) -> bool:
    """Whether the id names one of a batch job's placements (not a workflow task)."""
    return _BATCH_NAME.fullmatch(name_in_job(job_id, task_id)) is not None


# A job array's id: ``a-`` and hex, never a job's own (a job's starts ``j-``); its
# elements' ids are the array's, ``_`` and the index, as Slurm writes them.
_ARRAY_ID = re.compile(r"a-[0-9a-f]+")
_ELEMENT_ID = re.compile(r"(a-[0-9a-f]+)_(\d+)")


def array_element_id(array_id: str, index: int) -> JobId:
    """``a-1f2e_3``: element 3 of array ``a-1f2e``."""
    return JobId(f"{array_id}_{index}")


def is_array_id(text: str) -> bool:
    """Whether ``text`` names a job array (not one of its elements, nor a job)."""
    return _ARRAY_ID.fullmatch(text) is not None


def array_of(job_id: str) -> str | None:
    """The array a job id names an element of (``a-1f2e_3`` -> ``a-1f2e``); None for a
    job that is no array's element."""
    match = _ELEMENT_ID.fullmatch(job_id)
    return match.group(1) if match else None

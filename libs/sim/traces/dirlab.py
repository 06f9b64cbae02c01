"""The DIR-LAB Gen-Parallel-Workloads format: Philly, Blue Waters and Theta, 15k jobs each.

Nine columns, CRLF line endings. Rows are in submission order and ``interval`` is the gap
from the previous row, so times are a running sum in file order (never re-sorted by
``u_id``). ``wall_time`` is the requested limit where it is positive (Blue Waters, Theta:
round values that ``run_time`` rarely exceeds); Philly records 0 there: no limit.
Rows with no GPUs (Blue Waters' CPU jobs) are kept with 0 GPUs, for the scheduler to
refuse and the report to count.
"""

from __future__ import annotations

from collections.abc import Iterable

from libs.sim.traces.raw import RawJob, TraceError, cell, count, csv_rows, seconds

COLUMNS = ("u_id", "user", "gpu_num", "node_num", "interval", "run_time", "wall_time")


def parse_dirlab(lines: Iterable[str], prefix: str, gpus_column: str = "gpu_num") -> list[RawJob]:
    """Job ids are ``prefix-u_id``, users ``user-ID``; ``gpus_column`` counts a job's GPUs
    (``node_num`` where a trace has none and one node stands for one GPU)."""
    reader, missing = csv_rows(lines, COLUMNS)
    if missing:
        raise TraceError(f"not a DIR-LAB trace: missing columns {missing}")
    jobs: list[RawJob] = []
    at = 0.0
    for row in reader:
        line = reader.line_num
        at += cell(row, "interval", seconds, line)
        requested = cell(row, "wall_time", seconds, line)
        jobs.append(
            RawJob(
                job_id=f"{prefix}-{row['u_id']}",
                at=at,
                user=f"user-{row['user']}",
                gpus=cell(row, gpus_column, count, line),
                runtime_s=cell(row, "run_time", seconds, line),
                nodes=cell(row, "node_num", count, line),
                requested_s=requested if requested > 0 else None,
                status=row.get("new_status") or None,
            )
        )
    return jobs

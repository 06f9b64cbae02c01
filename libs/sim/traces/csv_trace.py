"""The generic trace format (``--trace csv``), for any cluster's job history.

One row per job, a header naming these columns in any order (more columns are ignored):

    job_id,submit_s,user,team,gpus,nodes,gpu_type,runtime_s,requested_s,status

``submit_s``, ``user``, ``gpus`` and ``runtime_s`` are required; any other cell may be
empty where the history does not say. Ids are text. Rows may come in any order: jobs are
replayed by submission time, ties in file order. deploy/sim/README.md documents each column.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from libs.sim.traces.raw import RawJob, TraceError, cell, count, csv_rows, seconds

COLUMNS = (
    "job_id",
    "submit_s",
    "user",
    "team",
    "gpus",
    "nodes",
    "gpu_type",
    "runtime_s",
    "requested_s",
    "status",
)
V = TypeVar("V")
Row = Mapping[str, str | None]


def parse_csv_trace(lines: Iterable[str]) -> list[RawJob]:
    reader, missing = csv_rows(lines, COLUMNS)
    if missing:
        raise TraceError(f"not a Quartermaster CSV trace: missing columns {missing}")
    jobs: list[RawJob] = []
    for row in reader:
        line = reader.line_num
        jobs.append(
            RawJob(
                job_id=_optional(row, "job_id", str, line) or f"row-{line}",
                at=_required(row, "submit_s", float, line),
                user=_required(row, "user", str, line),
                gpus=_required(row, "gpus", count, line),
                runtime_s=_required(row, "runtime_s", seconds, line),
                nodes=_optional(row, "nodes", count, line) or 1,
                requested_s=_optional(row, "requested_s", seconds, line) or None,
                status=_optional(row, "status", str, line),
                team=_optional(row, "team", str, line),
                gpu_type=_optional(row, "gpu_type", str, line),
            )
        )
    jobs.sort(key=lambda job: job.at)
    return jobs


def _optional(row: Row, column: str, kind: Callable[[str], V], line: int) -> V | None:
    """The cell as ``kind``, or None where it is empty."""
    return cell(row, column, kind, line) if (row.get(column) or "").strip() else None


def _required(row: Row, column: str, kind: Callable[[str], V], line: int) -> V:
    value = _optional(row, column, kind, line)
    if value is None:
        raise TraceError(f"row {line}, column {column}: required, found an empty cell")
    return value

"""The Philly 15k-job trace (DIR-LAB Gen-Parallel-Workloads, from Microsoft Philly).

Rows are in submission order and ``interval`` is the gap from the previous row,
so times are a running sum in file order (never re-sorted by ``u_id``).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from libs.sim.traces.raw import RawJob, TraceError

COLUMNS = ("u_id", "user", "gpu_num", "node_num", "interval", "run_time")


def load_philly(path: Path) -> list[RawJob]:
    with path.open(newline="") as f:  # the file has CRLF line endings
        return parse_philly(f)


def parse_philly(lines: Iterable[str]) -> list[RawJob]:
    reader = csv.DictReader(lines)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise TraceError(f"not a Philly trace: missing columns {missing}")
    jobs: list[RawJob] = []
    at = 0.0
    for row in reader:
        try:
            at += float(row["interval"])
            jobs.append(
                RawJob(
                    job_id=f"philly-{int(row['u_id'])}",
                    at=at,
                    user=f"user-{int(row['user'])}",
                    gpus=int(row["gpu_num"]),
                    runtime_s=float(row["run_time"]),
                    nodes=int(row["node_num"]),
                )
            )
        except (TypeError, ValueError) as exc:
            raise TraceError(f"row {reader.line_num}: {exc}") from exc
    return jobs

"""Alibaba GPU trace v2023 ("openb", Weng et al., ATC '23): one row per pod.

The trace has no users, so each pod is its own team key. A pod's run is from
its scheduling to its deletion; a pod that was never scheduled (Pending)
counts from its creation, the time its owner kept asking for it. Shared GPUs
(``gpu_milli`` < 1000) round up to a whole GPU; CPU-only pods are kept with 0 GPUs,
for the scheduler to refuse and the report to count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from libs.sim.traces.raw import RawJob, TraceError, csv_rows

COLUMNS = ("name", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time")
# Kubernetes QoS as the old-style priority the trace implies.
QOS_PRIORITY = {"Guaranteed": 2, "LS": 1, "Burstable": 0, "BE": -1}


def parse_alibaba(lines: Iterable[str]) -> list[RawJob]:
    reader, missing = csv_rows(lines, COLUMNS)
    if missing:
        if set(reader.fieldnames or ()) >= {"name", "num_gpu", "gpu_milli"}:
            # openb_pod_list_multigpu50 and the gpuspec lists: sizes only, sampled for
            # packing studies; with no arrival or run time there is nothing to replay.
            raise TraceError(
                f"a pod list without times (missing {', '.join(missing)}): it says what pods "
                "ask for, not when or for how long, so it cannot be simulated over time; "
                "use openb_pod_list_default.csv or openb_pod_list_gpushare100.csv"
            )
        raise TraceError(f"not an openb pod list with times: missing columns {missing}")
    jobs: list[RawJob] = []
    for row in reader:
        try:
            gpus = math.ceil(int(row["num_gpu"]) * int(row["gpu_milli"]) / 1000)
            created = float(row["creation_time"])
            began = float(row["scheduled_time"]) if row.get("scheduled_time") else created
            qos = row["qos"]
            jobs.append(
                RawJob(
                    job_id=row["name"],
                    at=created,
                    user=row["name"],
                    gpus=gpus,
                    runtime_s=max(1.0, float(row["deletion_time"]) - began),
                    best_effort=qos == "BE",
                    priority=QOS_PRIORITY.get(qos, 0),
                    status=row.get("pod_phase") or None,
                )
            )
        except (TypeError, ValueError) as exc:
            raise TraceError(f"row {reader.line_num}: {exc}") from exc
    # Only the default list is in creation order; ties keep name order.
    jobs.sort(key=lambda job: job.at)
    return jobs

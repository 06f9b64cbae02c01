"""The order in which a planner takes GPUs that tie.

When several GPUs would start a task equally soon (idle ones alike, most often)
a plan and an adjustment take the first in this order. One planner takes the
lowest id. Several planners sharing the GPUs must not all take the same one:
each sees the others' sends only as it reads them off the log, late, so in that
moment they would all pile onto the GPU first in a common order. A named
planner (``serving_planner``) orders the GPUs by a hash of its name with each
GPU's id: every planner has its own order, and the same order on every replay.
"""

from __future__ import annotations

import hashlib


class GpuOrder:
    """Sort keys for GPU ids: the id itself without a planner name, else a stable
    hash of the name with the id (computed once per GPU)."""

    def __init__(self, planner: str = "") -> None:
        self.planner = planner
        self._keys: dict[str, str] = {}

    def key(self, gpu_id: str) -> str:
        if not self.planner:
            return gpu_id
        key = self._keys.get(gpu_id)
        if key is None:
            digest = hashlib.sha256(f"{self.planner}\0{gpu_id}".encode()).hexdigest()
            key = self._keys[gpu_id] = digest[:16] + gpu_id  # the id breaks a clash
        return key

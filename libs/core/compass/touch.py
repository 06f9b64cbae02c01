"""Folding a serving GPU's change into the digest (``GpuTouch``), for every part that
changes serving's GPUs (``serving``, ``routing``, ``peers``)."""

from __future__ import annotations

from libs.core.compass.backlog import Backlogs
from libs.core.compass.gpu import Gpu, GpuKey
from libs.core.compass.pool import Pool
from libs.core.state import Table


class GpuTouch:
    """Fold a GPU's change into the digest; a drained pool GPU starts lingering.

    Every change to what its fact reads is followed by a touch, so the fact, written
    when the digest is read, is what it would have been here. A plain object, not a
    bound method, so that a placement snapshot holds it as it holds the parts.
    """

    def __init__(self, pool: Pool, backlogs: Backlogs, gpus: Table[GpuKey, Gpu]) -> None:
        self._pool = pool
        self._backlogs = backlogs
        self._gpus = gpus

    def __call__(self, gpu: Gpu, now_ms: float | None = None) -> None:
        self._pool.linger(gpu.key, gpu.busy, now_ms)
        self._backlogs.touched(gpu)
        self._gpus.touch(gpu.key)

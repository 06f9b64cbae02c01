"""The serving pool: the GPUs workflow serving holds from batch work.

Workflows plan over the GPUs already serving plus free GPUs, while serving
holds at most ``serving_max_fraction`` of the cluster. A GPU joins the pool
when a plan first uses it (it is taken from the batch ``Capacity``, through
``BatchGpus``, the scheduler's narrow view of it) and goes back to batch work
``serving_linger_s`` after its queue drains, so a steady stream of workflows
keeps its GPUs and their warm models. Workflows plan onto the pool's queues
when no GPU is free, so on a full cluster none of them ever waits: a pool that
is backed up then takes the next GPU batch work frees (``grow``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Protocol

from libs.core.compass.gpu import Gpu, GpuKey, node_of
from libs.core.compass.workflow import Workflow
from libs.core.config import PolicyConfig
from libs.core.ids import NodeId
from libs.core.model import JobSpec, NodeSpec
from libs.core.state import Cell, State, Table


class BatchGpus(Protocol):
    """What serving may see and do of the batch scheduler's GPUs."""

    @property
    def total_gpus(self) -> int: ...

    @property
    def total_free(self) -> int: ...

    def node(self, node_id: NodeId) -> NodeSpec | None:
        """A registered node, or None."""
        ...

    def free_gpus(self) -> Iterator[GpuKey]:
        """The free GPUs serving may take (none on nodes reserved for batch work),
        in node order."""
        ...

    def take(self, key: GpuKey) -> None: ...

    def give(self, key: GpuKey) -> None: ...


class Pool:
    """The GPUs serving holds (``held``, in the order it took them), since when
    each has been idle, and what a backed-up pool wants. What it remembers is
    declared in the scheduler's ``State``; it reads serving's GPUs (``gpus``)
    for their memory and models."""

    def __init__(
        self, config: PolicyConfig, state: State, batch: BatchGpus, gpus: Table[GpuKey, Gpu]
    ) -> None:
        self.config = config
        self._batch = batch
        self._gpus = gpus
        self.held: Table[GpuKey, None] = state.table("serving.pool")
        self._idle_since: Table[GpuKey, float] = state.table("serving.idle")  # held, queue empty
        # The pool is backed up and had no free GPU to grow onto: the next GPU batch
        # work frees joins it (GPU type, model size it must hold).
        self._hungry: Cell[tuple[str, float] | None] = state.cell("serving.hungry", None)

    def __len__(self) -> int:
        return len(self.held)

    @property
    def cap(self) -> int:
        """The most GPUs serving may hold."""
        return math.ceil(self.config.serving_max_fraction * self._batch.total_gpus)

    @property
    def usable(self) -> bool:
        """Whether a plan could use any GPU now: one held, or one free."""
        return bool(self.held) or bool(self._batch.total_free)

    def held_on(self, node_id: str) -> set[int]:
        return {index for node, index in self.held if node == node_id}

    def candidates(
        self, spec: JobSpec, workflow: Workflow, need_mb: float, *, spread: bool
    ) -> list[GpuKey]:
        """The GPUs a plan may use: those held now, then free ones while the pool
        has room: first those already holding one of its models, then in node
        order, at most one per task unless ``spread`` (the hash baselines spread
        over every eligible GPU)."""
        chosen = [key for key in self.held if self.fits(key, spec.gpu_type, need_mb)]
        room = self.cap - len(self.held)
        if room > 0:
            models = workflow.models
            free = [k for k in self._batch.free_gpus() if self.fits(k, spec.gpu_type, need_mb)]
            warm = [key for key in free if models & self._gpus[key].resident.keys()]
            wanted = room if spread else len(workflow.tasks)
            taken = set(warm)
            cold = [key for key in free if key not in taken][:wanted]
            chosen += (warm + cold)[:room]
        return sorted(chosen)

    def fits(self, key: GpuKey, gpu_type: str, need_mb: float) -> bool:
        """The GPU is registered, of the type asked for, with room for the largest model."""
        gpu = self._gpus.get(key)
        node = self._batch.node(node_of(key))
        return (
            gpu is not None
            and node is not None
            and gpu.memory_mb >= need_mb
            and (not gpu_type or node.gpu_type == gpu_type)
        )

    # -- taking and giving back ------------------------------------------------

    def take(self, key: GpuKey) -> None:
        if key not in self.held:
            self.held[key] = None
            self._batch.take(key)

    def give_back(self, key: GpuKey) -> None:
        """Back to batch work: to its node's capacity, free when the node is."""
        self._idle_since.pop(key)
        if key in self.held:
            del self.held[key]
            self._batch.give(key)

    def linger(self, key: GpuKey, busy: bool, now_ms: float | None) -> None:
        """The GPU's queue changed: a busy one is not idle, and a held one that
        drained (at ``now_ms``) starts lingering."""
        if busy:
            self._idle_since.pop(key)
        elif now_ms is not None and key in self.held and key not in self._idle_since:
            self._idle_since[key] = now_ms

    def release_idle(self, now_ms: float) -> list[GpuKey]:
        """Give the GPUs whose queue drained ``serving_linger_s`` ago back to batch
        work; the GPUs given back."""
        linger_ms = self.config.serving_linger_s * 1000
        released: list[GpuKey] = []
        while self._idle_since:
            key, since = self._idle_since.first()
            if since + linger_ms > now_ms:
                break
            self.give_back(key)
            released.append(key)
        return released

    def want(self, gpu_type: str, need_mb: float) -> None:
        """The pool is backed up: the next GPU batch work frees that can take a
        workflow of ``gpu_type`` needing ``need_mb`` joins it."""
        self._hungry.value = (gpu_type, need_mb)

    def grow(self) -> GpuKey | None:
        """Take a freed GPU for a backed-up pool, before batch work can; the GPU
        taken, or None."""
        hungry = self._hungry.value
        if hungry is None or len(self.held) >= self.cap:
            return None
        gpu_type, need_mb = hungry
        for key in self._batch.free_gpus():
            if self.fits(key, gpu_type, need_mb):
                self.take(key)
                self._hungry.value = None
                return key
        return None

    def why_waiting(self, spec: JobSpec) -> str:
        """Why a workflow waits for a GPU, for ``qm why``."""
        assert spec.workflow is not None
        need_mb = spec.workflow.largest_model_mb
        kind = spec.gpu_type or "any type"
        if not any(self.fits(key, spec.gpu_type, need_mb) for key in self._gpus):
            return (
                f"needs a GPU ({kind}) with room for a {need_mb:g} MB model; "
                "no registered GPU has that much memory"
            )
        if any(self.fits(key, spec.gpu_type, need_mb) for key in self.held):
            # Only a hold keeps a workflow waiting while GPUs that can take it serve.
            return (
                "held while the serving GPUs work through their queues: a plan now would "
                f"start it more than {self.config.hold_threshold:g}× its best-case time late; "
                "held workflows go earliest due first (arrival + that many best-case times)"
            )
        cap = self.cap
        if len(self.held) >= cap:
            return f"waiting for a serving GPU: serving holds its limit of {cap} GPUs"
        return (
            f"waiting for a GPU free of batch work (serving holds {len(self.held)} "
            f"of at most {cap})"
        )

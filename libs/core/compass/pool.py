"""The serving pool: the GPUs workflow serving holds from batch work.

Workflows plan over the GPUs already serving plus free GPUs, while serving
holds at most ``serving_max_fraction`` of the cluster. A GPU joins the pool
when a plan first uses it (it is taken from the batch ``Capacity``, through
``BatchGpus``, the scheduler's narrow view of it). The pool grows and shrinks
with its load: it keeps a warm reserve of idle GPUs (``reserve``: the ones
drained most recently), enough to hold its recent load and a margin of its
square root, plans use only the busy GPUs and that reserve, and every other idle
GPU goes back to batch work ``serving_lend_s`` after its queue drained (all of
them after ``serving_linger_s``). Workflows plan onto the pool's queues when no GPU is
free, so on a full cluster none of them ever waits: a pool that is backed up
takes the next GPU batch work frees (``grow``), or the GPUs of a job stopped
for it (``adopt``; the scheduler picks the job).

Each held GPU is charged to one allocation for as long as it is held, busy or
idle (``ServingHeld``, ``ServingReleased``): the one it was taken for, or whose
workflows used it last. Under budget pressure the idle GPUs an allocation holds
beyond its share go back to a better-ranked job they make room for, as borrowed
work past its contract would be preempted (the scheduler decides, from
``idle_by_node``): all but the ``serving_reserve_min`` drained last, which are
serving's contract, as a minimum runtime is a batch job's. What runs is never
stopped.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from typing import NamedTuple, Protocol

from libs.core.compass.busy import BusyMeter
from libs.core.compass.gpu import Gpu, GpuKey, node_of
from libs.core.compass.workflow import Workflow
from libs.core.config import PolicyConfig
from libs.core.decisions import ServingHeld, ServingReleased
from libs.core.ids import NodeId
from libs.core.model import JobSpec, NodeSpec
from libs.core.state import Cell, State, Table
from libs.core.wait_reasons import WaitCode, WaitReason


class Want(NamedTuple):
    """The GPU a backed-up pool waits for."""

    gpu_type: str  # "" for any
    need_mb: float  # room for the largest model of the workflow that backed up
    allocation: str  # that workflow's: whose claim a reclaim stands on


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

    def schedulable(self, spec: JobSpec) -> Mapping[NodeId, int]:
        """The nodes not cordoned that may take ``spec``, with their GPU counts."""
        ...

    def take(self, key: GpuKey) -> None: ...

    def give(self, key: GpuKey) -> None: ...


PoolChange = ServingHeld | ServingReleased

# A load's staffing is rounded to this many decimals before it is rounded up to GPUs:
# a mean over a window carries float error (9 GPUs busy all window can read
# 9.000000000000002), and rounding up a hair over a whole number would staff one GPU
# more. The digits are far above that error and far below any real load's.
STAFFED_DECIMALS = 9


def staffed(load: float, reserve: float) -> int:
    """The GPUs a load calls for: itself and ``reserve`` × its square root (square-root
    staffing), rounded up."""
    return math.ceil(round(load + reserve * math.sqrt(load), STAFFED_DECIMALS))


class Pool:
    """The GPUs serving holds (``held``, in the order it took them, with the allocation
    each is charged to), since when each has been idle, and what a backed-up pool
    wants. What it remembers is declared in the scheduler's ``State``; it reads
    serving's GPUs (``gpus``) for their memory and models."""

    def __init__(
        self, config: PolicyConfig, state: State, batch: BatchGpus, gpus: Table[GpuKey, Gpu]
    ) -> None:
        self.config = config
        self._batch = batch
        self._gpus = gpus
        self.held: Table[GpuKey, str] = state.table("serving.pool")  # -> allocation charged
        self._idle_since: Table[GpuKey, float] = state.table("serving.idle")  # held, queue empty
        # The pool is backed up and had no free GPU to grow onto: the next GPU batch
        # work frees joins it (GPU type, model size it must hold, for which allocation).
        self._hungry: Cell[Want | None] = state.cell("serving.hungry", None)
        self._meter = BusyMeter(state, config.serving_load_window_s * 1000)
        # The free GPUs as batch work left them at its last pass (``settle``), give or
        # take what this pool took and gave back since: GPUs freed after it (a batch job
        # ended) may go to waiting batch work in this very pass, so the reserve does
        # not count them.
        self._settled: Cell[int] = state.cell("serving.settled_free", 0)

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
        self, spec: JobSpec, workflow: Workflow, need_mb: float, now_ms: float, *, spread: bool
    ) -> list[GpuKey]:
        """The GPUs a plan may use: those held now, then free ones while the pool
        has room: first those already holding one of its models or kept busy by
        other planners, then idle ones in node order, at most one per task unless
        ``spread`` (the hash baselines spread over every eligible GPU)."""
        offered = self._offered(now_ms)
        chosen = [key for key in offered if self.fits(key, spec.gpu_type, need_mb)]
        room = self.cap - len(self.held)
        if room > 0:
            models = workflow.models
            free = [k for k in self._batch.free_gpus() if self.fits(k, spec.gpu_type, need_mb)]
            # Every free GPU that holds one of its models, or that other planners keep
            # busy (it serves, so it is weighed as this pool's busy ones are; a planner
            # alone has none), then idle ones.
            warm = [
                key
                for key in free
                if self._gpus[key].busy or models & self._gpus[key].resident.keys()
            ]
            wanted = room if spread else len(workflow.tasks)
            taken = set(warm)
            cold = [key for key in free if key not in taken][:wanted]
            chosen += (warm + cold)[:room]
        if not chosen:
            # None busy or in reserve fits, and no free one: the GPUs left to drain are
            # all there is (never wait beside an idle GPU that could take it).
            chosen = [key for key in self.held if self.fits(key, spec.gpu_type, need_mb)]
        return sorted(chosen)

    def _offered(self, now_ms: float) -> list[GpuKey]:
        """The held GPUs plans may use: the busy ones and the warm reserve (those
        drained most recently). The other idle ones are left to drain back to batch."""
        idle, size = self._idle_since, self.reserve(now_ms)
        reserve = list(idle)[-size:] if size else []
        return [key for key in self.held if key not in idle] + reserve

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

    def take(self, key: GpuKey, allocation: str) -> list[PoolChange]:
        """Hold the GPU for ``allocation``'s workflows: taken from batch work, or its
        charge moved from another allocation's (nothing changes if it is theirs)."""
        holder = self.held.get(key)
        if holder == allocation:
            return []
        if holder is None:
            self._batch.take(key)
            self._settled.value -= 1
        self.held[key] = allocation
        return [ServingHeld(*key, allocation)]

    def give_back(self, key: GpuKey) -> list[PoolChange]:
        """Back to batch work: to its node's capacity, free when the node is."""
        self._idle_since.pop(key)
        holder = self.held.pop(key)
        if holder is None:
            return []
        self._batch.give(key)
        self._settled.value += 1
        return [ServingReleased(*key, holder)]

    @property
    def busy(self) -> int:
        """The held GPUs with workflow tasks queued or running."""
        return len(self.held) - len(self._idle_since)

    def linger(self, key: GpuKey, busy: bool, now_ms: float | None) -> None:
        """The GPU's queue changed: a busy one is not idle, and a held one that
        drained (at ``now_ms``) starts lingering."""
        if busy:
            self._idle_since.pop(key)
        elif now_ms is not None and key in self.held and key not in self._idle_since:
            self._idle_since[key] = now_ms

    def measure(self, now_ms: float) -> None:
        """An input at ``now_ms`` is folded: the load's meter reads the GPUs busy now
        (they stay so till the next input)."""
        self._meter.count(now_ms, self.busy)

    def release_idle(self, now_ms: float) -> list[PoolChange]:
        """Give back to batch work the GPUs idle past ``serving_linger_s``, and those
        idle past ``serving_lend_s`` beyond the warm reserve (``reserve``), longest
        idle first."""
        linger_ms = self.config.serving_linger_s * 1000
        lend_ms = self.config.serving_lend_s * 1000
        released: list[PoolChange] = []
        keep: int | None = None  # the reserve, counted once and only if asked
        while self._idle_since:
            key, since = self._idle_since.first()
            if since + linger_ms > now_ms:
                if since + lend_ms > now_ms:
                    break
                keep = self.reserve(now_ms) if keep is None else keep
                if len(self._idle_since) <= keep:
                    break
            released += self.give_back(key)
        return released

    def idle_by_node(self) -> dict[NodeId, list[tuple[GpuKey, str]]]:
        """The idle GPUs held but the ``serving_reserve_min`` drained last (serving's
        contract: the warm GPUs it keeps whatever its budget), with the allocation each
        is charged to, by node (in node order), longest idle first."""
        by_node: dict[NodeId, list[tuple[GpuKey, str]]] = {}
        kept = self.config.serving_reserve_min
        idle = list(self._idle_since)
        for key in idle[: max(len(idle) - kept, 0)]:
            by_node.setdefault(node_of(key), []).append((key, self.held[key]))
        return dict(sorted(by_node.items()))

    def reserve(self, now_ms: float) -> int:
        """The idle GPUs serving keeps warm for the next arrivals: enough that the pool
        holds its load (the mean of its busy GPUs over ``serving_load_window_s``) and
        ``serving_reserve`` × the load's square root, at least ``serving_reserve_min``;
        less the GPUs batch work leaves free that serving may take (plans use those
        too, and one lent back keeps its models until a batch task lands there):
        those it left free at its last pass, not one a batch job freed since, which
        waiting batch work may take in this very pass (``settle``).

        Square-root staffing: the spare GPUs that keep queueing rare grow with the
        square root of the load, not with the load. The pool is sized by the mean, not
        the count busy now, so that it stays put while that count swings with every
        task; a pool that lent its GPUs in each lull would have to stop batch work to
        get them back."""
        needed = staffed(self._meter.mean(now_ms), self.config.serving_reserve)
        wanted = max(self.config.serving_reserve_min, needed - self.busy)
        room = self.cap - len(self.held)  # plans use free GPUs only while the pool has room
        if not (room > 0 and self._batch.total_free):
            return wanted  # the usual full cluster: no walk over its nodes on every plan
        left = max(0, self._settled.value)  # free after batch work's last pass
        counted = itertools.islice(self._batch.free_gpus(), min(wanted, room, left))
        return wanted - sum(1 for _ in counted)

    def settle(self) -> None:
        """Batch work was placed: the GPUs it left free are free for the reserve (a
        write only when that changed: this runs on every pass)."""
        if self._settled.value != (free := self._batch.total_free):
            self._settled.value = free

    def shortfall(self) -> int:
        """The GPUs a backed-up pool lacks: what its load calls for, as ``reserve``
        sizes it, less those it holds; at least one. From the GPUs busy now, not the
        load's mean, which lags a burst (a backed-up pool is busy through and through)."""
        return max(1, staffed(self.busy, self.config.serving_reserve) - len(self.held))

    def want(self, want: Want) -> None:
        """The pool is backed up: the next GPU batch work frees that fits joins it."""
        self._hungry.value = want

    @property
    def wanted(self) -> Want | None:
        """The GPU a backed-up pool below its cap waits for."""
        hungry = self._hungry.value
        return hungry if hungry is not None and len(self.held) < self.cap else None

    def grow(self) -> list[PoolChange]:
        """Take a freed GPU for a backed-up pool, before batch work can (none or one)."""
        hungry = self.wanted
        if hungry is None:
            return []
        for key in self._batch.free_gpus():
            if self.fits(key, hungry.gpu_type, hungry.need_mb):
                self._hungry.value = None
                return self.take(key, hungry.allocation)
        return []

    def adopt(self, keys: list[GpuKey], allocation: str) -> list[PoolChange]:
        """Take the GPUs a job stopped for this pool just freed, as many as the cap
        allows (a backlog that stopped work wants more than one; the surplus drains
        back to batch work), for ``allocation``, whose want stopped the job."""
        free = set(self._batch.free_gpus())  # not on a node cordoned or kept for a job
        taken: list[PoolChange] = []
        for key in keys:
            if len(self.held) >= self.cap:
                break
            if key in free and key in self._gpus:
                taken += self.take(key, allocation)
        if taken:
            self._hungry.value = None
        return taken

    def why_waiting(self, spec: JobSpec) -> WaitReason:
        """Why a workflow waits for a GPU."""
        assert spec.workflow is not None
        need_mb = spec.workflow.largest_model_mb
        if not any(self.fits(key, spec.gpu_type, need_mb) for key in self._gpus):
            kind = spec.gpu_type or "any type"
            return WaitReason.of(WaitCode.NO_GPU_MEMORY, kind=kind, model_mb=f"{need_mb:g}")
        if any(self.fits(key, spec.gpu_type, need_mb) for key in self.held):
            # Only a hold keeps a workflow waiting while GPUs that can take it serve.
            threshold = f"{self.config.hold_threshold:g}"
            return WaitReason.of(WaitCode.WORKFLOW_HELD, threshold=threshold)
        cap = self.cap
        if len(self.held) >= cap:
            return WaitReason.of(WaitCode.SERVING_AT_LIMIT, cap=cap)
        return WaitReason.of(WaitCode.NO_SERVING_GPU, held=len(self.held), cap=cap)

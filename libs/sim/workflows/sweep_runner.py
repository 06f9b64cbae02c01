"""The sweep: every mode at every cluster size under every arrival process and seed,
run side by side in processes (each reports its progress to the parent through the
queue its initializer keeps).
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import queue
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from libs.core.compass import (
    PlanMode,
)
from libs.sim.workflows.profiles import Profiles
from libs.sim.workflows.serving_cluster import WorkflowRun, simulate

ARRIVALS = {"poisson": 0.0, "gamma": 0.25}  # name -> gamma shape (0: Poisson)


@dataclass(frozen=True)
class Case:
    """One run of a sweep: an arrival process, a cluster size, a mode and a seed."""

    arrivals: str  # poisson or gamma
    shape: float  # the gamma shape of the inter-arrivals (0: Poisson)
    gpus: int
    mode: PlanMode
    seed: int

    @property
    def label(self) -> str:
        """How progress names the run."""
        return run_label(self.arrivals, self.gpus, self.mode, self.seed)


@dataclass(frozen=True)
class SweepRun:
    arrivals: str  # poisson or gamma
    run: WorkflowRun
    wall_s: float
    seed: int = 7
    shape: float = 0.0  # the gamma shape of the inter-arrivals (0: Poisson)


def sweep(
    profiles: Profiles,
    sizes: Sequence[int],
    modes: Sequence[PlanMode],
    arrivals: Mapping[str, float],
    *,
    seeds: Sequence[int] = (7,),
    workers: int = 1,
    on_run: Callable[[SweepRun], None] | None = None,
    on_progress: Callable[[str, float], None] | None = None,
    **knobs: Any,  # for every run: simulate's jobs, rate_per_s, hold_threshold, ...
) -> list[SweepRun]:
    """Every mode at every size under every arrival process, with every seed;
    deterministic, in that order whatever ``workers`` (processes running runs side by
    side). ``on_run`` hears of each run as it ends; ``on_progress(label, share)`` of
    each run's progress, named by ``Case.label``."""
    cases = [
        Case(name, shape, gpus, mode, seed)
        for (name, shape), gpus, mode, seed in itertools.product(
            arrivals.items(), sizes, modes, seeds
        )
    ]
    told = on_run or (lambda _: None)
    if workers <= 1 or len(cases) < 2:
        runs = []
        for case in cases:
            heard = on_progress and functools.partial(on_progress, case.label)
            runs.append(_sweep_run(profiles, case, knobs, heard))
            told(runs[-1])
        return runs
    context = multiprocessing.get_context("spawn")  # a fork would copy the caller's threads
    updates: multiprocessing.Queue[tuple[str, float]] = context.Queue()
    with ProcessPoolExecutor(
        min(workers, len(cases)), mp_context=context, initializer=_reporting, initargs=(updates,)
    ) as pool:
        futures = [pool.submit(_sweep_run, profiles, case, knobs) for case in cases]
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            while True:
                try:
                    update = updates.get_nowait()
                except queue.Empty:
                    break
                if on_progress is not None:
                    on_progress(*update)
            for future in sorted(finished, key=futures.index):
                told(future.result())
        return [f.result() for f in futures]


def run_label(arrivals: str, gpus: int, mode: PlanMode, seed: int) -> str:
    """How progress names a run of the sweep."""
    return f"{arrivals} {gpus} GPUs {mode.value} seed {seed}"


_updates: multiprocessing.Queue[tuple[str, float]] | None = None  # in a sweep's worker


def _reporting(updates: multiprocessing.Queue[tuple[str, float]]) -> None:
    global _updates
    _updates = updates


def _relay(updates: multiprocessing.Queue[tuple[str, float]], run: str, share: float) -> None:
    updates.put((run, share))


def _sweep_run(
    profiles: Profiles,
    case: Case,
    knobs: Mapping[str, Any],
    on_progress: Callable[[float], None] | None = None,
) -> SweepRun:
    if on_progress is None and _updates is not None:  # in a worker: tell the parent
        on_progress = functools.partial(_relay, _updates, case.label)
    began = time.perf_counter()
    run = simulate(
        profiles,
        mode=case.mode,
        gpus=case.gpus,
        burst_shape=case.shape,
        seed=case.seed,
        on_progress=on_progress,
        **knobs,
    )
    return SweepRun(case.arrivals, run, time.perf_counter() - began, case.seed, case.shape)

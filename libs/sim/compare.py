"""Several policies on one workload, each on a fresh policy and timed.

The wall clock is read here, around whole runs, and never inside one.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

from libs.core.config import PolicyConfig
from libs.sim.driver import SimSettings, simulate
from libs.sim.policy import make_policy
from libs.sim.recorder import Metrics
from libs.sim.workload import Workload


def run_policies(
    workload: Workload,
    names: Sequence[str],
    config: PolicyConfig,
    settings: SimSettings,
    on_done: Callable[[Metrics], None] | None = None,
    on_progress: Callable[[str, float], None] | None = None,
) -> list[Metrics]:
    """``on_progress(policy, share done)`` as each run advances (see ``simulate``)."""
    results = []
    for name in names:
        wall, cpu = time.perf_counter(), time.process_time()
        heard = functools.partial(on_progress, name) if on_progress else None
        metrics = simulate(
            workload, make_policy(name, config), settings, name=name, on_progress=heard
        )
        metrics = dataclasses.replace(
            metrics,
            sim_wall_s=time.perf_counter() - wall,
            sim_cpu_s=time.process_time() - cpu,
        )
        if on_done is not None:
            on_done(metrics)
        results.append(metrics)
    return results

"""A simulated node's instructions travel as entries of the job's environment."""

from __future__ import annotations

import math

from libs.core.simulated import EXIT, SECONDS, UTILIZATION, SimulatedRun, split_env, to_env


def test_only_what_differs_from_the_default_is_written_and_it_reads_back() -> None:
    assert to_env(SimulatedRun()) == {}
    run = SimulatedRun(duration_s=0.1, exit_code=-9, utilization=0.02)
    assert to_env(run) == {SECONDS: "0.1", EXIT: "-9", UTILIZATION: "0.02"}
    assert split_env({**to_env(run), "A": "1"}) == (run, {"A": "1"})


def test_a_nan_reaching_the_core_is_written_back_for_validation_to_refuse() -> None:
    run, rest = split_env(to_env(SimulatedRun(duration_s=math.nan)))
    assert math.isnan(run.duration_s) and rest == {}


def test_an_entry_that_does_not_parse_stays_in_the_environment() -> None:
    env = {SECONDS: "soon", EXIT: str(2**31), UTILIZATION: "0.5"}
    assert split_env(env) == (SimulatedRun(utilization=0.5), {SECONDS: "soon", EXIT: str(2**31)})

"""How a job tells a simulated node how to "run" it: entries of the job's environment.

They are not fields of the public ``JobSpec`` message: a client of a real cluster has no
use for them, and a field there would be an API promise. The environment is already the
job's free-form channel to whatever runs it, and the simulated executor is such a thing,
so the simulator, the tests and ``qm submit --sim-*`` write these entries and the simulated
node reads them. The edge (``libs.events.convert``) moves them into the core's
``JobSpec.simulated_*`` fields, where validation and the simulator's baselines see them
as numbers, and writes them back; the entries round-trip byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

SECONDS = "QM_SIMULATED_SECONDS"  # how long the task "runs", in seconds (float)
EXIT = "QM_SIMULATED_EXIT"  # its exit code (int32)
UTILIZATION = "QM_SIMULATED_UTILIZATION"  # the GPU utilisation it reports, 0..1
PREFIX = "QM_SIMULATED_"

_INT32 = range(-(2**31), 2**31)


@dataclass(frozen=True)
class SimulatedRun:
    duration_s: float = 0.0
    exit_code: int = 0
    utilization: float = 0.0


def split_env(env: Mapping[str, str]) -> tuple[SimulatedRun, dict[str, str]]:
    """The run the entries ask for, and the rest of the environment.

    An entry that does not parse stays in the rest, so that validation names it
    (``unread_entries``) instead of the run silently taking a default.
    """
    rest = dict(env)
    duration_s = _pop(rest, SECONDS, float, 0.0)
    exit_code = _pop(rest, EXIT, _int32, 0)
    utilization = _pop(rest, UTILIZATION, float, 0.0)
    return SimulatedRun(duration_s, exit_code, utilization), rest


def to_env(run: SimulatedRun) -> dict[str, str]:
    """The entries for ``run``, only those that differ from the default (repr: exact)."""
    entries = {
        SECONDS: (run.duration_s, repr(run.duration_s)),
        EXIT: (run.exit_code, str(run.exit_code)),
        UTILIZATION: (run.utilization, repr(run.utilization)),
    }
    # A NaN differs from the default too: one that reached the core is written back.
    return {k: text for k, (value, text) in entries.items() if value != 0}


def unread_entries(env: Mapping[str, str]) -> dict[str, str]:
    """The simulation entries ``split_env`` left in the environment, with what each must be."""
    must = {
        SECONDS: "must be a number of seconds",
        EXIT: "must be an integer exit code (32 bits)",
        UTILIZATION: "must be a number between 0 and 1",
    }
    unknown = f"is not one of {', '.join(must)}"
    return {k: must.get(k, unknown) for k in env if k.startswith(PREFIX)}


def _int32(text: str) -> int:
    value = int(text)
    if value not in _INT32:
        raise ValueError(text)
    return value


def _pop(env: dict[str, str], key: str, parse: Callable[[str], T], default: T) -> T:
    text = env.get(key)
    if text is None:
        return default
    try:
        value = parse(text)
    except ValueError:
        return default
    del env[key]
    return value

"""How busy a node's GPUs are: read from NVML, or as the running tasks declare it.

Samples carry their own timestamp (monotonic seconds), the only clock idle detection sees.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from qm.v1 import events_pb2, types_pb2

from libs.core import simulated

Clock = Callable[[], float]


@dataclass(frozen=True)
class Sample:
    at: float
    by_gpu: Mapping[int, float]  # GPU index -> utilisation 0..1, for every GPU of the node


class SamplingError(Exception):
    """The node's GPUs could not be read this time."""


class Sampler(Protocol):
    def sample(self, tasks: Sequence[events_pb2.TaskPlaced]) -> Sample:
        """The utilisation of each of the node's GPUs now; ``tasks`` are those running on it."""
        ...


class DeclaredSampler:
    """For nodes without NVML: a task's GPUs are as busy as its job declares, free ones idle."""

    def __init__(self, node: types_pb2.NodeInventory, *, clock: Clock = time.monotonic) -> None:
        self._indices = [gpu.index for gpu in node.gpus]
        self._clock = clock

    def sample(self, tasks: Sequence[events_pb2.TaskPlaced]) -> Sample:
        by_gpu = dict.fromkeys(self._indices, 0.0)
        for task in tasks:
            # Nothing upstream bounds the declaration; a sample outside 0..1 means nothing.
            level = min(max(simulated.split_env(task.spec.env)[0].utilization, 0.0), 1.0)
            by_gpu.update(dict.fromkeys(task.gpu_indices, level))
        return Sample(self._clock(), by_gpu)


class _Utilization(Protocol):
    @property
    def gpu(self) -> int:
        """Percent of the last sample period in which a kernel ran."""
        ...


class UtilizationNvml(Protocol):
    """The part of ``pynvml`` the sampler uses; tests hand in a fake."""

    @property
    def NVMLError(self) -> type[Exception]: ...

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> object: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> _Utilization: ...


class NvmlSampler:
    """Reads each GPU's utilisation from NVML, which must be initialised meanwhile."""

    def __init__(
        self, node: types_pb2.NodeInventory, nvml: UtilizationNvml, *, clock: Clock = time.monotonic
    ) -> None:
        self._indices = [gpu.index for gpu in node.gpus]
        self._nvml = nvml
        self._clock = clock

    def sample(self, tasks: Sequence[events_pb2.TaskPlaced]) -> Sample:
        nvml = self._nvml
        try:
            by_gpu = {
                index: nvml.nvmlDeviceGetUtilizationRates(
                    nvml.nvmlDeviceGetHandleByIndex(index)
                ).gpu
                / 100
                for index in self._indices
            }
        except nvml.NVMLError as exc:
            raise SamplingError(f"NVML: {exc}") from exc
        return Sample(self._clock(), by_gpu)


def sampler_for(node: types_pb2.NodeInventory, nvml: UtilizationNvml) -> Sampler:
    """NVML for a node read from NVML; the tasks' declarations for a declared one."""
    return NvmlSampler(node, nvml) if node.source == "nvml" else DeclaredSampler(node)


@contextlib.contextmanager
def nvml_session(nvml: UtilizationNvml) -> Iterator[None]:
    """NVML initialised for as long as the agent samples it."""
    nvml.nvmlInit()
    try:
        yield
    finally:
        nvml.nvmlShutdown()

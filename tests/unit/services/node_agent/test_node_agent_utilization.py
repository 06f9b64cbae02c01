"""Utilisation samplers: declared by the tasks, or read from a fake NVML."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.core import simulated
from services.node_agent.utilization import (
    DeclaredSampler,
    NvmlSampler,
    Sample,
    SamplingError,
    nvml_session,
    sampler_for,
)

NODE = types_pb2.NodeInventory(
    node_id="n",
    gpus=[types_pb2.Gpu(index=index) for index in range(4)],
    source="declared",
)


def task(gpus: list[int], utilization: float) -> events_pb2.TaskPlaced:
    return events_pb2.TaskPlaced(
        task_id=f"t{gpus}",
        gpu_indices=gpus,
        spec=types_pb2.JobSpec(env={simulated.UTILIZATION: repr(utilization)}),
    )


def test_declared_gpus_are_as_busy_as_their_task_says_and_free_ones_idle() -> None:
    sampler = DeclaredSampler(NODE, clock=lambda: 42.0)
    assert sampler.sample([task([0, 2], 0.7), task([3], 1.5)]) == Sample(
        42.0, {0: 0.7, 1: 0.0, 2: 0.7, 3: 1.0}
    )
    assert sampler.sample([]) == Sample(42.0, dict.fromkeys(range(4), 0.0))


class FakeNvmlError(Exception):
    pass


@dataclass
class FakeUtilization:
    gpu: int
    memory: int = 0


class FakeNvml:
    NVMLError = FakeNvmlError

    def __init__(self, percent: dict[int, int]) -> None:
        self.percent = percent
        self.initialised = 0

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return f"handle-{index}"

    def nvmlDeviceGetUtilizationRates(self, handle: object) -> FakeUtilization:
        assert isinstance(handle, str)
        index = int(handle.removeprefix("handle-"))
        if index not in self.percent:
            raise FakeNvmlError("GPU is lost")
        return FakeUtilization(gpu=self.percent[index])


def test_nvml_percentages_become_fractions_for_every_gpu() -> None:
    nvml = FakeNvml({0: 0, 1: 50, 2: 100, 3: 7})
    sampler = NvmlSampler(NODE, nvml, clock=lambda: 5.0)
    assert sampler.sample([task([1], 0.0)]) == Sample(5.0, {0: 0.0, 1: 0.5, 2: 1.0, 3: 0.07})


def test_nvml_failures_are_sampling_errors() -> None:
    sampler = NvmlSampler(NODE, FakeNvml({0: 0}))
    with pytest.raises(SamplingError, match="NVML: GPU is lost"):
        sampler.sample([])


def test_nodes_read_from_nvml_are_sampled_through_it() -> None:
    nvml = FakeNvml({})
    assert isinstance(sampler_for(NODE, nvml), DeclaredSampler)
    real = types_pb2.NodeInventory(node_id="h", gpus=NODE.gpus, source="nvml")
    assert isinstance(sampler_for(real, nvml), NvmlSampler)


def test_nvml_stays_initialised_for_the_session() -> None:
    nvml = FakeNvml({})
    with nvml_session(nvml):
        assert nvml.initialised == 1
    assert nvml.initialised == 0

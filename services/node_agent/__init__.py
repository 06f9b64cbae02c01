"""The node agent: registers nodes, runs the tasks placed on them, reports their lifecycle
and when their GPUs go idle."""

from services.node_agent.agent import NodeAgent, serve
from services.node_agent.executors import (
    Execution,
    Executor,
    LaunchError,
    ProcessExecutor,
    SimulatedExecutor,
)
from services.node_agent.idle import IdleDetector, IdleThresholds, Transition
from services.node_agent.inventory import (
    InventoryError,
    load_inventory,
    nvml_inventory,
    parse_inventory,
    select_nodes,
)
from services.node_agent.utilization import (
    DeclaredSampler,
    NvmlSampler,
    Sample,
    Sampler,
    SamplingError,
    sampler_for,
)

__all__ = [
    "DeclaredSampler",
    "Execution",
    "Executor",
    "IdleDetector",
    "IdleThresholds",
    "InventoryError",
    "LaunchError",
    "NodeAgent",
    "NvmlSampler",
    "ProcessExecutor",
    "Sample",
    "Sampler",
    "SamplingError",
    "SimulatedExecutor",
    "Transition",
    "load_inventory",
    "nvml_inventory",
    "parse_inventory",
    "sampler_for",
    "select_nodes",
    "serve",
]

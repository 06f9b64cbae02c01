"""The node agent: registers nodes, runs the tasks placed on them, reports their lifecycle."""

from services.node_agent.agent import NodeAgent, serve
from services.node_agent.executors import (
    Execution,
    Executor,
    LaunchError,
    ProcessExecutor,
    SimulatedExecutor,
)
from services.node_agent.inventory import (
    InventoryError,
    load_inventory,
    nvml_inventory,
    parse_inventory,
    select_nodes,
)

__all__ = [
    "Execution",
    "Executor",
    "InventoryError",
    "LaunchError",
    "NodeAgent",
    "ProcessExecutor",
    "SimulatedExecutor",
    "load_inventory",
    "nvml_inventory",
    "parse_inventory",
    "select_nodes",
    "serve",
]

"""The simulators: any policy over one simulated cluster (``world``), no I/O in the loop.

``world`` is the cluster (nodes, GPUs, tasks, serving caches, clock and agenda); the trace
simulator (``driver``, ``batch``), the workflow sweep (``workflows``) and the mixed cluster
(``mixed``) drive it.
"""

from libs.sim.cluster import ClusterSpec
from libs.sim.driver import SimSettings, SimulationError, simulate
from libs.sim.mapping import ContractRules
from libs.sim.policy import POLICIES, Policy, make_policy
from libs.sim.recorder import Metrics
from libs.sim.scenario import Scenario, build_workload
from libs.sim.workload import SimJob, Workload
from libs.sim.world import World

__all__ = [
    "POLICIES",
    "ClusterSpec",
    "ContractRules",
    "Metrics",
    "Policy",
    "Scenario",
    "SimJob",
    "SimSettings",
    "SimulationError",
    "Workload",
    "World",
    "build_workload",
    "make_policy",
    "simulate",
]

"""The trace-driven simulator: any policy, simulated nodes and clock, no I/O in the loop."""

from libs.sim.cluster import ClusterSpec
from libs.sim.driver import SimSettings, SimulationError, simulate
from libs.sim.mapping import ContractRules
from libs.sim.metrics import Metrics
from libs.sim.policy import POLICIES, Policy, make_policy
from libs.sim.scenario import Scenario, build_workload
from libs.sim.workload import SimJob, Workload

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
    "build_workload",
    "make_policy",
    "simulate",
]

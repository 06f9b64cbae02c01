"""The chaos run's own stack: a fresh broker, every service under the supervisor.

The integration :class:`~tests.integration.stack.Stack` gives fresh topic names,
groups and keys; this one adds a broker of its own (its data folder under the
run's folder, ports from ``port_base``), several node agents, and runs each
process under ``deploy/local/supervise.py`` in a session of its own. Every
process carries ``QM_CHAOS_RUN`` in its environment, and so do the tasks the
process node agents start: :mod:`tests.chaos.processes` finds whatever is left
by that mark.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from libs.config.policy import policy_from_mapping
from libs.config.sandbox import DEFAULT_ENVIRONMENT
from libs.core import PolicyConfig
from tests.chaos.workload import CANARY_TYPE, LOST_NODE_TYPE
from tests.integration.stack import ROOT, Stack

SUPERVISE = ROOT / "deploy" / "local" / "supervise.py"
KAFKA = ROOT / "deploy" / "local" / "kafka.sh"
MARK = "QM_CHAOS_RUN"

# The local stack's tree, whose members and managers the workload acts as, and a
# `fuzz` leaf that mallory alone manages: the fuzzer's budget changes cannot reach the
# workload's allocations.
LOCAL_BUDGET_TREE = ROOT / "deploy" / "local" / "budget.yaml"
FUZZ_ALLOCATION = {"name": "fuzz", "weight": 1, "members": ["mallory"], "managers": ["mallory"]}
# The production defaults but a short linger, so that serving GPUs return to batch work.
POLICY: dict[str, Any] = {"serving_linger_s": 2}


def _node(node_id: str, gpu_type: str, count: int, memory: int, executor: str) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "gpu_type": gpu_type,
        "gpu_count": count,
        "gpu_memory_gib": memory,
        "executor": executor,
    }


# Node agents by name: two of simulated A100 nodes and a T4 serving node each,
# one of two process nodes, one whose single node is lost for good, and one whose
# node only canary jobs use (each of a GPU type of its own, so that only the jobs
# meant for it go there), never killed: a canary runs whatever the others leaked.
AGENTS: dict[str, list[dict[str, Any]]] = {
    "a": [*(_node(f"a-{i}", "A100", 8, 80, "simulated") for i in range(6)),
          _node("serve-a", "T4", 4, 15, "simulated")],
    "b": [*(_node(f"b-{i}", "A100", 8, 80, "simulated") for i in range(6)),
          _node("serve-b", "T4", 4, 15, "simulated")],
    "p": [_node(f"p-{i}", "H100", 4, 80, "process") for i in range(2)],
    "lost": [_node("lost-0", LOST_NODE_TYPE, 8, 24, "simulated")],
    "canary": [_node("canary-0", CANARY_TYPE, 2, 16, "simulated")],
}  # fmt: skip
SERVICES = ("budget", "projector", "placement", "ticker", "admission")


def agent_process(agent: str) -> str:
    return f"node_agent-{agent}"


@dataclass
class ChaosStack(Stack):
    """Stack with its own broker on ``port_base`` (controller on the next port)."""

    port_base: int = 29400

    def __post_init__(self) -> None:
        self.bootstrap = f"127.0.0.1:{self.port_base}"
        self.users_dir = self.workdir / "kafka" / "users"
        super().__post_init__()
        self.admission_port = self.port_base + 2
        self.budget_port = self.port_base + 3
        self.projector_port = self.port_base + 4
        self.kafka_dir = self.workdir / "kafka"
        self.run_dir = self.workdir / "run"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tree = yaml.safe_load(LOCAL_BUDGET_TREE.read_text())
        tree["children"].append(FUZZ_ALLOCATION)
        (self.workdir / "budget.yaml").write_text(yaml.safe_dump(tree))
        (self.workdir / "policy.yaml").write_text(yaml.safe_dump(POLICY))
        # Tasks see only what the sandbox passes on: the run's mark too, so that the
        # teardown finds every process the run started (tests/chaos/processes.py).
        self.write_sandbox({"environment": [*DEFAULT_ENVIRONMENT, MARK]})
        for agent, nodes in AGENTS.items():
            (self.workdir / f"nodes-{agent}.yaml").write_text(yaml.safe_dump({"nodes": nodes}))

    @property
    def env(self) -> dict[str, str]:
        return {
            **super().env,
            MARK: self.run_id,
            "OTEL_TRACES_EXPORTER": "none",
            "QM_KAFKA_DIR": str(self.kafka_dir),
            "QM_KAFKA_PORT": str(self.port_base),
        }

    @property
    def policy(self) -> PolicyConfig:
        return policy_from_mapping(POLICY, "the chaos stack's policy")

    # --- the broker -----------------------------------------------------------------

    def kafka(self, action: str, timeout: float = 180) -> None:
        subprocess.run(
            [str(KAFKA), action],
            env=self.env,
            check=True,
            timeout=timeout,
            stdout=subprocess.DEVNULL,
            stderr=(self.logs / "kafka.sh.log").open("ab"),
        )

    def kafka_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            return int((self.kafka_dir / "kafka.pid").read_text())
        return None

    def kill_kafka(self) -> None:
        """SIGKILL the broker and wait until it is gone, so that kafka.sh can start it again."""
        pid = self.kafka_pid()
        if pid is None:
            raise RuntimeError(f"no broker pid in {self.kafka_dir / 'kafka.pid'}")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        # kafka.sh takes a pid that still answers kill -0 (a zombie) for a running broker.
        (self.kafka_dir / "kafka.pid").unlink(missing_ok=True)

    # --- supervised processes ---------------------------------------------------------

    def start(self, name: str, *args: str) -> None:
        """Start ``services.<module>`` under the supervisor; ``name`` may be ``node_agent-X``."""
        module = name.split("-", 1)[0]
        self.processes[name] = subprocess.Popen(
            [sys.executable, str(SUPERVISE), "--name", name,
             "--child-pidfile", str(self.child_pidfile(name)),
             "--", sys.executable, "-m", f"services.{module}", *args],
            cwd=ROOT,
            env=self.service_env(module),
            stdin=subprocess.DEVNULL,
            stdout=(self.logs / f"{name}.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group per service: teardown reaches all
        )  # fmt: skip

    def start_agent(self, agent: str) -> None:
        nodes = self.workdir / f"nodes-{agent}.yaml"
        self.start(agent_process(agent), "--nodes", str(nodes), "--name", f"{self.run_id}-{agent}")

    def child_pidfile(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def child_pid(self, name: str, timeout: float = 60) -> int:
        """The supervised service's pid, waiting while it is between restarts."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, ValueError):
                return int(self.child_pidfile(name).read_text())
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} has not been running for {timeout:g} s")
            time.sleep(0.1)

    def up(self) -> None:
        self.kafka("start")
        self.create_topics()
        self.start("budget")
        self.start("projector")
        self.wait_ready(
            f"grpc:127.0.0.1:{self.budget_port}",
            f"http://127.0.0.1:{self.projector_port}/ready",
            timeout=180,
        )
        self.start("placement")
        self.start("ticker")
        for agent in AGENTS:
            self.start_agent(agent)
        self.start("admission")
        self.wait_ready(f"grpc:127.0.0.1:{self.admission_port}", timeout=180)
        self.approve_nodes(self.declared_nodes(), timeout=180)

    def declared_nodes(self) -> set[str]:
        return {str(node["node_id"]) for nodes in AGENTS.values() for node in nodes}

    def stop(self, name: str, timeout: float = 25) -> int:
        """SIGTERM to the supervisor (it stops its service); SIGKILL to the group if stuck."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            return process.wait()

    def kill_for_good(self, name: str) -> None:
        """A machine that dies: SIGKILL to the supervisor and its service at once."""
        process = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def down(self) -> None:
        for name in reversed(list(self.processes)):
            self.stop(name)
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.kafka("stop", timeout=60)
        pid = self.kafka_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.scratch, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody has reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"

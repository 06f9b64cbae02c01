"""The real services as processes against the real broker, isolated per test session.

Each session gets its own topic names, consumer groups, ports and keys, so
runs never see each other's events even on a reused broker.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import yaml
from qm.v1 import cluster_service_pb2, cluster_service_pb2_grpc

from libs.auth import SigningKey, issue_token
from libs.auth.keygen import ISSUER, PUBLIC_KEYS, keygen
from libs.auth.tokens import SERVICE_SUBJECTS, read_private_key
from libs.bus import KafkaSettings
from libs.bus.access import ADMIN
from libs.bus.writers import SERVICE_ROLES
from libs.config.policy import load_policy
from libs.core import PolicyConfig
from libs.trust.install import init as init_trust
from services.grpc_server import bearer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy" / "local"))
from wait_ready import answers  # noqa: E402

BUDGET_TREE = {
    "name": "lab",
    "managers": ["carol"],
    "children": [
        {"name": "vision", "weight": 60, "members": ["alice"], "managers": ["dana"]},
        {"name": "nlp", "weight": 40, "members": ["bob", "alice"]},
    ],
}

NODES = {
    "nodes": [
        {
            "node_id": "proc-0",
            "gpu_type": "H100",
            "gpu_count": 4,
            "gpu_memory_gib": 80,
            "executor": "process",
            "address": "127.0.0.2",  # distinct: a two-node job's parts rendezvous across them
        },
        {
            "node_id": "proc-1",
            "gpu_type": "H100",
            "gpu_count": 4,
            "gpu_memory_gib": 80,
            "executor": "process",
            "address": "127.0.0.3",  # distinct: a two-node job's parts rendezvous across them
        },
        {
            "node_id": "sim-0",
            "gpu_type": "A100",
            "gpu_count": 8,
            "gpu_memory_gib": 40,
            "executor": "simulated",
        },
    ]
}


# Approves the stack's nodes (QM_OPERATORS).
OPERATOR = "qm-operator"

# Serving may hold one GPU of the 16 (so a workflow's models must share it and
# evict), and gives it back a second after its queue drains.
# Nodes heartbeat every second and are declared lost after 5 s of silence.
POLICY = {"serving_max_fraction": 0.0625, "serving_linger_s": 1, "node_lost_timeout_s": 5}
HEARTBEAT_S = "1"


# Where the kernel numbers outgoing connections from (Linux's default if unreadable).
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Listen ports come from here up to that range: above the fixed ports the test brokers
# and the chaos run take (19092-19095 for make test; 29400-29404 for the chaos run).
LOWEST_PORT = 30_000
_handed_out: set[int] = set()
_pick = random.Random()  # seeded from the OS: processes pick apart


def free_port() -> int:
    """A port nothing listens on, for a service to listen on, below the kernel's
    ephemeral range: a free port from that range can be given to an outgoing connection
    (a Kafka client's) before the service binds it, and the service then fails to
    start. Never the same port twice in one process."""
    try:
        ephemeral = int(EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32_768
    highest = max(ephemeral, LOWEST_PORT + 1_000)  # a machine with a low range: share it
    for _ in range(1000):
        port = _pick.randrange(LOWEST_PORT, highest)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port from {LOWEST_PORT} to {highest}")


@dataclass
class Stack:
    workdir: Path
    bootstrap: str = field(
        default_factory=lambda: os.environ.get("QM_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    )
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    # Partitions of every topic (deploy/topics.yaml's count unless given).
    partitions: int | None = None
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    metrics_ports: dict[str, int] = field(default_factory=dict)  # by service, see start()
    # Every principal's password (deploy/local/kafka.sh and `python -m libs.bus` make them).
    users_dir: Path = field(
        default_factory=lambda: Path(
            os.environ.get("QM_KAFKA_USERS_DIR", ROOT / ".local" / "kafka-test" / "users")
        )
    )

    def __post_init__(self) -> None:
        self.admission_port = free_port()
        self.budget_port = free_port()
        self.projector_port = free_port()
        self.console_port = free_port()
        self.topics_file = self.workdir / "topics.yaml"
        self.logs = self.workdir / "logs"
        self.task_logs = self.logs / "tasks"
        self.task_logs.mkdir(parents=True, exist_ok=True)
        # The token keys, as `make up` makes them: qm signs users' tokens with the issuer's,
        # admission and the console sign their own with theirs (service_env).
        self.auth_dir = self.workdir / "auth"
        keygen(self.auth_dir)
        prefix = f"t{self.run_id}"
        # Groups start as the bus's grants expect (libs/bus/access.py).
        self.app_id = f"qm-projector-{prefix}"
        config = yaml.safe_load((ROOT / "deploy" / "topics.yaml").read_text())
        config["partitions"] = self.partitions or config["partitions"]
        for key, topic in config["topics"].items():
            # Faust names changelogs <app id>-<table>-changelog.
            topic["name"] = (
                f"{self.app_id}-{key.removesuffix('_view')}-changelog"
                if key.endswith("_view")
                else f"{prefix}.{topic['name']}"
            )
        self.topics_file.write_text(yaml.safe_dump(config))
        (self.workdir / "budget.yaml").write_text(yaml.safe_dump(BUDGET_TREE))
        (self.workdir / "nodes.yaml").write_text(yaml.safe_dump(NODES))
        (self.workdir / "policy.yaml").write_text(yaml.safe_dump(POLICY))
        # The services' keys, and the trust file that lists them (as `make up` makes them).
        self.trust_file = init_trust(self.workdir / "trust")
        # Jobs' scratch folders, where every task account reaches them (pytest's are root's).
        self.scratch = Path(tempfile.mkdtemp(prefix=f"qm-scratch-{self.run_id}-"))
        self.checkpoints = Path(tempfile.mkdtemp(prefix=f"qm-checkpoints-{self.run_id}-"))
        # A dataset volume, declared read-only for jobs in images (every account reads it).
        self.datasets = Path(tempfile.mkdtemp(prefix=f"qm-datasets-{self.run_id}-"))
        self.datasets.chmod(0o755)
        (self.datasets / "hello").write_text("hello from the dataset\n")
        (self.datasets / "hello").chmod(0o644)
        self.write_sandbox({})

    def write_sandbox(self, settings: Mapping[str, object]) -> None:
        """The node agents' sandbox file: ``settings`` and the stack's scratch and
        checkpoint folders."""
        folders = {
            "scratch": {"root": str(self.scratch)},
            "checkpoints": {"root": str(self.checkpoints)},
            # Images through podman, in the storage `make example-image` builds into.
            "containers": {},
            "volumes": {"datasets": {"host_path": str(self.datasets), "read_only": True}},
        }
        sandbox = {**settings, **folders}
        (self.workdir / "sandbox.yaml").write_text(yaml.safe_dump(sandbox))

    @property
    def env(self) -> dict[str, str]:
        """The operator's environment (the broker's admin); services get their own account
        (``service_env``)."""
        return {
            **os.environ,
            "QM_KAFKA_BOOTSTRAP": self.bootstrap,
            "QM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "QM_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "QM_KAFKA_SASL_USERNAME": ADMIN,
            "QM_KAFKA_SASL_PASSWORD_FILE": str(self.users_dir / ADMIN),
            "QM_KAFKA_USERS_DIR": str(self.users_dir),
            "QM_TOPICS": str(self.topics_file),
            "QM_AUTH_PUBLIC_KEYS_FILE": str(self.auth_dir / PUBLIC_KEYS),
            # The operator's key (qm token): services hold their own or none (service_env).
            "QM_AUTH_SIGNING_KEY_FILE": str(self.auth_dir / f"{ISSUER}.key"),
            "QM_ADMISSION_ADDR": f"127.0.0.1:{self.admission_port}",
            "QM_ADMISSION_TARGET": f"127.0.0.1:{self.admission_port}",
            "QM_BUDGET_ADDR": f"127.0.0.1:{self.budget_port}",
            "QM_BUDGET_TARGET": f"127.0.0.1:{self.budget_port}",
            "QM_BUDGET_TREE": str(self.workdir / "budget.yaml"),
            "QM_PROJECTOR_APP_ID": self.app_id,
            "QM_PROJECTOR_PORT": str(self.projector_port),
            "QM_PROJECTOR_URL": f"http://127.0.0.1:{self.projector_port}",
            "QM_PROJECTOR_DATA_DIR": str(self.workdir / "projector"),
            "QM_CONSOLE_PORT": str(self.console_port),
            "QM_CONSOLE_POLL_S": "0.5",
            "QM_TASK_LOG_DIR": str(self.task_logs),
            "QM_SANDBOX": str(self.workdir / "sandbox.yaml"),
            "QM_NODE_STATE_DIR": str(self.workdir / "node-state"),
            "QM_NODE_KEY_DIR": str(self.workdir / "node-keys"),
            "QM_TRUST_FILE": str(self.trust_file),
            "QM_OPERATORS": OPERATOR,
            "QM_HEARTBEAT_SECONDS": HEARTBEAT_S,
            "QM_PLACEMENT_GROUP": f"qm-placement-t{self.run_id}",
            "QM_POLICY_FILE": str(self.workdir / "policy.yaml"),
            # Any free port: several of a kind may run at once (start() picks one to know).
            "QM_METRICS_PORT": "0",
            "OTEL_TRACES_EXPORTER": "console",
            "PYTHONUNBUFFERED": "1",
        }

    @property
    def signer(self) -> SigningKey:
        """The stack's user-token issuer key (the operator's ``QM_AUTH_SIGNING_KEY_FILE``)."""
        return SigningKey(read_private_key(self.auth_dir / f"{ISSUER}.key"))

    @property
    def private_keys(self) -> list[bytes]:
        """The key material of the stack's token keys (each PEM's base64), which no log or
        task may see."""
        return [
            b"".join(line for line in path.read_bytes().splitlines() if b"-----" not in line)
            for path in sorted(self.auth_dir.glob("*.key"))
        ]

    def service_env(self, module: str) -> dict[str, str]:
        """The environment of ``services.<module>``: logged in to the bus as its principal."""
        env = {**self.env, **self.principal_env(module.replace("_", "-"))}
        del env["QM_KAFKA_USERS_DIR"]
        # Only admission and the console sign tokens, each with its own key.
        del env["QM_AUTH_SIGNING_KEY_FILE"]
        if module in SERVICE_SUBJECTS:
            env["QM_AUTH_SIGNING_KEY_FILE"] = str(self.auth_dir / f"{module}.key")
        if module in SERVICE_ROLES:  # a writer of the event log signs with its own key
            env["QM_EVENTS_KEY_FILE"] = str(self.trust_file.parent / f"{module}.key")
        return env

    def principal_env(self, principal: str) -> dict[str, str]:
        return {
            "QM_KAFKA_SASL_USERNAME": principal,
            "QM_KAFKA_SASL_PASSWORD_FILE": str(self.users_dir / principal),
        }

    def kafka_settings(self, principal: str = ADMIN) -> KafkaSettings:
        """Settings to reach this stack's broker as ``principal``."""
        return KafkaSettings.from_env({**self.env, **self.principal_env(principal)})

    def start(self, name: str, *args: str) -> None:
        """Start ``services.<name>``; its /metrics, /healthz and /readyz are on
        ``metrics_ports[name]``."""
        self._spawn(name, name, args, {})

    def start_instance(self, key: str, name: str, env: Mapping[str, str], *args: str) -> None:
        """Another instance of ``services.<name>`` (with ``args``), known (and logging) as
        ``key``, with ``env`` over its own settings."""
        self._spawn(key, name, args, env)

    def _spawn(self, key: str, name: str, args: tuple[str, ...], env: Mapping[str, str]) -> None:
        # As deploy/local/stack.sh runs a service: its log, and all it writes, are the
        # stack's account's alone (umask 077).
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        log = os.fdopen(os.open(self.logs / f"{key}.log", flags, 0o600), "ab")
        self.metrics_ports[key] = free_port()
        self.processes[key] = subprocess.Popen(
            [sys.executable, "-m", f"services.{name}", *args],
            cwd=ROOT,
            env={
                **self.service_env(name),
                "QM_METRICS_PORT": str(self.metrics_ports[key]),
                **env,
            },
            stdout=log,
            stderr=subprocess.STDOUT,
            umask=0o077,
        )

    def kill(self, name: str) -> None:
        """SIGKILL, as a crash: the process cleans nothing up."""
        process = self.processes.pop(name)
        self.metrics_ports.pop(name, None)
        process.kill()
        process.wait()

    def start_node_agent(self) -> None:
        """Killed, it leaves its tasks to their keepers for the next one to take back;
        stopped (``down``), it stops them: nothing of the stack outlives it."""
        nodes = str(self.nodes_file)
        self.start("node_agent", "--nodes", nodes, "--name", self.run_id, "--stop-tasks-on-exit")

    def stop(self, name: str) -> int:
        process = self.processes.pop(name)
        self.metrics_ports.pop(name, None)
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()

    def wait_ready(self, *targets: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        waiting = list(targets)
        while waiting:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {process.returncode}: {self.tail(name)}"
                    )
            waiting = [t for t in waiting if not answers(t)]
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(f"not ready: {waiting}")
            time.sleep(0.2)

    def create_topics(self, topics_file: Path | None = None) -> None:
        """Create the stack's topics (or those of another topics file) and their grants."""
        subprocess.run(
            [sys.executable, "-m", "libs.bus"],
            cwd=ROOT,
            env={**self.env, "QM_TOPICS": str(topics_file or self.topics_file)},
            check=True,
            capture_output=True,
            timeout=120,
        )

    def up(self) -> None:
        self.create_topics()
        self.start("budget")
        self.start("projector")
        self.wait_ready(
            f"grpc:127.0.0.1:{self.budget_port}", f"http://127.0.0.1:{self.projector_port}/ready"
        )
        self.start("placement")
        self.start("ticker")
        self.start_node_agent()
        self.start("admission")
        self.wait_ready(f"grpc:127.0.0.1:{self.admission_port}")
        self.approve_nodes(self.declared_nodes())

    def declared_nodes(self) -> set[str]:
        """The nodes the stack's agents run."""
        return {
            str(node["node_id"]) for node in yaml.safe_load(self.nodes_file.read_text())["nodes"]
        }

    @property
    def nodes_file(self) -> Path:
        return self.workdir / "nodes.yaml"

    def approve_nodes(self, nodes: set[str], timeout: float = 60) -> None:
        """Approve each of ``nodes`` as an operator does (``qm node approve``), once its
        agent has offered its key: until then placement refuses what it says."""
        stub = cluster_service_pb2_grpc.ClusterServiceStub(self.channel())
        waiting, deadline = set(nodes), time.monotonic() + timeout
        while waiting:
            pending = stub.ListPendingNodes(
                cluster_service_pb2.ListPendingNodesRequest(),
                metadata=self.auth(OPERATOR),
                timeout=10,
            )
            for node in pending.nodes:
                if node.node_id in waiting:
                    stub.ApproveNode(
                        cluster_service_pb2.ApproveNodeRequest(
                            node_id=node.node_id, fingerprint=node.fingerprint, cluster=node.cluster
                        ),
                        metadata=self.auth(OPERATOR),
                        timeout=10,
                    )
                    waiting.discard(node.node_id)
            if waiting and time.monotonic() > deadline:
                raise TimeoutError(
                    f"nodes not pending approval in {timeout:g} s: {sorted(waiting)}"
                )
            time.sleep(0.2)

    def wait_registered(self, timeout: float = 60) -> None:
        """Until every declared node is in admission's view of the cluster: a job is
        judged against the nodes registered so far, and a type none of them has yet is
        refused."""
        declared = {str(node["node_id"]) for node in NODES["nodes"]}
        stub = cluster_service_pb2_grpc.ClusterServiceStub(self.channel())
        deadline = time.monotonic() + timeout
        while True:
            reply = stub.ListNodes(
                cluster_service_pb2.ListNodesRequest(), metadata=self.auth("alice"), timeout=10
            )
            if declared <= {node.inventory.node_id for node in reply.nodes}:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes not registered in {timeout:g} s: {sorted(declared)}")
            time.sleep(0.2)

    def start_console(self) -> None:
        """The web console (after ``up``): it reads the projector, the budget service and
        (for estimated starts) admission."""
        self.start("console")
        self.wait_ready(f"{self.console_url}/readyz")

    @property
    def console_url(self) -> str:
        return f"http://127.0.0.1:{self.console_port}"

    def down(self) -> None:
        for name in list(self.processes):
            self.stop(name)
        shutil.rmtree(self.scratch, ignore_errors=True)
        shutil.rmtree(self.checkpoints, ignore_errors=True)
        shutil.rmtree(self.datasets, ignore_errors=True)

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.logs / f"{name}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    @property
    def policy(self) -> PolicyConfig:
        """The knobs placement runs with: an audit must replay with the same."""
        return load_policy(self.workdir / "policy.yaml")

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(f"127.0.0.1:{self.admission_port}")

    def budget_channel(self) -> grpc.Channel:
        return grpc.insecure_channel(f"127.0.0.1:{self.budget_port}")

    def auth(self, user: str) -> tuple[tuple[str, str], ...]:
        return bearer(issue_token(user, self.signer))

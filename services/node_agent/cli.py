"""Command line: which nodes to host, where their inventory comes from, then serve.

Environment: ``QM_NODES`` (inventory file), ``QM_NODE_ADDRESS`` (where other nodes reach
the NVML node, or the declared nodes that name none), ``QM_TASK_LOG_DIR`` (task logs, default
``.local/logs/tasks``: the agent's alone, 0700), ``QM_IDLE_THRESHOLD``, ``QM_BUSY_THRESHOLD``,
``QM_IDLE_WINDOW_SECONDS`` and ``QM_SAMPLE_SECONDS`` (idle detection),
``QM_HOST_TO_GPU_MB_PER_MS`` (how fast a workflow task's model loads),
``QM_HEARTBEAT_SECONDS`` (how often each node says it is alive; 0: never),
``QM_NODE_STATE_DIR`` (where the agent named NAME records its running tasks and its
nodes' incarnations, in ``node-agent-NAME``, for the agent after it to take back:
``services.node_agent.orphans``; default ``.local/run``), ``QM_NODE_KEY_DIR`` (each
node's private key, ``NODE.key``, made on its first start; default ``keys`` in the
state folder), ``QM_SANDBOX`` (whose account
runs each user's tasks and what environment they see: ``libs.config.sandbox``),
``QM_SECRETS_DIR`` (the node's secret store: ``services.node_agent.secrets``),
``QM_NODE_LOG_*`` and ``QM_TASK_LOG_MAX_BYTES`` (serving task logs to admission:
``services.node_agent.logserver``), the metrics settings of ``services.metrics_http``,
the auth keys that check who reads either (without them the agent serves neither), plus
the ``QM_KAFKA_*``, ``QM_TOPICS`` and ``OTEL_*`` settings read by ``libs``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import pynvml
from qm.v1 import events_pb2, types_pb2

from libs.auth import Keys
from libs.auth.keyfiles import fingerprint
from libs.bus import (
    EventConsumer,
    EventProducer,
    KafkaBus,
    KafkaSettings,
    Topics,
    load_topic_config,
)
from libs.config.document import ConfigError
from libs.config.inventory import node_address
from libs.core.compass import CacheModel
from libs.events.envelope import DEFAULT_CLUSTER
from libs.telemetry import setup_tracing
from libs.trust import NodeKeys
from services.grpc_server import STOP_GRACE_S
from services.metrics_http import MetricsSettings, metrics_keys, metrics_server
from services.node_agent import privileges
from services.node_agent.agent import DEFAULT_SAMPLE_S, NodeAgent, serve
from services.node_agent.executors import ProcessExecutor, SimulatedExecutor
from services.node_agent.idle import IdleThresholds
from services.node_agent.inventory import (
    DECLARED_ADDRESS,
    DEFAULT_INVENTORY,
    load_inventory,
    nvml_inventory,
    select_nodes,
)
from services.node_agent.logserver import LogSettings, serve_logs
from services.node_agent.orphans import TaskRecords, adopt
from services.node_agent.registration import DEFAULT_HEARTBEAT_S
from services.node_agent.sandbox import Sandbox
from services.node_agent.secrets import SecretStore
from services.node_agent.serving import DEFAULT_HOST_TO_GPU_MB_PER_MS
from services.node_agent.tasklogs import TaskLogs
from services.node_agent.utilization import nvml_session, sampler_for
from services.runtime import configure_logging

DEFAULT_LOG_DIR = Path(".local/logs/tasks")
_IDLE = IdleThresholds()
# Finite numbers whose default the environment may set: flag, variable, default, help.
_NUMBERS_FROM_ENV: tuple[tuple[str, str, float, str], ...] = (
    (
        "--idle-threshold",
        "QM_IDLE_THRESHOLD",
        _IDLE.idle_below,
        "a task is idle once its mean GPU utilisation (0..1) over the window is below "
        "this; 0 turns idle detection off",
    ),
    (
        "--busy-threshold",
        "QM_BUSY_THRESHOLD",
        _IDLE.busy_above,
        "an idle task is busy again once that mean is above this",
    ),
    (
        "--idle-window-seconds",
        "QM_IDLE_WINDOW_SECONDS",
        _IDLE.window_s,
        "the window the mean is taken over",
    ),
    (
        "--sample-seconds",
        "QM_SAMPLE_SECONDS",
        DEFAULT_SAMPLE_S,
        "time between GPU utilisation samples",
    ),
    (
        "--host-to-gpu-mb-per-ms",
        "QM_HOST_TO_GPU_MB_PER_MS",
        DEFAULT_HOST_TO_GPU_MB_PER_MS,
        "host-to-GPU bandwidth for a workflow task's model load, in MB per ms: a "
        "simulated load takes model MB / this",
    ),
)


def _finite(text: str) -> float:
    """A float flag's value; argparse puts the flag's name before the error."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _address(text: str) -> str:
    """An address flag's value; argparse puts the flag's name before the error."""
    try:
        return node_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m services.node_agent",
        description="Register nodes with Quartermaster and run the tasks placed on them.",
    )
    parser.add_argument(
        "--nodes",
        type=Path,
        default=Path(os.environ.get("QM_NODES", DEFAULT_INVENTORY)),
        help="declared inventory file (env QM_NODES; default: %(default)s)",
    )
    parser.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="ID",
        help="host this node (repeatable; default: every node in the file). "
        "With --nvml: the node id (default: --name)",
    )
    parser.add_argument(
        "--nvml", action="store_true", help="read this machine's GPUs from NVML instead"
    )
    parser.add_argument(
        "--cluster", default=DEFAULT_CLUSTER, help="the NVML node's cluster (default: %(default)s)"
    )
    parser.add_argument(
        "--workflows-only",
        action="store_true",
        help="the NVML node is a serving node: it takes workflow tasks, never a batch job "
        "(a declared node says so in its inventory: workflows_only)",
    )
    parser.add_argument(
        "--address",
        type=_address,
        # From the environment through the type too, so a bad one is named.
        default=os.environ.get("QM_NODE_ADDRESS") or None,
        help="where other nodes reach this agent's nodes (host name or IP): a multi-node job's "
        "parts rendezvous there; a declared node's address in the file comes first "
        f"(env QM_NODE_ADDRESS; default: {DECLARED_ADDRESS} for declared nodes, this "
        "machine's host name with --nvml)",
    )
    parser.add_argument(
        "--name",
        default=socket.gethostname(),
        help="this agent's name; its consumer group is qm-node-agent-NAME (default: hostname)",
    )
    parser.add_argument(
        "--show-keys",
        action="store_true",
        help="print each node's key fingerprint (made on first use) and exit: compare it "
        "with `qm node pending` before `qm node approve`",
    )
    parser.add_argument(
        "--stop-tasks-on-exit",
        action="store_true",
        help="stop the tasks as the agent stops (by default they run on under their "
        "keepers, and the next agent on this machine takes them back; drain the node "
        "first to move its work elsewhere)",
    )
    parser.add_argument(
        "--grace-seconds",
        type=_finite,
        default=10.0,
        help="time a stopped task gets between SIGTERM and SIGKILL (default: %(default)s)",
    )
    for flag, env, default, text in _NUMBERS_FROM_ENV:
        parser.add_argument(
            flag,
            type=_finite,
            # A default from the environment goes through the type too, so a bad one is named.
            default=os.environ.get(env, str(default)),
            help=f"{text} (env {env}; default: %(default)s)",
        )
    parser.add_argument(
        "--cache-model",
        metavar="{" + ",".join(m.value for m in CacheModel) + "}",
        default=os.environ.get("QM_CACHE_MODEL", CacheModel.LOOKAHEAD.value),
        help="how each GPU's model cache makes room: lookahead (the model needed furthest "
        "ahead, free) or fifo-cost (first loaded first, each eviction costing its "
        "transfer); say the same as placement's serving_cache_model "
        "(env QM_CACHE_MODEL; default: %(default)s)",
    )
    parser.add_argument(
        "--heartbeat-seconds",
        type=float,
        default=os.environ.get("QM_HEARTBEAT_SECONDS", str(DEFAULT_HEARTBEAT_S)),
        help="how often each node says it is alive; placement declares a silent node lost "
        "(env QM_HEARTBEAT_SECONDS; 0: never; default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if not args.heartbeat_seconds >= 0:
        parser.error("--heartbeat-seconds must be >= 0")
    if args.nvml and len(args.node) > 1:
        parser.error("--nvml reads this one machine: give at most one --node")
    if args.grace_seconds < 0:
        parser.error("--grace-seconds must be >= 0")
    if args.sample_seconds <= 0:
        parser.error("--sample-seconds must be > 0")
    if args.host_to_gpu_mb_per_ms <= 0:
        parser.error("--host-to-gpu-mb-per-ms must be > 0")
    try:
        args.cache_model = CacheModel(args.cache_model)  # the environment's too
    except ValueError:
        models = " or ".join(m.value for m in CacheModel)
        parser.error(
            f"--cache-model (or QM_CACHE_MODEL): expected {models}, got {args.cache_model!r}"
        )
    try:
        args.idle = IdleThresholds(
            args.idle_threshold, args.busy_threshold, args.idle_window_seconds
        )
    except ValueError as exc:
        parser.error(str(exc))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging("node-agent")
    try:
        nodes = _nodes(args)
        settings, topics = KafkaSettings.from_env(), load_topic_config()
        logs, metrics = LogSettings.from_env(), MetricsSettings.from_env()
        sandbox = Sandbox.from_env()
        state_dir = Path(os.environ.get("QM_NODE_STATE_DIR") or ".local/run")
        records = TaskRecords(state_dir / f"node-agent-{args.name}")
        # Each node's own key, made on its first start; the private half never leaves here.
        node_keys = NodeKeys(
            Path(os.environ.get("QM_NODE_KEY_DIR") or state_dir / "keys"),
            [node.node_id for node in nodes],
        )
        if args.show_keys:
            for node in nodes:
                print(f"{node.node_id}\t{fingerprint(node_keys[node.node_id].public)}")
            return 0
        processes = ProcessExecutor(
            TaskLogs(
                Path(os.environ.get("QM_TASK_LOG_DIR", DEFAULT_LOG_DIR)), max_bytes=logs.max_bytes
            ),
            sandbox=sandbox,
            grace_s=args.grace_seconds,
            secrets=SecretStore.from_env(),
            records=records,
        )
        if any(node.executor == types_pb2.EXECUTOR_PROCESS for node in nodes):
            processes.prepare()  # simulated nodes run no command: no folder, no account
        # Who may read its task logs and metrics (None: no secret here, neither is served).
        keys = metrics_keys()
        tracing = setup_tracing("node-agent")
    except ConfigError as exc:
        print(f"node-agent: {exc}", file=sys.stderr)
        return 2
    try:
        # Initialised while the agent runs, for the utilisation sampler.
        with nvml_session(pynvml) if args.nvml else contextlib.nullcontext():
            asyncio.run(
                _run(
                    args,
                    nodes,
                    settings,
                    topics,
                    sandbox,
                    processes,
                    records,
                    logs,
                    keys,
                    metrics,
                    node_keys,
                )
            )
    finally:
        tracing.shutdown()
    return 0


def _nodes(args: argparse.Namespace) -> list[types_pb2.NodeInventory]:
    if args.nvml:
        node_id = args.node[0] if args.node else args.name
        return [
            nvml_inventory(
                node_id,
                cluster=args.cluster,
                nvml=pynvml,
                workflows_only=args.workflows_only,
                address=args.address,
            )
        ]
    declared = load_inventory(args.nodes, address=args.address or DECLARED_ADDRESS)
    return select_nodes(declared, args.node)


async def _run(
    args: argparse.Namespace,
    nodes: list[types_pb2.NodeInventory],
    settings: KafkaSettings,
    topics: Topics,
    sandbox: Sandbox,
    processes: ProcessExecutor,
    records: TaskRecords,
    logs: LogSettings,
    keys: Keys | None,
    metrics: MetricsSettings,
    node_keys: NodeKeys,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    client = f"qm-node-agent-{args.name}"
    # Before registering: what an earlier agent left running is taken back, or killed
    # where it cannot be (a new incarnation tells placement those tasks are gone).
    process_nodes = [n.node_id for n in nodes if n.executor == types_pb2.EXECUTOR_PROCESS]
    adoption = adopt(records, process_nodes, [n.node_id for n in nodes])
    if os.geteuid() == 0 and sandbox.containers is not None:
        # Rootful podman makes namespaces, mounts and devices: it needs root whole.
        logging.getLogger(__name__).warning(
            "root: keeps every capability: this node runs images (containers: in %s)",
            os.environ.get("QM_SANDBOX", "the sandbox file"),
        )
    elif os.geteuid() == 0:
        kept = privileges.needed(cgroups=sandbox.cgroups is not None)
        privileges.keep_only(kept)
        logging.getLogger(__name__).info("root: kept only capabilities %s", sorted(kept))
    agent: NodeAgent | None = None
    serving_logs = await serve_logs(
        logs, processes.logs, lambda task_id: agent is not None and agent.runs_task(task_id), keys
    )
    bus = KafkaBus(settings)
    async with (
        contextlib.AsyncExitStack() as cleanup,
        EventProducer(bus, client_id=client, sealer=node_keys) as producer,
    ):
        if serving_logs is not None:
            cleanup.push_async_callback(serving_logs[0].stop, STOP_GRACE_S)

        async def emit(env: events_pb2.Envelope) -> None:
            await producer.send(topics.events.name, env, key=env.cluster)

        agent = NodeAgent(
            nodes,
            executors={
                types_pb2.EXECUTOR_PROCESS: processes,
                types_pb2.EXECUTOR_SIMULATED: SimulatedExecutor(),
            },
            emit=emit,
            samplers={node.node_id: sampler_for(node, pynvml) for node in nodes},
            idle=args.idle,
            sample_s=args.sample_seconds,
            host_to_gpu_mb_per_ms=args.host_to_gpu_mb_per_ms,
            cache_model=args.cache_model,
            heartbeat_s=args.heartbeat_seconds,
            log_endpoint=serving_logs[1] if serving_logs is not None else "",
            records=records,
            incarnations=adoption.incarnations,
            keep_tasks=not args.stop_tasks_on_exit,
        )
        await agent.take_back(adoption.records, processes)
        consumer = EventConsumer(
            bus,
            [topics.decisions.name],
            name=client,
            group_id=client,
            deadletter_topic=topics.deadletter.name,
            deadletter_producer=producer,
            # A new agent acts on decisions made from now on, not on the whole history.
            auto_offset_reset="latest",
        )
        ready = lambda: bool(consumer.client.assignment())  # noqa: E731
        async with metrics_server("node_agent", keys, ready, metrics):
            await serve(agent, consumer, stop)

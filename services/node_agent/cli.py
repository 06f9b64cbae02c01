"""Command line: which nodes to host, where their inventory comes from, then serve.

Environment: ``QM_NODES`` (inventory file), ``QM_TASK_LOG_DIR`` (task logs, default
``.local/logs/tasks``), plus the ``QM_KAFKA_*``, ``QM_TOPICS`` and ``OTEL_*`` settings
read by ``libs``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import pynvml
from qm.v1 import events_pb2, types_pb2

from libs.bus import EventConsumer, EventProducer, KafkaSettings, load_topic_config
from libs.events.envelope import DEFAULT_CLUSTER
from libs.telemetry import setup_tracing
from services.node_agent.agent import NodeAgent, serve
from services.node_agent.executors import ProcessExecutor, SimulatedExecutor
from services.node_agent.inventory import (
    DEFAULT_INVENTORY,
    InventoryError,
    load_inventory,
    nvml_inventory,
    select_nodes,
)

DEFAULT_LOG_DIR = Path(".local/logs/tasks")


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
        "--name",
        default=socket.gethostname(),
        help="this agent's name; its consumer group is qm-node-agent-NAME (default: hostname)",
    )
    parser.add_argument(
        "--grace-seconds",
        type=float,
        default=10.0,
        help="time a stopped task gets between SIGTERM and SIGKILL (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.nvml and len(args.node) > 1:
        parser.error("--nvml reads this one machine: give at most one --node")
    if args.grace_seconds < 0:
        parser.error("--grace-seconds must be >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        nodes = _nodes(args)
    except InventoryError as exc:
        print(f"node-agent: {exc}", file=sys.stderr)
        return 2
    tracing = setup_tracing("node-agent")
    try:
        asyncio.run(_run(args, nodes))
    finally:
        tracing.shutdown()
    return 0


def _nodes(args: argparse.Namespace) -> list[types_pb2.NodeInventory]:
    if args.nvml:
        node_id = args.node[0] if args.node else args.name
        return [nvml_inventory(node_id, cluster=args.cluster, nvml=pynvml)]
    return select_nodes(load_inventory(args.nodes), args.node)


async def _run(args: argparse.Namespace, nodes: list[types_pb2.NodeInventory]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    settings = KafkaSettings.from_env()
    topics = load_topic_config()
    client = f"qm-node-agent-{args.name}"
    log_dir = Path(os.environ.get("QM_TASK_LOG_DIR", DEFAULT_LOG_DIR))
    async with EventProducer(settings, client_id=client) as producer:

        async def emit(env: events_pb2.Envelope) -> None:
            await producer.send(topics.events.name, env, key=env.cluster)

        agent = NodeAgent(
            nodes,
            executors={
                types_pb2.EXECUTOR_PROCESS: ProcessExecutor(log_dir, grace_s=args.grace_seconds),
                types_pb2.EXECUTOR_SIMULATED: SimulatedExecutor(),
            },
            emit=emit,
        )
        consumer = EventConsumer(
            settings,
            [topics.decisions.name],
            name=client,
            group_id=client,
            deadletter_topic=topics.deadletter.name,
            deadletter_producer=producer,
            # A new agent acts on decisions made from now on, not on the whole history.
            auto_offset_reset="latest",
        )
        await serve(agent, consumer, stop)

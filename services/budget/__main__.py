"""``python -m services.budget``: serve the budget tree and balances.

Settings: ``QM_BUDGET_ADDR`` (listen address, default 127.0.0.1:50052),
``QM_BUDGET_TREE`` (YAML that seeds an empty log; default
deploy/local/budget.yaml), ``QM_CLUSTERS`` (comma-separated, default
``default``), ``QM_OPERATORS`` (comma-separated users who see every allocation's
usage, as in admission), the metrics settings of ``services.metrics_http``, plus the
Kafka and auth settings.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from pydantic import Field
from qm.v1 import budget_service_pb2, budget_service_pb2_grpc

from libs.auth import Keys, load_keys
from libs.bus import (
    EventProducer,
    KafkaBus,
    KafkaSettings,
    LogReader,
    Topics,
    load_topic_config,
)
from libs.config.budget import load_budget_tree
from libs.config.env import Address, EnvSettings, Names
from libs.trust import SigningKey
from services.budget.book import BudgetBook
from services.budget.server import BudgetServicer, publish_tree
from services.grpc_server import serve_until_cancelled
from services.metrics_http import MetricsSettings, metrics_server
from services.policy_file import policy_from_env
from services.runtime import cancel_and_wait, run_service
from services.trust import signing_key_from_env

log = logging.getLogger("budget")
_DEFAULT_TREE = Path(__file__).resolve().parents[2] / "deploy" / "local" / "budget.yaml"


class BudgetSettings(EnvSettings):
    address: Address = Field("127.0.0.1:50052", alias="QM_BUDGET_ADDR")
    tree: Path = Field(_DEFAULT_TREE, alias="QM_BUDGET_TREE")
    clusters: Names = Field(("default",), alias="QM_CLUSTERS")
    # Users who see every allocation's usage without managing the root, as in admission.
    operators: Names = Field((), alias="QM_OPERATORS")


async def serve() -> None:
    own, metrics = BudgetSettings.from_env(), MetricsSettings.from_env()
    settings, topics, keys = KafkaSettings.from_env(), load_topic_config(), load_keys()
    signer = signing_key_from_env("budget")
    serving = asyncio.Event()
    async with metrics_server("budget", keys, serving.is_set, metrics):
        await _serve(own, settings, topics, keys, signer, serving)


async def _serve(
    own: BudgetSettings,
    settings: KafkaSettings,
    topics: Topics,
    keys: Keys,
    signer: SigningKey,
    serving: asyncio.Event,
) -> None:
    clusters = list(own.clusters)
    book = BudgetBook.for_policy(policy_from_env())
    bus = KafkaBus(settings)
    reader = LogReader(bus, topics.events.name, name="budget-events")
    # Placement's TaskLost ends a charge no agent will end, and its ServingHeld and
    # ServingReleased charge serving's GPUs: the ledger folds those decisions too.
    decisions = LogReader(bus, topics.decisions.name, name="budget-decisions")
    producer = EventProducer(bus, client_id="budget", sealer=signer)
    await reader.start()
    await decisions.start()
    await producer.start()
    try:
        replayed = await reader.catch_up(book.apply)
        await decisions.catch_up(book.decided)
        log.info("folded %d events; tree version %d", replayed, book.version)
        if book.tree is None:
            tree = load_budget_tree(own.tree)
            await publish_tree(
                producer, topics.events.name, clusters, tree, 1, changed_by="budget", node=tree.root
            )
            book.adopt(tree, 1)
            log.info("seeded the budget tree from %s", own.tree)
        servicer = BudgetServicer(
            book,
            producer,
            topic=topics.events.name,
            clusters=clusters,
            keys=keys,
            operators=own.operators,
        )
        followers = asyncio.gather(reader.follow(book.apply), decisions.follow(book.decided))
        try:
            await serve_until_cancelled(
                own.address,
                [
                    lambda s: budget_service_pb2_grpc.add_BudgetServiceServicer_to_server(
                        servicer, s
                    )
                ],
                [budget_service_pb2.DESCRIPTOR.services_by_name["BudgetService"].full_name],
                serving,
            )
        finally:
            await cancel_and_wait(followers)
    finally:
        await reader.stop()
        await decisions.stop()
        await producer.stop()


def main() -> None:
    run_service("budget", serve)


if __name__ == "__main__":
    main()

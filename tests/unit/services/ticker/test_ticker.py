"""The ticker: ticks per cluster, a steady pace, failures survived, settings checked."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest
from aiokafka.errors import KafkaTimeoutError
from qm.v1 import events_pb2

from libs.config.document import ConfigError
from services.ticker.__main__ import TickerSettings
from services.ticker.service import run, tick


class MemoryProducer:
    """Keeps what is sent, with the loop time; fails the sends it is told to."""

    def __init__(self, failures: int = 0) -> None:
        self.sent: list[tuple[str, str | None, events_pb2.Envelope, float]] = []
        self.failures = failures

    async def send(self, topic: str, env: events_pb2.Envelope, *, key: str | None = None) -> None:
        if self.failures:
            self.failures -= 1
            raise KafkaTimeoutError()
        self.sent.append((topic, key, env, asyncio.get_running_loop().time()))


async def test_one_tick_per_cluster_keyed_by_cluster() -> None:
    producer = MemoryProducer()
    await tick(producer, "qm.events", ["east", "west"])
    assert [(topic, key) for topic, key, _, _ in producer.sent] == [
        ("qm.events", "east"),
        ("qm.events", "west"),
    ]
    east, west = (env for _, _, env, _ in producer.sent)
    assert (east.WhichOneof("payload"), east.producer, east.cluster) == (
        "clock_tick",
        "ticker",
        "east",
    )
    assert east.event_id != west.event_id
    assert east.occurred_at.seconds > 0


async def until_sent(producer: MemoryProducer, count: int, task: asyncio.Task[None]) -> None:
    async def enough() -> None:
        while len(producer.sent) < count:
            await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(enough(), 5)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_ticks_keep_a_steady_pace_until_cancelled() -> None:
    producer = MemoryProducer()
    task = asyncio.create_task(run(producer, "qm.events", ["default"], 0.05))
    await until_sent(producer, 4, task)
    times = [at for _, _, _, at in producer.sent]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(0.04 < gap < 0.5 for gap in gaps), gaps


async def test_a_failed_tick_is_logged_and_ticking_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = MemoryProducer(failures=2)
    task = asyncio.create_task(run(producer, "qm.events", ["default"], 0.01))
    with caplog.at_level(logging.WARNING, logger="services.ticker.service"):
        await until_sent(producer, 2, task)
    assert len([r for r in caplog.records if "tick not appended" in r.message]) == 2


def test_settings_from_the_environment() -> None:
    assert TickerSettings.from_env({}) == TickerSettings(clusters=("default",), tick_seconds=1.0)
    moved = TickerSettings.from_env({"QM_CLUSTERS": " east, ,west ", "QM_TICK_SECONDS": "0.25"})
    assert (moved.clusters, moved.tick_seconds) == (("east", "west"), 0.25)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0", 'expected a number > 0, got "0"'),
        ("-1", 'expected a number > 0, got "-1"'),
        ("soon", 'expected a number, got "soon"'),
        ("nan", 'expected a finite number, got "nan"'),
    ],
)
def test_a_bad_interval_is_refused_clearly(raw: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        TickerSettings.from_env({"QM_TICK_SECONDS": raw})
    assert str(caught.value) == f"environment: QM_TICK_SECONDS: {expected}"

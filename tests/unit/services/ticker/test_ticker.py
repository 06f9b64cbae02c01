"""The ticker: ticks per cluster, a steady pace, failures survived, settings checked."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from libs.bus import EventProducer
from libs.bus.memory import MemoryBus
from libs.config.document import ConfigError
from services.ticker.__main__ import TickerSettings
from services.ticker.service import PRODUCER, run, tick

TOPIC = "qm.events"


async def test_one_tick_per_cluster_keyed_by_cluster() -> None:
    bus = MemoryBus({TOPIC: 1})  # one partition: the records in the order sent
    await tick(EventProducer(bus, client_id=PRODUCER), TOPIC, ["east", "west"])
    assert [record.key for record in bus.records(TOPIC)] == [b"east", b"west"]
    east, west = bus.envelopes(TOPIC)
    assert (east.WhichOneof("payload"), east.producer, east.cluster) == (
        "clock_tick",
        "ticker",
        "east",
    )
    assert east.event_id != west.event_id
    assert east.occurred_at.seconds > 0


async def sent_at(bus: MemoryBus, count: int, task: asyncio.Task[None]) -> list[float]:
    """The loop time at which each of the first ``count`` ticks was written."""
    loop, times = asyncio.get_running_loop(), []
    try:
        while len(times) < count:
            await bus.until(lambda: len(bus.records(TOPIC)) > len(times))
            times.append(loop.time())
        return times
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_ticks_keep_a_steady_pace_until_cancelled() -> None:
    bus = MemoryBus()
    producer = EventProducer(bus, client_id=PRODUCER)
    task = asyncio.create_task(run(producer, TOPIC, ["default"], 0.05))
    times = await sent_at(bus, 4, task)
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(0.04 < gap < 0.5 for gap in gaps), gaps


async def test_a_failed_tick_is_logged_and_ticking_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = MemoryBus()
    bus.refusals = 2
    producer = EventProducer(bus, client_id=PRODUCER)
    task = asyncio.create_task(run(producer, TOPIC, ["default"], 0.01))
    with caplog.at_level(logging.WARNING, logger="services.ticker.service"):
        await sent_at(bus, 2, task)
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

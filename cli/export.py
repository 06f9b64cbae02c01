"""``qm export``: a window of the live log as an event log the simulator replays.

Reads the events topic directly (``QM_KAFKA_*`` settings and ``QM_TOPICS``, as
``qm audit verify`` does; the auditor's account may read it), so that real history
can be replayed under another policy: ``qm sim run --trace eventlog --trace-path FILE``.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from qm.v1 import events_pb2
from rich.console import Console

from cli.log_access import reading_the_log
from cli.progress import counting
from cli.render import fail
from libs.bus import KafkaBus, KafkaSettings, LogReader, load_topic_config
from libs.config.document import ConfigError
from libs.config.duration import parse_moment
from libs.events import event_type, logfile
from libs.sim.traces.eventlog import Excerpt

console = Console(stderr=True)  # stdout stays empty: the log goes to --out


def export(
    since: Annotated[
        str,
        typer.Option(
            metavar="WHEN",
            help="Jobs submitted from then on: a duration ago (2h, 1d) or a timestamp "
            "(2026-12-04T06:00:00Z; UTC unless it names a zone)",
        ),
    ],
    out: Annotated[
        Path, typer.Option(dir_okay=False, help="The event log to write (replaced whole)")
    ],
    until: Annotated[
        str | None,
        typer.Option(metavar="WHEN", show_default="now", help="...and submitted before then"),
    ] = None,
) -> None:
    """Write the jobs submitted in a window, with the cluster and budget tree at its start,
    as an event log: replay it with qm sim run --trace eventlog --trace-path FILE --policy P.

    A job replays its recorded run, one that ends after --until too; qm sim run leaves out
    a job with none to replay, and says why.
    """
    now = time.time()
    try:
        start = parse_moment(since, now)
        end = parse_moment(until, now) if until is not None else now
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if end <= start:
        raise typer.BadParameter("--until is not after --since", param_hint="--until")
    if not out.parent.is_dir():  # said before the log is read, not after
        raise typer.BadParameter(f"{out.parent} is not a folder", param_hint="--out")
    try:
        topics = load_topic_config()
        kafka = KafkaSettings.from_env()
    except ConfigError as exc:
        raise fail(exc) from exc
    window = Excerpt(start, end)  # cut as it is read: only what it keeps is held
    with reading_the_log(kafka), counting(console, "events read", None) as advance:
        asyncio.run(_read(kafka, topics.events.name, window, advance))
    cut = window.envelopes()
    jobs = sum(event_type(env) == "job_admitted" for env in cut)
    if not jobs:
        raise fail(f"no job was submitted in the window; {out} is not written", 1)
    _write(out, cut)
    console.print(
        f"wrote {len(cut)} events ({jobs} jobs) of {window.read} to {out}; replay them with: "
        f"qm sim run --trace eventlog --trace-path {out} --policy POLICY",
        highlight=False,
        soft_wrap=True,
    )


async def _read(
    kafka: KafkaSettings, topic: str, window: Excerpt, advance: Callable[[int], None]
) -> None:
    """Every envelope of the topic, up to its end when the reading began, into ``window``."""

    def keep(env: events_pb2.Envelope) -> None:
        window.add(env)
        advance(1)

    reader = LogReader(KafkaBus(kafka), topic)
    try:  # stopped even when it does not start: no client is left open
        await reader.start()
        await reader.catch_up(keep)
    finally:
        await reader.stop()


def _write(out: Path, envelopes: list[events_pb2.Envelope]) -> None:
    """Write beside ``out``, then rename: a failed export leaves no half-written log."""
    try:
        handle, temporary = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
        os.close(handle)
        try:
            logfile.write_log(Path(temporary), envelopes)
            os.replace(temporary, out)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot write {out}: {exc.strerror}", param_hint="--out"
        ) from None

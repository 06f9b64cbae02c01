"""``qm audit``: replay the event log and check that every decision reproduces.

Reads Kafka directly (``QM_KAFKA_*`` settings and ``QM_TOPICS``, as the services
do), so it needs no running service and no token.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from google.protobuf import text_format
from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2
from rich.markup import escape
from rich.table import Table

from cli.groups import group
from cli.log_access import reading_the_log
from cli.output import Document, Format, OutputFlag, message, stdout_console, write
from cli.params import input_file
from cli.progress import tallies
from cli.render import errors, fail
from libs.audit import AuditResult, Divergence, OtherRelease, audit_parallel, policy_commits
from libs.bus import KafkaSettings, load_topic_config
from libs.config.document import ConfigError
from libs.config.policy import load_policy
from libs.core import POLICY, POLICY_VERSION, PolicyConfig
from libs.events.snapshot import SnapshotError
from libs.trust import load_trust

audit_app = group("Replay the log and check the decisions.")
console = stdout_console()


@audit_app.command()
def verify(
    policy: Annotated[
        Path | None,
        input_file(
            "Policy settings (YAML) placement runs with; defaults if omitted",
            envvar="QM_POLICY_FILE",
        ),
    ] = None,
    trust: Annotated[
        Path | None,
        input_file(
            "The trust file placement checks each input's signer with: the audit refuses "
            "what it refused",
            envvar="QM_TRUST_FILE",
        ),
    ] = None,
    cluster: Annotated[
        list[str] | None, typer.Option(help="Only the partitions holding this cluster (repeat)")
    ] = None,
    group: Annotated[
        str,
        typer.Option(
            envvar="QM_PLACEMENT_GROUP",
            help="Placement's consumer group: the audit stops where it has committed",
        ),
    ] = "qm-placement",
    from_snapshot: Annotated[
        bool,
        typer.Option(
            "--from-snapshot",
            help="Start each partition from placement's latest snapshot (checked as it "
            "loads) and replay only what follows it; without it, the replay checks the "
            "snapshot when it passes its offset",
        ),
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=256,
            help="Processes replaying input partitions side by side "
            "[default: one per core, at most one per partition]",
            show_default=False,
        ),
    ] = None,
    output: OutputFlag = Format.TABLE,
) -> None:
    """Replay every input through the scheduler; compare with the recorded decisions.

    Decisions another policy version made are not replayed: the audit names the
    release that made them (version and commit), which is the one to audit them with.

    Exits 0 when every decision reproduced (and every snapshot checked matched), 1
    when one did not, 3 when all it checked reproduced but some were another policy
    version's. -o json|yaml: {"ok", "complete", "inputs", "checked", "reproduced",
    "events_per_s", "policy", "policy_version", "config": [{"knob", "log",
    "replay"}], "snapshots": [{"partition", "offset", "ok", "differing"}],
    "started_from": [{"partition", "offset"}], "other_releases": [{"partition",
    "policy", "policy_version", "release", "commits", "first_offset", "last_offset",
    "decisions"}], "divergence": null or {"partition", "input_offset", "index",
    "difference", "fields", "replayed", "recorded"} (envelopes as qm.v1.Envelope, or
    null)}.
    """
    try:
        config = load_policy(policy) if policy else PolicyConfig()
        topics = load_topic_config()
        kafka = KafkaSettings.from_env()
        if trust is not None:
            load_trust(trust)  # a bad one is said here, once, not by each worker
    except ConfigError as exc:
        raise fail(exc) from exc
    started = time.monotonic()
    try:
        # A bar for a person watching: not under -o json|yaml, nor into a pipe.
        shown = console.is_terminal and output is Format.TABLE
        with reading_the_log(kafka), tallies(console, shown=shown) as progress:
            result = audit_parallel(
                kafka,
                topics,
                config,
                group=group,
                clusters=cluster or (),
                progress=progress,
                from_snapshots=from_snapshot,
                workers=workers,
                trust=trust,
            )
    except SnapshotError as exc:
        raise fail(
            f"placement's snapshot does not load: {exc}; audit without --from-snapshot"
        ) from exc
    elapsed = time.monotonic() - started
    rate = (result.inputs + result.checked) / elapsed if elapsed > 0 else 0.0
    starts = ", ".join(f"partition {p} from offset {o}" for p, o in result.started_from)
    errors.print(
        f"{result.inputs} events replayed and {result.checked} decisions checked in "
        f"{elapsed:.1f} s ({rate:,.0f} events/s)" + (f"; {starts} (snapshots)" if starts else "")
    )
    if trust is None:
        errors.print(
            "[yellow]no trust file (--trust, QM_TRUST_FILE): the inputs were replayed "
            "without checking who signed them, so the audit diverges where placement "
            "refused one for its signer[/]"
        )
    if output is not Format.TABLE:
        write(output, report(result, rate))
        _exit(result)
        return
    for check in result.snapshots:
        console.print(
            f"[green]snapshot of partition {check.partition} at offset {check.offset}: "
            "its state is the replay's[/]"
            if check.ok
            else f"[red]snapshot of partition {check.partition} at offset {check.offset}: "
            f"its state is not the replay's for {', '.join(check.differing)}[/]"
        )
    for other in result.others:
        _show_other(other)
    if result.ok:
        mine = f" of {POLICY} v{POLICY_VERSION}" if result.others else ""
        console.print(f"[green]{result.checked} decisions{mine}, {result.reproduced} reproduced[/]")
        _exit(result)
        return
    if result.config:
        # Said first: under other knobs, every divergence that follows is expected.
        console.print(
            "[red]configuration differs from the log's: "
            + escape("; ".join(d.describe("log", "replay") for d in result.config))
            + "[/]\n[yellow]audit with the policy file placement ran with (--policy, "
            "QM_POLICY_FILE)[/]",
            highlight=False,
        )
    if result.divergence is not None:
        _show_divergence(result, result.divergence)
    _exit(result)


def _exit(result: AuditResult) -> None:
    if not result.ok:
        raise typer.Exit(1)
    if not result.complete:
        raise typer.Exit(3)


def _show_other(other: OtherRelease) -> None:
    by = f"{other.policy} v{other.policy_version}"
    console.print(
        f"[yellow]{other.decisions} decisions of partition {other.partition} (inputs "
        f"{other.first_offset} to {other.last_offset}) were made by {escape(by)}, not "
        f"this release's {POLICY} v{POLICY_VERSION}: not checked; "
        + (
            f"audit them with release {escape(other.release)}"
            if other.release
            else "they name no release (they predate that): " + _commits_text(other.policy_version)
        )
        + "[/]",
        highlight=False,
    )


def _commits_text(version: int) -> str:
    commits = policy_commits(version)
    if commits is None:
        return f"docs/policy-versions.md lists the commits of v{version}"
    first, last = commits
    return f"audit them with a checkout of commit {last} (v{version}: {first} to {last})"


def report(result: AuditResult, events_per_s: float) -> Document:
    """The verdict as a document (see ``verify``'s help)."""
    found = result.divergence
    return {
        "ok": result.ok,
        "complete": result.complete,
        "inputs": result.inputs,
        "checked": result.checked,
        "reproduced": result.reproduced,
        "events_per_s": round(events_per_s, 1),
        "snapshots": [
            {
                "partition": s.partition,
                "offset": s.offset,
                "ok": s.ok,
                "differing": list(s.differing),
            }
            for s in result.snapshots
        ],
        "started_from": [{"partition": p, "offset": o} for p, o in result.started_from],
        "policy": POLICY,
        "policy_version": POLICY_VERSION,
        "config": [{"knob": d.name, "log": d.theirs, "replay": d.mine} for d in result.config],
        "other_releases": [
            {
                "partition": o.partition,
                "policy": o.policy,
                "policy_version": o.policy_version,
                "release": o.release or None,
                "commits": None
                if o.release or (commits := policy_commits(o.policy_version)) is None
                else list(commits),
                "first_offset": o.first_offset,
                "last_offset": o.last_offset,
                "decisions": o.decisions,
            }
            for o in result.others
        ],
        "divergence": None
        if found is None
        else {
            "partition": found.partition,
            "input_offset": found.input_offset,
            "index": found.index,
            "difference": found.difference.name.lower(),
            "fields": list(found.fields),
            "replayed": None if found.expected is None else message(found.expected),
            "recorded": None if found.recorded is None else message(found.recorded),
        },
    }


def _show_divergence(result: AuditResult, found: Divergence) -> None:
    console.print(
        f"[red]{result.checked} decisions checked, {result.reproduced} reproduced; "
        f"the first divergence is at partition {found.partition}, input offset "
        f"{found.input_offset}, decision #{found.index}: {found.difference.value}[/]"
    )
    if found.fields:
        console.print("differing fields: " + ", ".join(found.fields))
    table = Table(expand=True)
    table.add_column(f"replayed ({POLICY} v{POLICY_VERSION})", ratio=1)
    table.add_column("recorded", ratio=1)
    table.add_row(_text(found.expected), _text(found.recorded))
    console.print(table)
    if not result.config and any(f.endswith("provenance.config_digest") for f in found.fields):
        console.print(
            "[yellow]the log was decided under other knobs, and names them nowhere the audit "
            "read: audit it with the policy file placement ran with[/]"
        )


def _text(env: events_pb2.Envelope | None) -> str:
    if env is None:
        return "(none)"
    return text_format.MessageToString(env, as_utf8=True, message_formatter=_hex_digest)


def _hex_digest(message: Message, indent: int, as_one_line: bool) -> str | None:
    """Provenance with its digest in hex: escaped bytes are hard to compare by eye."""
    if not isinstance(message, types_pb2.Provenance) or as_one_line:
        return None
    rest = types_pb2.Provenance()
    rest.CopyFrom(message)
    rest.ClearField("state_digest")
    rest.ClearField("config_digest")
    lines = [f"state_digest: {message.state_digest.hex()}"]
    lines += [f"config_digest: {message.config_digest.hex()}"] if message.config_digest else []
    lines += text_format.MessageToString(rest, as_utf8=True).splitlines()
    return ("\n" + " " * indent).join(lines)

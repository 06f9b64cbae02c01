"""The audit replayer: decide the input log again and pair the result with the recorded log.

Fresh schedulers per input partition (one per cluster) fold that partition's
records through :func:`~libs.events.log_step.decide`, exactly as placement does,
and each recomputed decision must equal its recorded one byte for byte.

Recorded decisions are paired by their provenance. Outputs of one cluster go
to one decisions partition (keyed by cluster), in the order placement decided
them, so each (input partition, cluster) is one ordered stream on both sides;
streams are paired independently, and only the unpaired part of each is held.
The replay never reads ahead on its own: its driver feeds both logs, at any
interleaving, and may use :meth:`Replay.expected_waiting` and
:attr:`Replay.recorded_waiting` to keep the two sides close.

Placement's ``PolicyConfigured`` records are not decisions: they are not paired,
but compared with the replay's own knobs, so that a replay under other knobs says
which ones differ (:attr:`AuditResult.config`) besides where decisions diverge.

The release a decision names (``provenance.release``) is not replayed: any release
of one policy version decides alike, so it is left out of the comparison. Decisions
of another policy or version (named by their provenance, and from the
``PolicyConfigured`` that announced them) are not compared at all: they are counted
by the release that made them (:attr:`AuditResult.others`), which is the one to
replay them with, and the replay's own decisions for those inputs are set aside.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from qm.v1 import events_pb2

from libs.audit.divergence import Difference, Divergence, compare
from libs.core import (
    POLICY,
    POLICY_VERSION,
    KnobDifference,
    PolicyConfig,
    config_digest,
    knob_differences,
)
from libs.events import encode, event_type
from libs.events.log_step import PartitionSchedulers
from libs.trust import Gate

# (input offset, index among that input's decisions, decision, the bytes compared)
_Entry = tuple[int, int, events_pb2.Envelope, bytes]
_OURS = (POLICY, POLICY_VERSION)


@dataclass(frozen=True)
class SnapshotCheck:
    """A placement snapshot against the replay: its digests at its offset, cluster by
    cluster (``differing``: the clusters whose state is not the snapshot's)."""

    partition: int
    offset: int
    differing: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.differing


@dataclass(frozen=True)
class OtherRelease:
    """Decisions of one input partition that another policy version made, not checked:
    ``release`` reproduces them (empty for a log from before decisions named it)."""

    partition: int
    policy: str
    policy_version: int
    release: str
    first_offset: int  # input offsets of the first and last of them
    last_offset: int
    decisions: int


@dataclass(frozen=True)
class AuditResult:
    inputs: int  # input records replayed
    checked: int  # recorded decisions compared, the diverging one included
    reproduced: int
    divergence: Divergence | None
    # The knobs the log was first decided under that the replay's differ from, by name.
    config: tuple[KnobDifference, ...] = ()
    # Snapshots the replay passed, checked; and where a replay from snapshots began.
    snapshots: tuple[SnapshotCheck, ...] = ()
    started_from: tuple[tuple[int, int], ...] = ()  # (partition, offset)
    others: tuple[OtherRelease, ...] = ()  # decided by another policy version: unchecked

    @property
    def ok(self) -> bool:
        """Every decision checked reproduced, and every snapshot; decisions of another
        policy version are not checked and do not make a log wrong (see ``complete``)."""
        return self.divergence is None and not self.config and all(s.ok for s in self.snapshots)

    @property
    def complete(self) -> bool:
        """Every decision was this release's to check."""
        return not self.others


@dataclass
class _Stream:
    partition: int
    expected: deque[_Entry] = field(default_factory=deque)
    recorded: deque[_Entry] = field(default_factory=deque)
    last_recorded: tuple[int, int] = (-1, -1)  # (input offset, index) of the latest recorded
    # Where the log's deciding version changes: (input offset, ours?) in log order, a
    # mark whenever a PolicyConfigured or a decision says another than the latest.
    marks: list[tuple[int, bool]] = field(default_factory=list)
    mixed: bool = False  # some mark is another version's
    read_to: int = -1  # the input offset the log has named the decider of so far

    def mark(self, offset: int, ours: bool) -> None:
        self.read_to = max(self.read_to, offset)
        if not self.marks or self.marks[-1][1] != ours:
            self.marks.append((offset, ours))
            self.mixed |= not ours

    def ours(self, offset: int) -> bool:
        """Whether this release decided the input at ``offset``, as far as the log has
        said: the latest mark at or before it, else the first (inputs before a log's
        first decision decided nothing there, whichever version read them)."""
        if not self.marks:
            return True
        at = bisect.bisect_right(self.marks, (offset, True)) - 1
        return self.marks[max(at, 0)][1]


class Replay:
    """Feed inputs and recorded decisions in any interleaving; :meth:`finish` gives the verdict.

    ``bounds`` limits the audit to input offsets below ``bounds[partition]``
    (only the partitions named): what placement has committed so far. Recorded
    decisions of other inputs are ignored. After the first divergence every
    feed is ignored.

    A partition may start from a placement snapshot (:meth:`start_from`): the replay
    then decides, and pairs, only the inputs from its offset on. A snapshot may instead
    be checked (:meth:`check_snapshot`): when the replay reaches its offset, each
    cluster's state must hash to the snapshot's digest.
    """

    def __init__(
        self,
        config: PolicyConfig | None = None,
        *,
        bounds: Mapping[int, int] | None = None,
        gate: Gate | None = None,
    ) -> None:
        self._config = config or PolicyConfig()
        self._gate = gate  # placement's check of each input's signer: the same refusals
        self._bounds = dict(bounds) if bounds is not None else None
        self._schedulers: dict[int, PartitionSchedulers] = {}
        self._from: dict[int, int] = {}  # partition -> the snapshot offset it starts at
        self._snapshots: dict[int, tuple[int, Mapping[str, bytes]]] = {}  # to check
        self.snapshot_checks: list[SnapshotCheck] = []
        self._streams: dict[tuple[int, str], _Stream] = {}
        self._fed: dict[int, int] = {}  # partition -> latest input offset decided
        self._expected_waiting: dict[int, int] = {}
        self._inputs_ended = False
        self._recorded_ended = False
        self.recorded_waiting = 0
        self.inputs = 0
        self.checked = 0
        self.reproduced = 0
        self.divergence: Divergence | None = None
        self.config: tuple[KnobDifference, ...] = ()
        self._others: dict[tuple[int, str, int, str], list[int]] = {}  # -> [first, last, n]

    def feed_input(
        self, partition: int, offset: int, env: events_pb2.Envelope, record: bytes = b""
    ) -> None:
        """One input record (``env``, decoded from ``record``); a partition's records must
        come in offset order."""
        if self.divergence or not self._replayed(partition, offset):
            return
        self._reached(partition, offset)
        schedulers = self._schedulers.get(partition)
        if schedulers is None:
            schedulers = self._schedulers[partition] = PartitionSchedulers(
                self._config, gate=self._gate
            )
        outputs = schedulers.decide(env, partition=partition, offset=offset, record=record)
        self.inputs += 1
        self._fed[partition] = offset
        for index, out in enumerate(outputs):
            self._stream(partition, out.cluster).expected.append((offset, index, out, encode(out)))
        self._expected_waiting[partition] = self.expected_waiting(partition) + len(outputs)
        for stream in self._streams.values():
            if stream.partition == partition:
                self._pair(stream)

    def feed_recorded(self, env: events_pb2.Envelope) -> None:
        """One decoded record of the decisions topic, in its partition's order."""
        kind = event_type(env)
        if kind == "policy_configured":
            return self._configured(env.policy_configured, env.cluster)
        payload = getattr(env, kind)
        # Only decisions carry provenance; anything else on the topic is not placement's.
        if self.divergence or "provenance" not in payload.DESCRIPTOR.fields_by_name:
            return
        provenance = payload.provenance
        partition, offset = provenance.input_partition, provenance.input_offset
        if not self._replayed(partition, offset):
            return
        stream = self._stream(partition, env.cluster)
        version = (provenance.policy, provenance.policy_version)
        stream.mark(offset, version == _OURS)
        if version != _OURS:
            return self._other(partition, version, provenance.release, offset)
        release = provenance.release  # not replayed (the replay decides with none):
        provenance.ClearField("release")  # compared without it, and the caller's
        compared = encode(env)  # envelope left as it came
        provenance.release = release
        last_offset, last_index = stream.last_recorded
        index = last_index + 1 if offset == last_offset else 0
        stream.last_recorded = (offset, index)
        stream.recorded.append((offset, index, env, compared))
        self.recorded_waiting += 1
        self._pair(stream)

    def _other(self, partition: int, version: tuple[str, int], release: str, offset: int) -> None:
        tally = self._others.setdefault((partition, *version, release), [offset, offset, 0])
        tally[1] = offset
        tally[2] += 1

    def _configured(self, recorded: events_pb2.PolicyConfigured, cluster: str) -> None:
        """Placement's knobs from this input on: the first that differ from ours are kept."""
        partition, offset = recorded.input_partition, recorded.from_offset
        if not self._audited(partition, offset):
            return
        ours = (recorded.policy, recorded.policy_version) == _OURS
        self._stream(partition, cluster).mark(offset, ours)
        # Another version's knobs are its own: they differ from ours by design.
        if self.config or not ours:
            return
        digest = config_digest(self._config)
        if recorded.config_digest != digest:
            # Equal knobs under unequal digests: a writer that encodes them otherwise.
            self.config = knob_differences(recorded.knobs, self._config) or (
                KnobDifference("config_digest", recorded.config_digest.hex(), digest.hex()),
            )

    def start_from(self, partition: int, offset: int, schedulers: PartitionSchedulers) -> None:
        """Replay ``partition`` from ``offset`` on, with ``schedulers`` (a snapshot's)."""
        self._schedulers[partition] = schedulers
        self._from[partition] = offset

    def check_snapshot(self, partition: int, offset: int, digests: Mapping[str, bytes]) -> None:
        """Check, when the replay reaches ``offset``, that each cluster's state of
        ``partition`` hashes to ``digests`` (a snapshot's)."""
        self._snapshots[partition] = (offset, dict(digests))

    def _reached(self, partition: int, offset: int) -> None:
        """Before the input at ``offset``: check a snapshot taken at or before it."""
        due = self._snapshots.get(partition)
        if due is None or offset < due[0]:
            return
        del self._snapshots[partition]
        at, digests = due
        schedulers = self._schedulers.get(partition) or PartitionSchedulers(
            self._config, gate=self._gate
        )
        replayed = {c: s.digest() for c, s in schedulers.by_cluster.items()}
        differing = sorted(
            c for c in replayed.keys() | digests.keys() if replayed.get(c) != digests.get(c)
        )
        self.snapshot_checks.append(SnapshotCheck(partition, at, tuple(differing)))

    def expected_waiting(self, partition: int) -> int:
        """Recomputed decisions of one input partition not yet paired with recorded ones."""
        return self._expected_waiting.get(partition, 0)

    def end_inputs(self) -> None:
        """No more inputs: recorded decisions still unpaired are extra."""
        for partition, (offset, _) in sorted(self._snapshots.items()):
            if offset <= self._bounds_of(partition):
                self._reached(partition, offset)
        self._inputs_ended = True
        self._pair_all()

    def end_recorded(self) -> None:
        """No more recorded decisions: recomputed ones still unpaired are missing."""
        self._recorded_ended = True
        self._pair_all()

    def finish(self) -> AuditResult:
        self.end_inputs()
        self.end_recorded()
        return AuditResult(
            self.inputs,
            self.checked,
            self.reproduced,
            self.divergence,
            self.config,
            tuple(self.snapshot_checks),
            tuple(sorted(self._from.items())),
            tuple(
                OtherRelease(partition, policy, version, release, *tally)
                for (partition, policy, version, release), tally in sorted(self._others.items())
            ),
        )

    def _audited(self, partition: int, offset: int) -> bool:
        return offset < self._bounds_of(partition)

    def _bounds_of(self, partition: int) -> float:
        return math.inf if self._bounds is None else self._bounds.get(partition, 0)

    def _replayed(self, partition: int, offset: int) -> bool:
        """Within the audit, and not before where the partition's replay starts."""
        return self._audited(partition, offset) and offset >= self._from.get(partition, 0)

    def _stream(self, partition: int, cluster: str) -> _Stream:
        stream = self._streams.get((partition, cluster))
        if stream is None:
            stream = self._streams[(partition, cluster)] = _Stream(partition)
        return stream

    def _pair_all(self) -> None:
        # Several streams may diverge at once; the first by position is reported.
        for key in sorted(self._streams):
            self._pair(self._streams[key])

    def _set_aside(self, stream: _Stream) -> None:
        """Drop the replay's decisions for inputs another version decided on the log,
        once the log has named who decided them (it has read that far, or ended)."""
        while stream.expected:
            offset = stream.expected[0][0]
            if (offset > stream.read_to and not self._recorded_ended) or stream.ours(offset):
                return
            stream.expected.popleft()
            self._expected_waiting[stream.partition] -= 1

    def _pair(self, stream: _Stream) -> None:
        while not self.divergence:
            if stream.mixed:
                self._set_aside(stream)
            if not (stream.expected and stream.recorded):
                break
            mine, theirs = stream.expected[0], stream.recorded[0]
            if mine[:2] < theirs[:2]:  # the log went past it
                return self._diverge(stream, mine, Difference.MISSING, expected=mine[2])
            if theirs[:2] < mine[:2]:  # replay went past it
                return self._diverge(stream, theirs, Difference.EXTRA, recorded=theirs[2])
            if mine[3] != theirs[3]:
                # Judged once the input's recorded decisions are all in: with the
                # rest in sight, a gap or an insertion is told from a change.
                if self._recorded_ended or stream.recorded[-1][0] > mine[0]:
                    self._judge(stream, mine[0])
                return
            self._pop(stream)
            self.checked += 1
            self.reproduced += 1
        if self.divergence:
            return
        if stream.recorded and not stream.expected:
            theirs = stream.recorded[0]
            # Every decision of an input is queued when the input is fed.
            if self._inputs_ended or theirs[0] <= self._fed.get(stream.partition, -1):
                self._diverge(stream, theirs, Difference.EXTRA, recorded=theirs[2])
        elif stream.expected and not stream.recorded and self._recorded_ended:
            mine = stream.expected[0]
            self._diverge(stream, mine, Difference.MISSING, expected=mine[2])

    def _judge(self, stream: _Stream, offset: int) -> None:
        """The heads differ; the remaining decisions of the same input say how."""
        mine = [e for e in itertools.takewhile(lambda e: e[0] == offset, stream.expected)]
        theirs = [e for e in itertools.takewhile(lambda e: e[0] == offset, stream.recorded)]
        mine_bytes = [e[3] for e in mine]
        theirs_bytes = [e[3] for e in theirs]
        if theirs_bytes[0] in mine_bytes[1:]:
            self._diverge(stream, mine[0], Difference.MISSING, expected=mine[0][2])
        elif mine_bytes[0] in theirs_bytes[1:]:
            self._diverge(stream, theirs[0], Difference.EXTRA, recorded=theirs[0][2])
        else:
            difference, fields = compare(mine[0][2], theirs[0][2])
            self._diverge(stream, mine[0], difference, mine[0][2], theirs[0][2], fields)

    def _pop(self, stream: _Stream) -> None:
        stream.expected.popleft()
        stream.recorded.popleft()
        self._expected_waiting[stream.partition] -= 1
        self.recorded_waiting -= 1

    def _diverge(
        self,
        stream: _Stream,
        at: _Entry,
        difference: Difference,
        expected: events_pb2.Envelope | None = None,
        recorded: events_pb2.Envelope | None = None,
        fields: tuple[str, ...] = (),
    ) -> None:
        self.checked += 1
        self.divergence = Divergence(
            stream.partition, at[0], at[1], difference, expected, recorded, fields
        )


def audit_logs(
    inputs: Iterable[tuple[int, int, events_pb2.Envelope]],
    recorded: Iterable[events_pb2.Envelope],
    config: PolicyConfig | None = None,
) -> AuditResult:
    """Audit two logs held as iterables (files, tests), pulling recorded decisions as needed.

    Holds little when the recorded decisions come in input order, as they do
    for one partition.
    """
    audit = Replay(config)
    pending: Iterator[events_pb2.Envelope] = iter(recorded)
    for partition, offset, env in inputs:
        audit.feed_input(partition, offset, env)
        while audit.expected_waiting(partition) and not audit.divergence:
            decision = next(pending, None)
            if decision is None:
                break
            audit.feed_recorded(decision)
    for decision in pending:
        if audit.divergence:
            break
        audit.feed_recorded(decision)
    return audit.finish()

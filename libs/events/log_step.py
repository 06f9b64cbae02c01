"""One scheduler step on the log: an input envelope in, decision envelopes out.

The placement service and the audit replayer both call :func:`decide`, so a
replay of the same input yields the same output bytes. Everything in an output
envelope derives from the input: its id from the input position, its time
from the input's time, its producer from the policy (not the instance).

Whatever arrives, a step answers rather than raises (DESIGN.md 3.6): an envelope
that cannot become a core input is rejected or refused here, and a defect in the
core (it must never raise, and property tests hold it to that) is logged and
answered with a refusal, so one record can never stop a partition. Every output is
checked against the bus's record limit; one that would still not fit (the limits
make that impossible for anything the core writes today) becomes a rejection.

Each decision's provenance carries the digest of the knobs it was decided under
and the release that decided (:mod:`libs.events.release`); placement's
:class:`PartitionSchedulers` also announce the knobs themselves
(``PolicyConfigured``) before a cluster's first decision, so the log names them.
The release is the one thing in an output that is not derived from the input: a
replay decides with none and compares the recorded decisions without theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from qm.v1 import events_pb2, types_pb2

from libs.core import (
    POLICY,
    POLICY_VERSION,
    Decision,
    PolicyConfig,
    Refused,
    Reject,
    Scheduler,
    config_digest,
    knobs,
)
from libs.core.approvals import ApprovedKey
from libs.core.limits import MAX_RECORD_BYTES
from libs.events.convert import decision_payload, to_input
from libs.events.envelope import encode, event_type, new_envelope

log = logging.getLogger(__name__)

PRODUCER = "placement"


class Rejection(Protocol):
    """Why an input is not folded: ``code`` for programs, ``reason`` for people."""

    @property
    def code(self) -> str: ...

    @property
    def reason(self) -> str: ...


class InputGate(Protocol):
    """Checks who signed an input before it is folded (``libs/trust/gate.py``), given
    the state the log built: a node's approved key, the node a task runs on."""

    def check(
        self,
        env: events_pb2.Envelope,
        record: bytes,
        node_key: Callable[[str], ApprovedKey | None],
        task_node: Callable[[str, str], str | None],
    ) -> Rejection | None: ...


def step(scheduler: Scheduler, env: events_pb2.Envelope) -> list[Decision]:
    """The decisions one envelope causes: the core's, or the edge's answer to an
    envelope that cannot become a core input. Never raises."""
    core_input = to_input(env)
    if core_input is None:
        return []
    if isinstance(core_input, Reject | Refused):
        return [core_input]
    try:
        return scheduler.handle(core_input)
    except Exception as exc:  # a defect, not an input error: answer, log, go on
        log.exception("the scheduler raised on %s %s", event_type(env), env.event_id)
        return [Refused(event_type(env), f"internal error: {type(exc).__name__}")]


def decide(
    scheduler: Scheduler,
    env: events_pb2.Envelope,
    *,
    partition: int,
    offset: int,
    release: str = "",
    refused: Rejection | None = None,
) -> list[events_pb2.Envelope]:
    """The decision envelopes of one input; with ``refused`` (the gate's), the input is
    not folded and its one decision is the refusal."""
    if refused is not None:
        decisions: list[Decision] = [Refused(env.key_id or "unsigned", refused.reason)]
    else:
        decisions = step(scheduler, env)
    if not decisions:
        return []
    provenance = types_pb2.Provenance(
        input_partition=partition,
        input_offset=offset,
        state_digest=scheduler.digest(),
        policy=POLICY,
        policy_version=POLICY_VERSION,
        config_digest=config_digest(scheduler.config),
        release=release,
    )
    # The input's time to the microsecond (a datetime's), as the outputs have always had it.
    occurred = Timestamp()
    occurred.FromDatetime(env.occurred_at.ToDatetime())
    outputs = []
    for index, decision in enumerate(decisions):
        payload = _payload(decision, provenance, env)
        if refused is not None and isinstance(payload, events_pb2.InputRefused):
            payload.trust = refused.code
        out = new_envelope(
            payload,
            producer=PRODUCER,
            cluster=env.cluster,
            correlation_id=decision.job_id,
            causation_id=env.event_id,
            occurred=occurred,
            event_id=f"{env.cluster}-p{partition}-o{offset}-d{index}",
        )
        outputs.append(out if len(encode(out)) <= MAX_RECORD_BYTES else _too_large(out))
    return outputs


def policy_configured(
    config: PolicyConfig,
    env: events_pb2.Envelope,
    *,
    partition: int,
    offset: int,
    release: str = "",
) -> events_pb2.Envelope:
    """The record naming the knobs that decide ``env`` (at ``offset``) and what follows it."""
    announced = events_pb2.PolicyConfigured(
        input_partition=partition,
        from_offset=offset,
        policy=POLICY,
        policy_version=POLICY_VERSION,
        config_digest=config_digest(config),
        knobs=knobs(config),
        release=release,
    )
    return new_envelope(
        announced,
        producer=PRODUCER,
        cluster=env.cluster,
        causation_id=env.event_id,
        occurred=env.occurred_at.ToDatetime(),
        event_id=f"{env.cluster}-p{partition}-o{offset}-config",
    )


def _payload(
    decision: Decision, provenance: types_pb2.Provenance, env: events_pb2.Envelope
) -> Message:
    spec = env.job_admitted.spec if event_type(env) == "job_admitted" else None
    payload = decision_payload(decision, provenance, spec)
    if isinstance(payload, events_pb2.InputRefused):
        payload.event_id = env.event_id
        payload.kind = event_type(env)
    return payload


def _too_large(out: events_pb2.Envelope) -> events_pb2.Envelope:
    """The decision as a rejection of its job, which always fits: no spec, a short reason."""
    kind = event_type(out)
    size = len(encode(out))
    log.error("%s for %s is %d bytes, over the record limit", kind, out.correlation_id, size)
    rejected = events_pb2.JobRejected(
        job_id=out.correlation_id,
        field="spec",
        reason=f"its {kind} decision would be {size} bytes; records hold {MAX_RECORD_BYTES}",
        provenance=getattr(out, kind).provenance,
    )
    small = events_pb2.Envelope()
    small.CopyFrom(out)
    small.job_rejected.CopyFrom(rejected)  # setting the oneof clears the large payload
    return small


class PartitionSchedulers:
    """The schedulers of one input partition: one per cluster whose events land there.

    Clusters are keyed onto partitions by hash, so two may share one; each still
    gets a scheduler of its own and never sees the other's nodes.

    With a ``release`` (placement's), the decisions name it, and a cluster's first
    decisions from these schedulers are preceded by :func:`policy_configured`: they
    are made once per start (or assignment), so the knobs are on the log before
    anything decided under them, on the decisions partition those decisions go to.
    Without (a replay, a standby's fold), nothing is announced and no release named.
    """

    def __init__(
        self,
        config: PolicyConfig,
        *,
        release: str | None = None,
        by_cluster: dict[str, Scheduler] | None = None,
        gate: InputGate | None = None,
    ) -> None:
        self._config = config
        self._by_cluster: dict[str, Scheduler] = by_cluster if by_cluster is not None else {}
        self._release = release
        self._announced: set[str] = set()  # clusters whose knobs are on the log
        self._gate = gate

    def of(self, cluster: str) -> Scheduler:
        scheduler = self._by_cluster.get(cluster)
        if scheduler is None:
            scheduler = self._by_cluster[cluster] = Scheduler(self._config)
        return scheduler

    def get(self, cluster: str) -> Scheduler | None:
        return self._by_cluster.get(cluster)

    @property
    def config(self) -> PolicyConfig:
        return self._config

    @property
    def by_cluster(self) -> dict[str, Scheduler]:
        """Each cluster's scheduler (what a snapshot keeps)."""
        return self._by_cluster

    def announcing(self, release: str) -> PartitionSchedulers:
        """The same schedulers, deciding as ``release`` and announcing their knobs again
        before the next decisions (placement takes over a partition from a standby's
        fold or a snapshot)."""
        return PartitionSchedulers(
            self._config, release=release, by_cluster=self._by_cluster, gate=self._gate
        )

    def fold(self, env: events_pb2.Envelope, record: bytes = b"") -> None:
        """Fold the input ``env`` (from ``record``), as :meth:`decide` would, and write
        nothing: a standby's catching up."""
        scheduler = self.of(env.cluster)
        if self._gate is None or self._refusal(scheduler, env, record) is None:
            step(scheduler, env)

    def _refusal(
        self, scheduler: Scheduler, env: events_pb2.Envelope, record: bytes
    ) -> Rejection | None:
        assert self._gate is not None
        return self._gate.check(env, record, scheduler.node_key, scheduler.task_node)

    def decide(
        self, env: events_pb2.Envelope, *, partition: int, offset: int, record: bytes = b""
    ) -> list[events_pb2.Envelope]:
        """The decisions of the input ``env``, decoded from ``record`` (which the gate,
        when there is one, checks before anything is folded)."""
        release = self._release
        scheduler = self.of(env.cluster)
        refused = self._refusal(scheduler, env, record) if self._gate is not None else None
        outputs = decide(
            scheduler,
            env,
            partition=partition,
            offset=offset,
            release=release or "",
            refused=refused,
        )
        if not outputs or release is None or env.cluster in self._announced:
            return outputs
        self._announced.add(env.cluster)
        config = policy_configured(
            self._config, env, partition=partition, offset=offset, release=release
        )
        return [config, *outputs]

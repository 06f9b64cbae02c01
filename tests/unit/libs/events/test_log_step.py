"""The log-level step is deterministic: replaying inputs yields identical bytes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.core import PolicyConfig, Scheduler, config_digest, knobs
from libs.events import encode, event_type, new_envelope
from libs.events.log_step import PartitionSchedulers, decide

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _log() -> list[events_pb2.Envelope]:
    inventory = types_pb2.NodeInventory(
        node_id="n1", gpus=[types_pb2.Gpu(index=i, type="H100") for i in range(4)]
    )
    log = [
        new_envelope(events_pb2.NodeRegistered(inventory=inventory), producer="agent", occurred=T0)
    ]
    for i in range(6):
        spec = types_pb2.JobSpec(allocation="a", user="u", gpus=2, command=["true"])
        log.append(
            new_envelope(
                events_pb2.JobAdmitted(job_id=f"j{i}", spec=spec),
                producer="admission",
                occurred=T0 + timedelta(seconds=i),
            )
        )
    log.append(
        new_envelope(
            events_pb2.TaskFinished(job_id="j0", task_id="j0/0", node_id="n1"),
            producer="agent",
            occurred=T0 + timedelta(seconds=10),
        )
    )
    return log


def _replay(log: list[events_pb2.Envelope]) -> list[bytes]:
    scheduler = Scheduler()
    return [
        encode(out)
        for offset, env in enumerate(log)
        for out in decide(scheduler, env, partition=0, offset=offset)
    ]


def test_replay_is_byte_for_byte() -> None:
    log = _log()
    first, second = _replay(log), _replay(log)
    assert first == second and len(first) == 7


def test_outputs_carry_their_provenance() -> None:
    scheduler = Scheduler()
    log = _log()
    outputs = [
        out for o, env in enumerate(log) for out in decide(scheduler, env, partition=2, offset=o)
    ]
    placed = [out for out in outputs if event_type(out) == "task_placed"]
    assert [p.task_placed.provenance.input_offset for p in placed] == [1, 2, 7]
    assert placed[0].causation_id == log[1].event_id
    assert placed[0].event_id == "default-p2-o1-d0"
    assert placed[0].occurred_at == log[1].occurred_at
    assert len(placed[0].task_placed.provenance.state_digest) == 32
    assert placed[0].task_placed.provenance.config_digest == config_digest(PolicyConfig())


def test_other_knobs_are_told_by_the_provenance() -> None:
    log = _log()
    other = Scheduler(PolicyConfig(lookback_window_s=3600))
    decide(other, log[0], partition=0, offset=0)
    [placed] = decide(other, log[1], partition=0, offset=1)
    provenance = placed.task_placed.provenance
    assert provenance.config_digest == config_digest(other.config) != config_digest(PolicyConfig())


def test_placement_names_its_knobs_before_each_clusters_first_decision() -> None:
    config = PolicyConfig(node_lost_timeout_s=60)
    announcing = PartitionSchedulers(config, release="0.1.0+gtest")
    west = [_copy(env, cluster="west") for env in _log()]
    decided = [
        [event_type(out) for out in announcing.decide(env, partition=3, offset=offset)]
        for offset, env in enumerate([_log()[0], *_log()[1:3], west[0], west[1]])
    ]
    assert decided == [
        [],  # a node registered: nothing decided, nothing said yet
        ["policy_configured", "task_placed"],
        ["task_placed"],
        [],
        ["policy_configured", "task_placed"],
    ]
    [configured, pending] = PartitionSchedulers(config, release="0.1.0+gtest").decide(
        west[1], partition=3, offset=9
    )
    announced = configured.policy_configured
    assert (configured.cluster, configured.event_id) == ("west", "west-p3-o9-config")
    assert (announced.input_partition, announced.from_offset) == (3, 9)
    assert dict(announced.knobs) == knobs(config)
    assert announced.config_digest == config_digest(config)
    assert event_type(pending) == "job_pending"
    assert announced.release == pending.job_pending.provenance.release == "0.1.0+gtest"


def test_a_replays_decisions_name_no_release_and_announce_nothing() -> None:
    replaying = PartitionSchedulers(PolicyConfig())
    outputs = [
        out
        for o, env in enumerate(_log()[:3])
        for out in replaying.decide(env, partition=0, offset=o)
    ]
    assert [event_type(out) for out in outputs] == ["task_placed", "task_placed"]
    assert {out.task_placed.provenance.release for out in outputs} == {""}


def _copy(env: events_pb2.Envelope, *, cluster: str) -> events_pb2.Envelope:
    copy = events_pb2.Envelope()
    copy.CopyFrom(env)
    copy.cluster = cluster
    return copy


def test_clusters_sharing_a_partition_never_share_nodes() -> None:
    schedulers = PartitionSchedulers(PolicyConfig())
    inventory = types_pb2.NodeInventory(
        node_id="east-1", cluster="east", gpus=[types_pb2.Gpu(index=0, type="H100")]
    )
    east = new_envelope(
        events_pb2.NodeRegistered(inventory=inventory), producer="agent", cluster="east"
    )
    spec = types_pb2.JobSpec(allocation="a", user="u", gpus=1, command=["true"], cluster="west")
    west = new_envelope(
        events_pb2.JobAdmitted(job_id="w1", spec=spec), producer="x", cluster="west"
    )
    schedulers.decide(east, partition=0, offset=0)
    [pending] = schedulers.decide(west, partition=0, offset=1)
    assert event_type(pending) == "job_pending" and pending.cluster == "west"


def test_an_envelope_the_core_cannot_take_is_answered_not_raised() -> None:
    bad_tree = types_pb2.BudgetTree(nodes=[types_pb2.BudgetNode(name="root", weight=float("nan"))])
    env = new_envelope(events_pb2.BudgetChanged(tree=bad_tree), producer="budget", occurred=T0)
    [refused] = decide(Scheduler(), env, partition=0, offset=7)
    assert event_type(refused) == "input_refused"
    assert (refused.input_refused.event_id, refused.input_refused.kind) == (
        env.event_id,
        "budget_changed",
    )
    assert "weight must be > 0" in refused.input_refused.reason
    assert refused.input_refused.provenance.input_offset == 7


def test_a_defect_in_the_core_is_answered_and_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Scheduler, event: object) -> list[object]:
        raise KeyError("a bug")

    monkeypatch.setattr(Scheduler, "handle", broken)
    [refused] = decide(Scheduler(), _log()[1], partition=0, offset=1)
    assert refused.input_refused.reason == "internal error: KeyError"


def test_a_decision_too_large_for_a_record_becomes_a_rejection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = _log()
    monkeypatch.setattr("libs.events.log_step.MAX_RECORD_BYTES", 150)  # a placement is larger
    scheduler = Scheduler()
    decide(scheduler, log[0], partition=0, offset=0)
    [out] = decide(scheduler, log[1], partition=0, offset=1)
    assert event_type(out) == "job_rejected" and out.job_rejected.job_id == "j0"
    assert out.job_rejected.reason.startswith("its task_placed decision would be ")
    assert out.job_rejected.provenance.input_offset == 1


def test_a_node_whose_agent_keeps_its_caches_otherwise_is_refused_on_the_log() -> None:
    inventory = types_pb2.NodeInventory(node_id="n1", gpus=[types_pb2.Gpu(index=0, type="H100")])
    registered = events_pb2.NodeRegistered(inventory=inventory, cache_model="fifo-cost")
    env = new_envelope(registered, producer="agent", occurred=T0)
    [out] = decide(Scheduler(), env, partition=0, offset=0)
    assert event_type(out) == "input_refused"
    assert "start the agent with --cache-model lookahead" in out.input_refused.reason

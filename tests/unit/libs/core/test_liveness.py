"""Nodes hold leases: silence, restarts and what becomes of the work they ran."""

from __future__ import annotations

from libs.core import (
    CancelRequested,
    Decision,
    JobArrived,
    JobLost,
    NodeHeartbeat,
    NodeJoined,
    NodeLost,
    Place,
    PolicyConfig,
    Protection,
    Requeue,
    Scheduler,
    Stop,
    StopCause,
    TaskEnded,
    TaskLost,
    TaskStarted,
    Tick,
)
from tests.builders import job, node

TIMEOUT = PolicyConfig().node_lost_timeout_s


def joined(node_id: str, gpus: int = 8, *, at: float = 0, incarnation: str = "one") -> NodeJoined:
    return NodeJoined(at, node(node_id, gpus), incarnation, heartbeat_s=5)


def placed(decisions: list[Decision]) -> list[Place]:
    return [d for d in decisions if isinstance(d, Place)]


def of(kind: type, decisions: list[Decision]) -> list[Decision]:
    return [d for d in decisions if isinstance(d, kind)]


def ticks(s: Scheduler, start: float, end: float) -> list[Decision]:
    """The ticker's ticks, one a second from ``start`` to ``end``: time passing with
    the log flowing, as it does while only a node is silent."""
    return [d for at in range(int(start), int(end) + 1) for d in s.handle(Tick(at))]


def test_a_silent_node_is_declared_lost_on_the_logs_clock() -> None:
    s = Scheduler()
    s.handle(joined("n1"))
    s.handle(JobArrived(1, "j1", job(2, min_runtime_s=3600, resumable=True)))
    assert ticks(s, 2, TIMEOUT) == []  # silent exactly as long as allowed: still there
    decisions = s.handle(Tick(TIMEOUT + 1))
    assert decisions[0] == NodeLost("n1", "one", "no heartbeat for 31 s (node_lost_timeout_s 30)")
    [lost] = of(TaskLost, decisions)
    assert (lost.job_id, lost.task_id, lost.node_id) == ("j1", "j1/0", "n1")
    assert of(Requeue, decisions) == [
        Requeue("j1", f"node n1 lost: {decisions[0].reason}; requeued (resumable)")  # type: ignore[union-attr]
    ]
    # Its GPUs left with it: the requeued job waits for a node.
    assert placed(decisions) == []
    assert s.handle(joined("n2", at=TIMEOUT + 2))[0] == Place(
        "j1",
        "j1/1",
        "n2",
        (0, 1),
        job(2, min_runtime_s=3600, resumable=True),
        None,
        "one",
        Protection.BORROWED,  # no budget tree: no share of its own
    )


def test_heartbeats_keep_a_node_and_a_stale_incarnations_do_not() -> None:
    s = Scheduler()
    s.handle(joined("n1"))
    for at in range(5, 200, 5):
        assert s.handle(NodeHeartbeat(at, "n1", "one")) == []
    assert ticks(s, 196, 225) == []
    s.handle(NodeHeartbeat(225, "n1", "an-old-one"))
    assert of(NodeLost, ticks(s, 226, 231))


def test_a_node_without_heartbeats_has_no_lease() -> None:
    s = Scheduler()
    s.handle(NodeJoined(0, node("n1")))  # a declared node, as the simulator registers
    s.handle(JobArrived(1, "j1", job(1)))
    assert ticks(s, 2, 10 * TIMEOUT) == []


def test_a_job_that_is_not_resumable_ends_lost() -> None:
    s = Scheduler()
    s.handle(joined("n1"))
    s.handle(JobArrived(1, "j1", job(2, min_runtime_s=3600)))
    decisions = ticks(s, 2, TIMEOUT + 5)
    [lost] = of(JobLost, decisions)
    assert lost.reason.startswith("node n1 lost: no heartbeat for 31 s")  # type: ignore[union-attr]
    assert lost.reason.endswith("; not resumable")  # type: ignore[union-attr]
    # The agent's late word on the task changes nothing.
    assert s.handle(TaskEnded(TIMEOUT + 6, "j1", "j1/0", "n1", 0)) == []


def test_a_restarted_agent_loses_what_it_ran_and_its_gpus_come_back_free() -> None:
    s = Scheduler()
    s.handle(joined("n1", 4))
    s.handle(JobArrived(1, "j1", job(4)))
    s.handle(JobArrived(2, "j2", job(4)))  # waits: the node is full
    decisions = s.handle(joined("n1", 4, at=3, incarnation="two"))
    [lost] = of(TaskLost, decisions)
    assert lost.task_id == "j1/0" and "restarted" in lost.reason
    # j1 is free work and not resumable: over. j2 takes the node, for the new agent.
    assert of(JobLost, decisions) == [
        JobLost("j1", "the node agent on n1 restarted; not resumable")
    ]
    [place] = placed(decisions)
    assert (place.job_id, place.node_incarnation) == ("j2", "two")


def test_a_gang_loses_a_node_and_the_rest_of_it_is_stopped() -> None:
    s = Scheduler()
    s.handle(joined("n1"))
    s.handle(joined("n2"))
    s.handle(JobArrived(1, "g", job(16, min_runtime_s=3600, resumable=True)))
    decisions = [d for at in range(5, 40, 5) for d in s.handle(NodeHeartbeat(at, "n2", "one"))]
    assert [(d.task_id, d.node_id) for d in of(TaskLost, decisions)] == [("g/0.0", "n1")]
    [stop] = of(Stop, decisions)
    assert (stop.task_id, stop.node_id, stop.cause) == ("g/0.1", "n2", StopCause.NODE_LOST)
    assert of(Requeue, decisions) == []  # not before the rest has ended
    ended = s.handle(TaskEnded(41, "g", "g/0.1", "n2", -15))
    [requeued] = of(Requeue, ended)
    assert requeued.reason.startswith("node n1 lost: no heartbeat")  # type: ignore[union-attr]


def test_a_job_cancelled_on_a_node_that_went_silent_ends_when_the_node_is_lost() -> None:
    s = Scheduler()
    s.handle(joined("n1"))
    s.handle(JobArrived(1, "j1", job(1, min_runtime_s=600, resumable=True)))
    s.handle(TaskStarted(2, "j1", "j1/0", "n1"))
    [stop] = s.handle(CancelRequested(3, "j1"))
    assert stop.cause is StopCause.CANCELLED
    decisions = ticks(s, 4, TIMEOUT + 1)
    assert [type(d) for d in decisions] == [NodeLost, TaskLost]  # cancelled: not requeued
    assert s.explain("j1") is None  # nothing of it is left


def test_a_lost_node_that_registers_again_takes_work_again() -> None:
    s = Scheduler()
    s.handle(joined("n1", 2))
    assert of(NodeLost, ticks(s, 1, TIMEOUT + 1))
    assert s.handle(JobArrived(TIMEOUT + 2, "j1", job(2))) != []  # waits: no node
    [place] = placed(s.handle(joined("n1", 2, at=TIMEOUT + 3, incarnation="two")))
    assert (place.job_id, place.node_id, place.node_incarnation) == ("j1", "n1", "two")


def test_a_log_that_was_silent_longer_than_the_timeout_loses_no_node() -> None:
    """The broker was down for a minute: no heartbeat, but no tick or anything either."""
    s = Scheduler()
    s.handle(joined("n1"))
    s.handle(NodeHeartbeat(5, "n1", "one"))
    s.handle(JobArrived(6, "j1", job(1, min_runtime_s=600)))
    assert s.handle(Tick(66)) == []  # the first input after the outage
    assert s.handle(NodeHeartbeat(70, "n1", "one")) == []
    # A node that stays silent once the log flows again is still declared lost.
    assert ticks(s, 71, 100) == []
    lost = ticks(s, 101, 101)
    assert [type(d) for d in lost][:2] == [NodeLost, TaskLost]


def test_silence_before_a_log_outage_still_counts() -> None:
    """n2 went quiet 20 s before the broker went down for a minute: it has 10 s left."""
    s = Scheduler()
    s.handle(joined("n1"))
    s.handle(joined("n2"))
    for at in range(1, 21):
        s.handle(NodeHeartbeat(at, "n1", "one"))  # n2 says nothing from the start
    assert s.handle(Tick(80)) == []  # the log resumes after 60 s of nothing
    for at in range(81, 90):
        assert s.handle(NodeHeartbeat(at, "n1", "one")) == []
    lost = s.handle(NodeHeartbeat(91, "n1", "one"))
    assert [(type(d), d.node_id) for d in lost] == [(NodeLost, "n2")]  # type: ignore[union-attr]

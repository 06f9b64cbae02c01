"""The fold: one input applied to the declared state (``facts.py``), validated first.

``apply`` changes the state as the input says (a job arrives, a task ends, a node
joins, a user holds a job) and as the time it brings says (work past its time limit
stops, silent nodes are lost), and returns what that decided at once. It never
raises: an input it cannot act on is answered with a ``Reject`` (a job) or a
``Refused`` (anything else), and changes nothing. What the state now allows (placing,
preempting, telling) is the cycle's (``cycle/``), which ``Trigger`` tells how much of
a pass this input needs.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import NamedTuple

from libs.core import inputs
from libs.core.approvals import approved, revoked
from libs.core.cycle.tell import recheck_impossible
from libs.core.decisions import (
    Cancel,
    Decision,
    NodeLost,
    Refused,
    Reject,
    Stop,
    StopCause,
    TaskLost,
    Wait,
)
from libs.core.dependencies import Outcome
from libs.core.endings import judge, over, stop, task_ended
from libs.core.facts import Facts
from libs.core.ids import JobId, NodeId
from libs.core.limits import MAX_WORKFLOW_TASKS
from libs.core.model import WorkClass
from libs.core.queues import Waiting
from libs.core.validation import joined, rejection, validate_node
from libs.core.wait_reasons import WaitCode, WaitReason


class Trigger(NamedTuple):
    """What an input asks of the cycle that follows it."""

    clock_moved: bool  # time passed: contracts, leases and earmarks may have changed
    reported: bool  # it only reported on running batch work
    fast: bool  # a debug job arrived: the fast path may preempt at once
    budget_changed: bool  # the tree changed: every rank may have
    job_id: JobId | None  # a job that arrived or came back, and must hear why it waits


class Applied(NamedTuple):
    """The decisions an input made at once, and the pass it needs (None: none)."""

    decisions: list[Decision]
    trigger: Trigger | None


def apply(facts: Facts, event: inputs.Input) -> Applied:
    """Fold one input, and the time it brings, into ``facts``."""
    at = event.at
    facts.liveness.excuse_silence(at - facts.now)
    clock_moved = at > facts.now
    if clock_moved:
        facts.now = at
    decisions = _input(facts, event)
    if isinstance(decisions, Applied):
        return decisions
    if clock_moved:
        decisions += _time_out(facts)
    decisions += _expire_leases(facts)
    # A workflow task's report is serving's (its ownership outlives its start).
    reported = isinstance(event, inputs.TaskIdle | inputs.TaskCheckpointed) or (
        isinstance(event, inputs.TaskStarted)
        and not facts.serving.owns(event.task_id, event.node_id)
    )
    told = event.job_id if isinstance(event, _TOLD) else None
    fast = isinstance(event, inputs.JobArrived) and event.spec.work_class is WorkClass.DEBUG
    budget_changed = isinstance(event, inputs.BudgetSet)
    return Applied(decisions, Trigger(clock_moved, reported, fast, budget_changed, told))


_TOLD = (inputs.JobArrived, inputs.JobHeld, inputs.JobUpdated)


def _answered(*decisions: Decision) -> Applied:
    """An input answered on its own: no time is folded and no pass runs for it."""
    return Applied(list(decisions), None) if decisions else _NOTHING


_NOTHING = Applied([], None)  # never added to: ``cycle.run`` returns a list of its own


def _input(facts: Facts, event: inputs.Input) -> list[Decision] | Applied:
    """What the input itself decides; an ``Applied`` when it is answered on its own
    (refused, rejected, a duplicate, a heartbeat that lost no node)."""
    serving, now_ms = facts.serving, facts.now_ms
    match event:
        case inputs.JobArrived():
            return _arrived(facts, event)
        case inputs.NodeJoined():
            if violations := validate_node(event.node):
                return _answered(Refused(event.node.node_id, joined(violations)))
            if event.cache_model not in ("", facts.config.serving_cache_model):
                why = _other_caches(facts, event.cache_model)
                return _answered(Refused(event.node.node_id, why))
            return _register(facts, event) + recheck_impossible(facts)
        case inputs.NodeHeartbeat():
            facts.liveness.heard(event.node_id, event.incarnation, facts.now)
            # Only time passed unless a node was lost: the next tick's pass sees it.
            return _expire_leases(facts) or _answered()
        case inputs.TaskStarted() if serving.owns(event.task_id, event.node_id):
            serving.started(event.task_id, now_ms)
        case inputs.TaskStarted():
            facts.running.started(event.job_id, event.task_id, event.at)
        case inputs.TaskEnded() if serving.owns(event.task_id, event.node_id):
            return serving.ended(event.task_id, event.exit_code, now_ms)
        case inputs.TaskEnded():
            return task_ended(
                facts, event.job_id, event.task_id, event.node_id, event.at, event.exit_code
            )
        case inputs.TaskRefused():
            refused = serving.refused(event, now_ms)
            if refused is None:
                why = "a refusal of a task not queued on that GPU"
                return _answered(Refused(event.task_id, why))
            return refused
        case inputs.ModelLoaded():
            serving.loaded(event.node_id, event.gpu_index, event.model, event.size_mb)
        case inputs.ModelEvicted():
            serving.evicted(event.node_id, event.gpu_index, event.model)
        case inputs.PeerPlaced() | inputs.PeerPlanned() | inputs.PeerArrived():
            return _peer(facts, event)
        case inputs.TaskIdle():
            facts.running.idle(event.job_id, event.task_id, event.idle)
        case inputs.TaskCheckpointed():
            facts.running.checkpointed(event.job_id, event.task_id, event.at)
        case inputs.CancelRequested():
            served = serving.cancel(event.job_id, now_ms)
            return _cancel(facts, event.job_id) if served is None else served
        case inputs.JobHeld():
            return _hold(facts, event)
        case inputs.JobUpdated():
            return _update(facts, event)
        case inputs.NodeCordoned():
            return _cordon(facts, event)
        case inputs.NodeApproved():
            return _approve(facts, event)
        case inputs.NodeRevoked():
            return _revoke(facts, event)
        case inputs.BudgetSet():
            facts.charges.set_tree(event.tree)
            facts.running.changed()  # ranks changed
        case inputs.UsageSnapshot() if not all(math.isfinite(u) for _, u in event.usage):
            why = "charged GPU-seconds must be finite numbers"
            return _answered(Refused("usage snapshot", why))
        case inputs.UsageSnapshot():
            facts.charges.snapshot(event.at, dict(event.usage), facts.running.jobs.values())
    return []


def _arrived(facts: Facts, event: inputs.JobArrived) -> list[Decision] | Applied:
    if event.job_id in facts.seen:  # a duplicate submission: already decided
        return _answered()
    facts.seen[event.job_id] = None
    rejected = rejection(event.job_id, event.spec)
    if rejected is not None:
        return _answered(rejected, *over(facts, event.job_id, Outcome(False, "was rejected")))
    if event.spec.workflow is not None:
        return facts.serving.arrive(event.job_id, event.spec, facts.now_ms)
    facts.seq.value += 1
    return _arrive(facts, Waiting(event.job_id, event.spec, facts.seq.value, 0, event.at))


def _arrive(facts: Facts, job: Waiting) -> list[Decision] | Applied:
    """A batch job joins the queues, or waits for the jobs it names (``after``):
    rejected if one is unknown, cancelled if one already ended otherwise than asked."""
    after = job.spec.after
    if not after:
        facts.queues.push(job)
        return []
    unknown = [d.job_id for d in after if d.job_id == job.job_id or d.job_id not in facts.seen]
    if unknown:
        why = f"no job {unknown[0]} to wait for (only for jobs submitted before it)"
        rejected = over(facts, job.job_id, Outcome(False, "was rejected"))
        return _answered(Reject(job.job_id, "after", why), *rejected)
    facts.dependencies.block(job)
    return judge(facts, job)


def _peer(
    facts: Facts, event: inputs.PeerPlaced | inputs.PeerPlanned | inputs.PeerArrived
) -> list[Decision] | Applied:
    """What another planner did, read off the log late; never about a job of its own
    (its reports would be taken for this planner's)."""
    mine = event.job_id in facts.seen
    match event:
        case inputs.PeerPlaced() if not _finite_times(event.task):
            why = "a peer's task needs finite, non-negative times"
            return _answered(Refused(event.task.task_id, why))
        case inputs.PeerPlaced() if mine:
            return _answered(Refused(event.task.task_id, "a task of a job this planner schedules"))
        case inputs.PeerPlaced():
            facts.serving.peer_placed(event, facts.now_ms)
        case inputs.PeerPlanned() if len(event.tasks) > MAX_WORKFLOW_TASKS or not all(
            _finite_times(task) for task in event.tasks
        ):
            why = (
                f"a peer's plan needs at most {MAX_WORKFLOW_TASKS} tasks, with "
                "finite, non-negative sizes and times"
            )
            return _answered(Refused(event.job_id, why))
        case inputs.PeerPlanned() if mine:
            return _answered(Refused(event.job_id, "a job this planner schedules"))
        case inputs.PeerPlanned():
            facts.serving.peer_planned(event)
        case inputs.PeerArrived() if not (math.isfinite(event.work_ms) and event.work_ms >= 0):
            why = "a peer's workflow needs finite, non-negative work"
            return _answered(Refused(event.job_id, why))
        case inputs.PeerArrived() if mine:
            return _answered(Refused(event.job_id, "a job this planner schedules"))
        case inputs.PeerArrived():
            facts.serving.peer_arrived(event, facts.now_ms)
    return []


def _finite_times(task: inputs.PeerTask) -> bool:
    """A peer's task states finite, non-negative sizes and times."""
    return all(math.isfinite(v) and v >= 0 for v in (task.model_mb, task.run_ms, task.ready_ms))


def _time_out(facts: Facts) -> list[Decision]:
    """Stop the jobs that ran to their time limit: they end TIMEOUT."""
    decisions: list[Decision] = []
    for job_id in facts.running.past_deadline(facts.now):
        run = facts.running.jobs[job_id]
        why = f"reached its time limit of {run.spec.time_limit_s} s"
        decisions += stop(facts, run, StopCause.TIME_LIMIT, why)
    return decisions


def _cancel(facts: Facts, job_id: JobId) -> list[Decision]:
    cancelled = Outcome(False, "was cancelled")
    if facts.dequeue(job_id) is not None:
        return [Cancel(job_id, "cancelled before it started"), *over(facts, job_id, cancelled)]
    if facts.held.pop(job_id, None) is not None:
        facts.reasons.pop(job_id, None)
        return [Cancel(job_id, "cancelled while held"), *over(facts, job_id, cancelled)]
    if facts.dependencies.unblock(job_id) is not None:
        facts.reasons.pop(job_id, None)
        why = "cancelled while it waited for its dependencies"
        return [Cancel(job_id, why), *over(facts, job_id, cancelled)]
    run = facts.running.jobs.get(job_id)
    if run is not None and run.stopping is None:
        return stop(facts, run, StopCause.CANCELLED, "cancelled by user")
    return []


def _hold(facts: Facts, event: inputs.JobHeld) -> list[Decision]:
    """Hold a waiting job back, or release it into its old place in line."""
    job_id = event.job_id
    if event.held:
        if job_id in facts.held:
            return []
        job = facts.dequeue(job_id)
        if job is None:
            return [Refused(job_id, "only a batch job that waits can be held")]
        facts.held[job_id] = job
        who = event.requested_by or "its user"
        reason = facts.reasons[job_id] = WaitReason.of(WaitCode.HELD_BY_USER, who=who)
        return [Wait(job_id, reason)]
    released = facts.held.pop(job_id, None)
    if released is None:
        return [] if job_id in facts.queues.jobs else [Refused(job_id, "is not held")]
    facts.reasons.pop(job_id, None)
    facts.queues.push(released)
    return []


def _update(facts: Facts, event: inputs.JobUpdated) -> list[Decision]:
    """Give a waiting (or held) job its new spec; it keeps its place in line."""
    job_id, spec = event.job_id, event.spec
    old = facts.queues.jobs.get(job_id) or facts.held.get(job_id)
    if old is None or spec.workflow is not None:
        return [Refused(job_id, "only a batch job that waits can be updated")]
    if (rejected := rejection(job_id, spec)) is not None:
        return [Refused(job_id, rejected.reason)]  # the job stays as it was
    updated = replace(old, spec=spec)
    if job_id in facts.held:
        facts.held[job_id] = updated
    else:
        facts.dequeue(job_id)
        facts.queues.push(updated)
    return []


def _cordon(facts: Facts, event: inputs.NodeCordoned) -> list[Decision]:
    """Take a node out of scheduling or give it back; a drain also stops the work
    that runs there (``endings.task_ended`` requeues it)."""
    node_id, capacity = event.node_id, facts.capacity
    if node_id not in capacity.nodes and not capacity.is_cordoned(node_id):
        return [Refused(node_id, "no node of that name has registered")]
    capacity.cordon(node_id, event.cordoned)
    if not event.cordoned:
        return []
    facts.reservations.release_node(node_id)
    if not event.drain:
        return []
    why = f"node {node_id} drained by {event.requested_by or 'an operator'}"
    decisions: list[Decision] = []
    for job_id in facts.running.on_node(node_id):
        run = facts.running.jobs[job_id]
        if run.stopping is None:
            decisions += stop(facts, run, StopCause.DRAINED, why)
    return decisions


# -- nodes and their liveness ------------------------------------------------------


def _other_caches(facts: Facts, cache_model: str) -> str:
    """Why a node whose agent keeps its caches otherwise than planned is refused:
    every plan would count the wrong loads and evictions there."""
    planned = facts.config.serving_cache_model
    said = cache_model[:40]  # as the agent said it (the record's reason is cut anyway)
    return (
        f"its agent's model caches are {said!r} and placement plans for {planned!r} "
        f"(serving_cache_model): start the agent with --cache-model {planned}, or "
        f"set the policy's serving_cache_model to the agents' model"
    )


def _register(facts: Facts, event: inputs.NodeJoined) -> list[Decision]:
    """A node (re)registered. Another incarnation means its agent restarted and
    killed what it ran: those tasks are lost, and its GPUs come back free. The same
    one means its agent restarted and took its tasks back; but an incarnation
    declared lost stays lost (its tasks were counted lost, and may still run there
    until its agent hears so and registers anew)."""
    node, capacity, serving = event.node, facts.capacity, facts.serving
    known = facts.liveness.incarnations.get(node.node_id)
    lost = node.node_id not in capacity.nodes and event.heartbeat_s > 0
    if event.incarnation and known == event.incarnation and lost:
        why = f"incarnation {event.incarnation} was declared lost: register a new one"
        return [Refused(node.node_id, why)]
    decisions: list[Decision] = []
    if facts.liveness.register(node.node_id, event.incarnation, event.heartbeat_s, facts.now):
        restarted = f"the node agent on {node.node_id} restarted"
        decisions += _lose_tasks(facts, node.node_id, restarted)
        decisions += serving.lose(node.node_id, restarted, facts.now_ms)
    if capacity.nodes.get(node.node_id) != node:
        capacity.add(node, serving.held_on(node.node_id) | facts.running.held_on(node.node_id))
    serving.add_node(node)
    return decisions


def _expire_leases(facts: Facts) -> list[Decision]:
    """Declare lost the nodes silent for longer than the timeout, oldest first."""
    decisions: list[Decision] = []
    for node_id, silent in facts.liveness.expire(facts.now):
        decisions += _lose_node(facts, node_id, silent)
    return decisions


def _approve(facts: Facts, event: inputs.NodeApproved) -> list[Decision] | Applied:
    """An operator approved a node's key: its records are trusted from now on."""
    key = approved(event.public_key)
    if key is None:
        why = f"its key is {len(event.public_key)} bytes, not an Ed25519 key's 32"
        return _answered(Refused(event.node_id, why))
    facts.node_keys[event.node_id] = key
    return []


def _revoke(facts: Facts, event: inputs.NodeRevoked) -> list[Decision] | Applied:
    """A node's key is revoked: nothing it says is trusted from now on, so it is lost
    now rather than when its silence would tell."""
    key = revoked(facts.node_keys.get(event.node_id))
    if key is None:
        return _answered(Refused(event.node_id, "no key of that node is approved"))
    facts.node_keys[event.node_id] = key
    if event.node_id not in facts.capacity.nodes:
        return []
    facts.liveness.forget(event.node_id)
    return _lose_node(
        facts, event.node_id, f"its key was revoked by {event.revoked_by or 'an operator'}"
    )


def _lose_node(facts: Facts, node_id: NodeId, cause: str) -> list[Decision]:
    """The node is lost: its work ends with it, and its GPUs leave the pool."""
    incarnation = facts.liveness.incarnations.get(node_id, "")
    why = f"node {node_id} lost: {cause}"
    decisions: list[Decision] = [NodeLost(node_id, incarnation, cause)]
    decisions += _lose_tasks(facts, node_id, why)
    decisions += facts.serving.lose(node_id, why, facts.now_ms)
    facts.capacity.remove(node_id)
    facts.reservations.release_node(node_id)
    return decisions


def _lose_tasks(facts: Facts, node_id: NodeId, why: str) -> list[Decision]:
    """End every task on the node as lost; a gang's tasks elsewhere are stopped."""
    decisions: list[Decision] = []
    for job_id in facts.running.on_node(node_id):
        run = facts.running.jobs[job_id]
        if run.stopping is None:
            facts.running.update(job_id, stopping=StopCause.NODE_LOST, lost=why)
            decisions += [
                Stop(job_id, task_id, other, StopCause.NODE_LOST, why)
                for task_id, (other, _) in sorted(run.tasks.items())
                if other != node_id and task_id not in run.ended
            ]
        for task_id, (task_node, _) in sorted(run.tasks.items()):
            if task_node == node_id and task_id not in run.ended:
                decisions.append(TaskLost(job_id, task_id, node_id, why))
                decisions += task_ended(facts, job_id, task_id, node_id, facts.now)
    return decisions

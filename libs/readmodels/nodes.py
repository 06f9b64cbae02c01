"""The node read model: envelopes folded into ``qm.v1.Node``.

A node's inventory comes from its agent's registrations (an operator's cordon, from
admission's ``node_cordoned``); its running tasks from
placement's ``task_placed`` and ``task_lost`` and the agent's task ends (and refusals). Placement's
``node_lost`` marks it lost until its agent registers again; a loss declared for an
earlier incarnation (one read after the new registration) changes nothing. Running tasks are kept
sorted by task id, so the same set of tasks always yields the same bytes. The GPUs
workflow serving holds come from placement's ``serving_held`` and ``serving_released``
(both decisions, so in order), kept sorted by GPU index.

Placements (decisions topic) and task ends (events topic) are not ordered with
respect to each other, and the Node message has no room to remember an end
seen before its placement; so a late placement leaves a task that is no
longer running. ``without_ended_tasks`` settles that against the job read
model, which tolerates any order, when a node is read. A task stopped by
preemption ends like any other; a requeued job's next task is another task id.

A node's key, as an operator approved it (admission's ``node_approved``) or revoked it
(``node_revoked``), is kept on its record (``approved_key``, ``key_revoked``), as
placement keeps it (``libs.core.fold``): the readers of the log check the node's
records against it (``libs.trust.gate``; ``approved_key`` below). An approval may come
before the node's first registration: the record it makes holds the key alone, and is
not listed (``listed``) until the node registers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from qm.v1 import events_pb2, types_pb2

from libs.core.approvals import ApprovedKey, approved, revoked
from libs.events import event_type
from libs.readmodels.job_state import ended_tasks


def node_key(env: events_pb2.Envelope) -> str | None:
    """The id of the node an envelope changes; None when it changes none."""
    node_id: str
    match event_type(env):
        case "node_registered":
            node_id = env.node_registered.inventory.node_id
        case "task_placed":
            node_id = env.task_placed.node_id
        case "task_finished":
            node_id = env.task_finished.node_id
        case "task_failed":
            node_id = env.task_failed.node_id
        case "task_refused":
            node_id = env.task_refused.node_id
        case "task_lost":
            node_id = env.task_lost.node_id
        case "node_lost":
            node_id = env.node_lost.node_id
        case "node_cordoned":
            node_id = env.node_cordoned.node_id
        case "serving_held":
            node_id = env.serving_held.node_id
        case "serving_released":
            node_id = env.serving_released.node_id
        case "node_approved":
            node_id = env.node_approved.node_id
        case "node_revoked":
            node_id = env.node_revoked.node_id
        case _:
            return None
    return node_id or None


def apply_node_event(
    node: types_pb2.Node | None, env: events_pb2.Envelope
) -> types_pb2.Node | None:
    """Fold one envelope into a node; returns a new message, never mutates its inputs.

    A registration creates or replaces the inventory and keeps the running tasks
    (an agent that restarts re-registers while its tasks still hold GPUs). A
    placement on a node not registered yet creates it with an empty inventory,
    so the task is not lost; a task end on an unknown node changes nothing. An
    approval creates a record holding the key alone (the node may register after it);
    one of a key that is no Ed25519 key, and a revocation of a node with no approved
    key, change nothing (placement refuses them).
    """
    node_id = node_key(env)
    if node_id is None:
        return node
    if node is not None and node.inventory.node_id != node_id:
        raise ValueError(
            f"envelope for node {node_id!r} applied to node {node.inventory.node_id!r}"
        )
    kind = event_type(env)
    if node is None and kind in (
        "task_finished",
        "task_failed",
        "task_refused",
        "task_lost",
        "node_lost",
        "node_cordoned",
        "serving_released",
        "node_revoked",
    ):
        return None
    if kind == "node_approved" and approved(env.node_approved.public_key) is None:
        return node
    if kind == "node_revoked" and revoked(approved_key(node)) is None:
        return node
    new = types_pb2.Node(inventory=types_pb2.NodeInventory(node_id=node_id, cluster=env.cluster))
    if node is not None:
        new.CopyFrom(node)
    match kind:
        case "node_registered":
            registered = env.node_registered
            new.inventory.CopyFrom(registered.inventory)
            new.registered_at.CopyFrom(env.occurred_at)
            new.incarnation = registered.incarnation
            new.log_endpoint = registered.log_endpoint
            new.lost, new.lost_reason = False, ""
        case "node_cordoned":
            new.cordoned = env.node_cordoned.cordoned
        case "node_lost" if env.node_lost.incarnation == new.incarnation:
            # Its tasks end with it (placement says so, task by task, as TaskLost).
            new.lost, new.lost_reason = True, env.node_lost.reason
        case "task_lost":
            _set_running(new, _without(new.running, env.task_lost.task_id))
        case "task_placed":
            placed = env.task_placed
            task = types_pb2.RunningTask(
                job_id=placed.job_id, task_id=placed.task_id, gpu_indices=placed.gpu_indices
            )
            _set_running(new, [*_without(new.running, placed.task_id), task])
        case "task_finished":
            _set_running(new, _without(new.running, env.task_finished.task_id))
        case "task_failed":
            _set_running(new, _without(new.running, env.task_failed.task_id))
        case "task_refused":  # never queued: placement sends it elsewhere
            _set_running(new, _without(new.running, env.task_refused.task_id))
        case "serving_held":
            held = env.serving_held
            gpu = types_pb2.ServingGpu(gpu_index=held.gpu_index, allocation=held.allocation)
            _set_serving(new, [*_not_gpu(new.serving, held.gpu_index), gpu])
        case "serving_released":
            _set_serving(new, _not_gpu(new.serving, env.serving_released.gpu_index))
        case "node_approved":  # a new approval replaces the key, revoked or not
            new.approved_key, new.key_revoked = env.node_approved.public_key, False
        case "node_revoked":
            new.key_revoked = True
    return new


def approved_key(node: types_pb2.Node | None) -> ApprovedKey | None:
    """The node's key as operators approved (or revoked) it; None: never approved."""
    if node is None or not node.approved_key:
        return None
    return ApprovedKey(node.approved_key, node.key_revoked)


def listed(node: types_pb2.Node) -> bool:
    """Whether a node is one to show: its agent registered it, or placement put work
    there (its registration not read yet). A record an approval alone made is not: a
    node that never registered offers nothing."""
    return node.HasField("registered_at") or bool(node.running) or bool(node.serving)


def nodes_in_cluster(nodes: Iterable[types_pb2.Node], *, cluster: str = "") -> list[types_pb2.Node]:
    """The listed nodes (``listed``) of one cluster (all when empty), sorted by node id."""
    chosen = [
        node
        for node in nodes
        if listed(node) and (not cluster or node.inventory.cluster == cluster)
    ]
    return sorted(chosen, key=lambda node: node.inventory.node_id)


def without_ended_tasks(
    node: types_pb2.Node, job_of: Callable[[str], types_pb2.Job | None]
) -> types_pb2.Node:
    """The node without running tasks their job says are over; ``job_of`` looks a job up.

    A task whose job is unknown is kept: the job's events may still be on their way.
    """
    ended: dict[str, Callable[[str], bool] | None] = {}  # job id -> its tasks' judge

    def over(task: types_pb2.RunningTask) -> bool:
        if task.job_id not in ended:
            job = job_of(task.job_id)
            ended[task.job_id] = None if job is None else ended_tasks(job)
        judge = ended[task.job_id]
        return judge is not None and judge(task.task_id)

    running = [task for task in node.running if not over(task)]
    if len(running) == len(node.running):
        return node
    new = types_pb2.Node()
    new.CopyFrom(node)
    _set_running(new, running)
    return new


def _without(running: Iterable[types_pb2.RunningTask], task_id: str) -> list[types_pb2.RunningTask]:
    return [task for task in running if task.task_id != task_id]


def _not_gpu(serving: Iterable[types_pb2.ServingGpu], index: int) -> list[types_pb2.ServingGpu]:
    return [gpu for gpu in serving if gpu.gpu_index != index]


def _set_serving(node: types_pb2.Node, serving: list[types_pb2.ServingGpu]) -> None:
    copies = sorted(
        (types_pb2.ServingGpu(gpu_index=g.gpu_index, allocation=g.allocation) for g in serving),
        key=lambda gpu: gpu.gpu_index,
    )
    del node.serving[:]
    node.serving.extend(copies)


def _set_running(node: types_pb2.Node, running: list[types_pb2.RunningTask]) -> None:
    running.sort(key=lambda task: task.task_id)
    # Copy first: the tasks may be elements of node.running, which is cleared next.
    copies = [
        types_pb2.RunningTask(job_id=t.job_id, task_id=t.task_id, gpu_indices=t.gpu_indices)
        for t in running
    ]
    del node.running[:]
    node.running.extend(copies)

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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from qm.v1 import events_pb2, types_pb2

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
    so the task is not lost; a task end on an unknown node changes nothing.
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
    ):
        return None
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
    return new


def nodes_in_cluster(nodes: Iterable[types_pb2.Node], *, cluster: str = "") -> list[types_pb2.Node]:
    """Nodes of one cluster (all when empty), sorted by node id."""
    chosen = [node for node in nodes if not cluster or node.inventory.cluster == cluster]
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

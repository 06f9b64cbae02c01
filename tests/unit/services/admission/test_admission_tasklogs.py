"""How admission puts a job's output together from the agents' task logs: every attempt
in order, each part of a gang, a requeued job's next attempt while following."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from qm.v1 import logs_pb2, types_pb2

from services.admission.tasklogs import NoOutput, TaskOutput, job_output, sources, task_output

S = types_pb2


def node(node_id: str, endpoint: str, executor: int = S.EXECUTOR_PROCESS) -> S.Node:
    inventory = S.NodeInventory(node_id=node_id, executor=executor)  # type: ignore[arg-type]
    return S.Node(inventory=inventory, log_endpoint=endpoint)


NODES = [node("n-a", "a:1"), node("n-b", "b:1"), node("n-c", "c:1")]


def job(
    state: int, attempts: int, *placed: tuple[str, str], earlier: tuple[str, ...] = ()
) -> S.Job:
    """A job's view: its latest placement's tasks, and the nodes ``earlier`` attempts ran on."""
    found = S.Job(job_id="j", state=state, attempts=attempts)  # type: ignore[arg-type]
    for task_id, node_id in placed:
        found.placements.add(task_id=task_id, node_id=node_id)
    found.placed_on[:] = sorted({node_id for _, node_id in placed} | set(earlier))
    return found


class Agents:
    """The agents' ListTaskLogs and ReadTaskLog: each endpoint's tasks and their logs."""

    def __init__(self) -> None:
        self.kept: dict[str, list[TaskOutput]] = {}
        self.logs: dict[str, list[bytes]] = {}

    def keep(self, endpoint: str, task_id: str, node_id: str, *lines: bytes, running: bool) -> None:
        entry = logs_pb2.TaskLogEntry(task_id=task_id, node_id=node_id, running=running)
        entry.started_at.FromSeconds(len(self.logs))
        self.kept.setdefault(endpoint, []).append(task_output("j", endpoint, entry))
        self.logs[task_id] = list(lines)

    async def tasks(self, endpoint: str, job_id: str) -> list[TaskOutput]:
        return list(self.kept.get(endpoint, []))

    async def read(self, task: TaskOutput, job_id: str, *, follow: bool) -> AsyncIterator[bytes]:
        for line in self.logs[task.task_id]:
            yield line


async def output(
    agents: Agents,
    found: S.Job,
    *,
    known: list[S.Node] = NODES,
    lookup: Callable[[str], Awaitable[S.Job | None]] | None = None,
    attempt: int = 0,
    follow: bool = False,
) -> list[tuple[str, bytes]]:
    """The pieces ``job_output`` gives, by task id; ``lookup``: the job as it is later."""

    async def nodes(_: S.Job) -> list[S.Node]:
        return known

    async def unchanged(job_id: str) -> S.Job:
        return found

    pieces = job_output(
        agents,  # type: ignore[arg-type]
        found,
        nodes=nodes,
        lookup=lookup or unchanged,
        attempt=attempt,
        follow=follow,
        every_s=0.01,
    )
    return [(task.task_id, data) async for task, data in pieces]


def test_tasks_are_numbered_for_people_from_one() -> None:
    def numbers(task_id: str) -> tuple[int, int]:
        found = task_output("j", "a:1", logs_pb2.TaskLogEntry(task_id=task_id))
        return found.attempt, found.part

    assert [numbers(t) for t in ("j/0", "j/1", "j/1.0", "j/1.1", "j/encode")] == [
        (1, 0), (2, 0), (2, 1), (2, 2), (0, 0),
    ]  # fmt: skip


def test_a_requeued_jobs_earlier_attempts_are_looked_for_where_they_ran() -> None:
    lost = node("n-d", "d:1")
    lost.lost = True
    once = job(S.JOB_STATE_RUNNING, 1, ("j/0", "n-b"))
    again = job(S.JOB_STATE_RUNNING, 3, ("j/2", "n-b"), earlier=("n-a", "n-d"))
    assert sources(once, [*NODES, lost]) == ["b:1"]
    assert sources(again, [*NODES, lost]) == ["b:1", "a:1"]  # not n-c; n-d is lost


async def test_every_attempt_comes_whole_in_order_then_part_whatever_agent_kept_it() -> None:
    agents = Agents()
    agents.keep("b:1", "j/1.1", "n-b", b"2.1\n", running=False)
    agents.keep("a:1", "j/1.0", "n-a", b"2.0 ", b"more\n", running=False)
    agents.keep("b:1", "j/0", "n-b", b"1\n", running=False)
    ended = job(S.JOB_STATE_FINISHED, 2, ("j/1.0", "n-a"), ("j/1.1", "n-b"))
    assert await output(agents, ended) == [
        ("j/0", b"1\n"), ("j/1.0", b"2.0 "), ("j/1.0", b"more\n"), ("j/1.1", b"2.1\n"),
    ]  # fmt: skip
    assert await output(agents, ended, attempt=1) == [("j/0", b"1\n")]
    with pytest.raises(NoOutput, match="has no attempt 3: it has been placed 2 times"):
        await output(agents, ended, attempt=3)


async def test_following_goes_on_to_a_requeued_jobs_next_attempt_until_the_job_ends() -> None:
    agents = Agents()
    agents.keep("a:1", "j/0", "n-a", b"first\n", running=True)
    requeued = job(S.JOB_STATE_PENDING, 1, ("j/0", "n-a"))
    placed_again = job(S.JOB_STATE_RUNNING, 2, ("j/1", "n-b"), earlier=("n-a",))
    ended = job(S.JOB_STATE_FINISHED, 2, ("j/1", "n-b"), earlier=("n-a",))
    later = iter([requeued, requeued, placed_again, ended])

    async def lookup(job_id: str) -> S.Job:
        found = next(later)
        if found is placed_again:  # its agent starts it: its log appears
            agents.keep("b:1", "j/1", "n-b", b"second\n", running=True)
        return found

    running = job(S.JOB_STATE_RUNNING, 1, ("j/0", "n-a"))
    assert await output(agents, running, lookup=lookup, follow=True) == [
        ("j/0", b"first\n"),
        ("j/1", b"second\n"),
    ]


async def test_no_output_says_why() -> None:
    agents = Agents()
    on_simulated = job(S.JOB_STATE_FINISHED, 1, ("j/0", "n-s"))
    simulated = [node("n-s", "a:1", S.EXECUTOR_SIMULATED)]
    with pytest.raises(NoOutput, match=r"ran on simulated node\(s\) n-s, which run no command"):
        await output(agents, on_simulated, known=simulated)
    placed = job(S.JOB_STATE_PLACED, 1, ("j/0", "n-a"))
    with pytest.raises(NoOutput, match=r"job j has no output yet \(PLACED\); qm logs -f waits"):
        await output(agents, placed)
    wiped = job(S.JOB_STATE_FINISHED, 1, ("j/0", "n-a"))  # its agent lost its logs
    with pytest.raises(NoOutput, match="no output of job j is kept: the agents of n-a have no"):
        await output(agents, wiped)


@pytest.mark.parametrize("follow", [False, True])
async def test_a_workflow_served_on_a_simulated_node_says_it_ran_no_command(follow: bool) -> None:
    """Its tasks (no placements) name the node; its agent serves logs, but kept none."""
    served = S.Job(job_id="j", state=S.JOB_STATE_FINISHED)
    for name in ("encode", "decode"):
        served.tasks.add(name=name, node_id="serve-1", state=S.JOB_STATE_FINISHED)
    simulated = [*NODES, node("serve-1", "s:1", S.EXECUTOR_SIMULATED)]
    with pytest.raises(NoOutput, match=r"ran on simulated node\(s\) serve-1, which run no command"):
        await output(Agents(), served, known=simulated, follow=follow)

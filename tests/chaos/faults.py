"""kill -9, one process at a time while jobs flow, and how long until each comes back.

Each service's process (not its supervisor) is killed with SIGKILL; the supervisor
starts it again. The broker is killed and started again by this harness, as its
StatefulSet would. One node agent is killed together with its supervisor: a
machine that does not come back, whose GPUs placement must declare lost. After a
kill the next kill waits until the first has recovered (or its probe timed out).

Recovery is measured from the kill to the first sign of service: the next clock
tick, decision, accepted submission, answered call or node registration, and for
node agents until the tasks it ran leave ``ListNodes`` (their GPUs are free again).

One fault is an operator's: a process node is drained under resumable charged jobs
(and uncordoned once their tasks there ended); it is over when each has started its
next attempt, which must find nothing of the last one in its way.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from qm.v1 import budget_service_pb2 as bs
from qm.v1 import cluster_service_pb2 as cs
from qm.v1 import job_service_pb2 as js

from tests.chaos.clients import Clients
from tests.chaos.observer import Observer, Seen
from tests.chaos.stack import AGENTS, ChaosStack, agent_process
from tests.chaos.workload import Workload

log = logging.getLogger("chaos.faults")
PROBE_TIMEOUT_S = 120.0
PROBE_INTERVAL_S = 0.25
DRAINED = AGENTS["p"][0]["node_id"]  # a process node, drained under resumable jobs


@dataclass
class Recovery:
    fault: str  # what was done
    signal: str  # what counts as recovered
    killed_at: float
    seconds: float | None = None  # None: not within the probe's timeout
    submit_s: float | None = None  # kill -> the next accepted submission
    detail: str = ""


# How a task whose node or agent is gone ends in the log: placement's word, or the
# agent's own report if it got one out.
ENDS = frozenset({"task_lost", "task_finished", "task_failed"})
FREED_IN_LOG = "its tasks end in placement's log (GPUs free)"
FREED_IN_VIEW = "its tasks leave ListNodes"
# How far the projector's node view may trail placement's log. The node is lost as the
# fuzzer starts, just after the broker's restart; its burst (a 3,000-task workflow among
# 10,000 requests) saturates the projector on a small machine: 15 to 30 s behind in most
# of our runs (2 cores), over 60 s in one (its commit timer ran 47 s late). Placement's
# own log must free the GPUs within the loss timeout (FREED_IN_LOG) whatever this is.
VIEW_LAG_S = 120.0
STOPPED_BY_PLACEMENT = "stopped by placement"  # a task's end that placement asked for


@dataclass
class Faults:
    stack: ChaosStack
    clients: Clients
    observer: Observer
    workload: Workload
    node_loss_timeout_s: float
    recoveries: list[Recovery] = field(default_factory=list)
    killed_pids: set[int] = field(default_factory=set)
    drained_jobs: set[str] = field(default_factory=set)  # the drain's: each is requeued
    # The tasks the process agent's restart found running, and how each ended in the log
    # ("": not within the probe's timeout): its restart stops none.
    kept_ends: dict[str, str] = field(default_factory=dict)
    _background: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._auth = self.stack.auth("alice")

    def plan(self) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
        return [
            ("ticker", lambda: self.kill("ticker", "next clock tick", self._seen("clock_tick"))),
            ("budget", lambda: self.kill("budget", "GetTree answers", self._answers_tree)),
            ("admission", lambda: self.kill("admission", "next accepted submit", None)),
            ("projector", lambda: self.kill("projector", "ListJobs answers", self.lists_jobs)),
            ("placement", lambda: self.kill("placement", "next decision", self._decides)),
            ("node agent a", lambda: self.kill_agent("a")),
            ("drain " + DRAINED, self.drain),
            ("node agent p", lambda: self.kill_agent("p", "on-process-node", keeps_tasks=True)),
            # The broker before the node lost for good: its outage would stop the log's
            # clock while the node's lease runs out (placement does not count a silent
            # log against a node), and the loss would be judged against the wrong start.
            ("kafka", self.kill_broker),
            ("node lost-0", self.lose_node),
        ]

    async def run(self, duration_s: float) -> None:
        """Every fault once, spread over ``duration_s``; node-loss probes may run on."""
        plan = self.plan()
        slot = duration_s / len(plan)
        start = time.monotonic()
        for index, (name, fault) in enumerate(plan):
            await asyncio.sleep(max(0.0, start + index * slot - time.monotonic()))
            log.info("fault %d/%d: %s", index + 1, len(plan), name)
            await fault()

    async def finish(self, timeout: float) -> None:
        """Wait for the node-loss probes still running."""
        if self._background:
            await asyncio.wait(self._background, timeout=timeout)

    # --- faults ---------------------------------------------------------------------

    async def kill(
        self,
        name: str,
        signal_name: str,
        probe: Callable[[float, float], Awaitable[float | None]] | None,
        *,
        with_load: bool = True,
    ) -> Recovery:
        """kill -9 the service; ``with_load``: jobs flow, so time the next accepted submit too."""
        pid = await asyncio.to_thread(self.stack.child_pid, name)
        killed_at = time.time()
        os.kill(pid, signal.SIGKILL)
        self.killed_pids.add(pid)
        recovery = Recovery(f"kill -9 {name}", signal_name, killed_at)
        self.recoveries.append(recovery)
        submit = (
            asyncio.create_task(self._next_submit(killed_at, PROBE_TIMEOUT_S))
            if with_load
            else None
        )
        if probe is not None:
            recovery.seconds = await probe(killed_at, PROBE_TIMEOUT_S)
        if submit is not None:
            recovery.submit_s = await submit
        if probe is None:
            recovery.seconds = recovery.submit_s
        log.info("%s: recovered in %s s", recovery.fault, recovery.seconds)
        return recovery

    async def kill_agent(self, agent: str, pin: str = "", *, keeps_tasks: bool = False) -> None:
        """kill -9 one node agent; ``pin``: a kind of job that runs only there, run first.
        ``keeps_tasks``: its tasks run under their keepers, and the agent its supervisor
        starts again takes them back: each must end on its own (``kept_ends``); else
        (simulated nodes: their runs were the agent's timers) they must end, GPUs free."""
        nodes = {n["node_id"] for n in AGENTS[agent]}
        if pin:
            await self._occupy(nodes, pin)
        running = await self._running_on(nodes)
        name = agent_process(agent)
        killed = await self.kill(name, "its nodes report again", self._seen_from(nodes))
        if keeps_tasks:
            self._background.append(asyncio.create_task(self._watch_kept(running)))
        else:
            self._watch_release(f"kill -9 {name}", killed.killed_at, running, nodes)

    async def _watch_kept(self, running: dict[str, list[int]]) -> None:
        """How each task running at the kill ends (they sleep 20 s: within 60 s): on its
        own, or stopped by placement (free work preempted, say), is not the restart's."""
        self.kept_ends = dict.fromkeys(running, "")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(self.kept_ends.values()):
            asked = {s.task_id for s in self.observer.seen if s.kind == "task_stop_requested"}
            for s in self.observer.seen:
                if s.kind in ENDS and s.task_id in self.kept_ends:
                    self.kept_ends[s.task_id] = (
                        STOPPED_BY_PLACEMENT if s.task_id in asked else s.kind
                    )
            await asyncio.sleep(0.5)

    async def lose_node(self) -> None:
        """The agent of lost-0 and its supervisor die together and stay down."""
        name = agent_process("lost")
        nodes = {n["node_id"] for n in AGENTS["lost"]}
        await self._occupy(nodes, "on-lost-node")
        running = await self._running_on(nodes)
        self.killed_pids.add(await asyncio.to_thread(self.stack.child_pid, name))
        killed_at = time.time()
        await asyncio.to_thread(self.stack.kill_for_good, name)
        self._watch_release(f"kill -9 {name} and its supervisor", killed_at, running, nodes)

    async def drain(self) -> None:
        """Drain a process node under resumable charged jobs; uncordon it once their
        tasks there ended; recovered when each job's next attempt has started."""
        # Enough to fill both process nodes: some run on the one drained. Only theirs are
        # waited for: other jobs drained with them may be cancelled meanwhile.
        occupied = await self._occupy({n["node_id"] for n in AGENTS["p"]}, "drained", jobs=4)
        running = await self._running_on({DRAINED})
        jobs = self.drained_jobs = {task.partition("/")[0] for task in running} & occupied
        carol = self.stack.auth("carol")  # an operator: the budget root's manager
        drained_at = time.time()
        recovery = Recovery(f"drain {DRAINED}", "its jobs' next attempts start", drained_at)
        recovery.detail = f"{len(running)} tasks, {len(jobs)} of resumable charged jobs"
        self.recoveries.append(recovery)
        if not jobs:
            recovery.seconds, recovery.detail = 0.0, "n/a: none of its jobs ran there"
            return
        await _until_answered(
            lambda: self.clients.cluster.CordonNode(
                cs.CordonNodeRequest(node_id=DRAINED, drain=True), metadata=carol, timeout=5
            ),
            drained_at,
            PROBE_TIMEOUT_S,
        )
        theirs = {task for task in running if task.partition("/")[0] in jobs}
        ended = await self._ended(theirs, PROBE_TIMEOUT_S)
        await _until_answered(
            lambda: self.clients.cluster.UncordonNode(
                cs.UncordonNodeRequest(node_id=DRAINED), metadata=carol, timeout=5
            ),
            drained_at,
            PROBE_TIMEOUT_S,
        )
        if not ended:
            recovery.detail += f"; not all ended {PROBE_TIMEOUT_S:g} s after the drain"
            return
        waiting = set(jobs)
        deadline = time.monotonic() + PROBE_TIMEOUT_S
        while waiting and time.monotonic() < deadline:
            waiting = jobs - {
                s.job_id
                for s in self.observer.seen
                if s.kind == "task_started" and s.at > drained_at and s.task_id not in running
            }
            await asyncio.sleep(PROBE_INTERVAL_S)
        if waiting:
            recovery.detail += f"; {len(waiting)} jobs not started again"
        else:
            recovery.seconds = time.time() - drained_at
        log.info("%s: recovered in %s s", recovery.fault, recovery.seconds)

    async def kill_broker(self) -> None:
        killed_at = time.time()
        await asyncio.to_thread(self.stack.kill_kafka)
        recovery = Recovery("kill -9 kafka, started again", "next decision", killed_at)
        self.recoveries.append(recovery)
        await asyncio.to_thread(self.stack.kafka, "start")
        recovery.detail = f"broker back after {time.time() - killed_at:.1f} s"
        decided, submitted = await asyncio.gather(
            self._decides(killed_at, PROBE_TIMEOUT_S),
            self._next_submit(killed_at, PROBE_TIMEOUT_S),
        )
        recovery.seconds, recovery.submit_s = decided, submitted

    # --- node loss --------------------------------------------------------------------

    def _watch_release(
        self, fault: str, killed_at: float, running: dict[str, list[int]], nodes: set[str]
    ) -> None:
        """Two clocks: placement's log says the tasks ended (their GPUs free to place
        on again), and the projector's node view shows it, a little later."""
        held = f"{len(running)} tasks on {sum(map(len, running.values()))} GPUs"
        freed = Recovery(fault, FREED_IN_LOG, killed_at, detail=held)
        listed = Recovery(fault, FREED_IN_VIEW, killed_at, detail=held)
        self.recoveries += [freed, listed]
        if not running:
            for recovery in (freed, listed):
                recovery.seconds = 0.0
                recovery.detail = "n/a: no task was running there"
            return
        timeout = self.node_loss_timeout_s + 10 + VIEW_LAG_S

        async def ended_in_log() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                # A task may have ended just before the kill, too: any end counts.
                ends = {s.task_id: s.at for s in self.observer.seen if s.kind in ENDS}
                if set(running) <= ends.keys():
                    freed.seconds = max(0.0, max(ends[t] for t in running) - killed_at)
                    return
                await asyncio.sleep(0.5)
            ends = {s.task_id: s.at for s in self.observer.seen if s.kind in ENDS}
            freed.detail += f"; {len(set(running) - ends.keys())} not ended after {timeout:g} s"

        async def gone_from_view() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                left = set(running) & set(await self._running_on(nodes))
                if not left:
                    listed.seconds = time.time() - listed.killed_at
                    if freed.seconds is not None:
                        listed.detail += f"; {listed.seconds - freed.seconds:.1f} s after the log"
                    return
                await asyncio.sleep(1.0)
            left = set(running) & set(await self._running_on(nodes))
            listed.detail += f"; {len(left)} still listed after {timeout:g} s"

        self._background += [
            asyncio.create_task(ended_in_log()),
            asyncio.create_task(gone_from_view()),
        ]

    async def _ended(self, tasks: set[str], timeout: float) -> bool:
        """Whether each of the tasks ends in the log within ``timeout`` (any end counts)."""
        deadline = time.monotonic() + timeout
        while not tasks <= {s.task_id for s in self.observer.seen if s.kind in ENDS}:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(PROBE_INTERVAL_S)
        return True

    async def _occupy(
        self, nodes: set[str], kind: str, jobs: int = 2, timeout: float = 20
    ) -> set[str]:
        """Submit jobs that only these nodes run; wait (a while) until they run there.
        Returns those the API accepted."""
        subs = [self.workload.new_submission(kind) for _ in range(jobs)]
        await asyncio.gather(*(self.workload.submit(sub, give_up_s=timeout) for sub in subs))
        wanted = {sub.job_id for sub in subs if sub.accepted}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = {task.partition("/")[0] for task in await self._running_on(nodes)}
            if wanted <= running:
                return wanted
            await asyncio.sleep(0.5)
        log.warning("jobs %s were not all running on %s in %g s", wanted, nodes, timeout)
        return wanted

    async def _running_on(self, nodes: set[str]) -> dict[str, list[int]]:
        """Task id -> GPUs, of the tasks ListNodes shows on these nodes ({} if it fails)."""
        try:
            reply = await self.clients.cluster.ListNodes(
                cs.ListNodesRequest(), metadata=self._auth, timeout=10
            )
        except grpc.aio.AioRpcError:
            return {}
        return {
            task.task_id: list(task.gpu_indices)
            for node in reply.nodes
            if node.inventory.node_id in nodes
            for task in node.running
        }

    # --- probes: (killed_at, timeout) -> seconds until recovered, or None -------------

    def _seen(self, kind: str) -> Callable[[float, float], Awaitable[float | None]]:
        return self._seen_where(lambda s: s.kind == kind)

    def _seen_from(self, nodes: set[str]) -> Callable[[float, float], Awaitable[float | None]]:
        return self._seen_where(lambda s: s.topic == "events" and s.node_id in nodes)

    def _seen_where(
        self, wanted: Callable[[Seen], bool]
    ) -> Callable[[float, float], Awaitable[float | None]]:
        async def probe(killed_at: float, timeout: float) -> float | None:
            at = await self.observer.first_after(killed_at, wanted, timeout)
            return None if at is None else at - killed_at

        return probe

    async def _decides(self, killed_at: float, timeout: float) -> float | None:
        return await self._seen_where(lambda s: s.topic == "decisions")(killed_at, timeout)

    async def _next_submit(self, killed_at: float, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            at = self.workload.first_success_after(killed_at)
            if at is not None:
                return at - killed_at
            await asyncio.sleep(PROBE_INTERVAL_S)
        return None

    async def _answers_tree(self, killed_at: float, timeout: float) -> float | None:
        async def call() -> object:
            return await self.clients.budget.GetTree(
                bs.GetTreeRequest(), metadata=self._auth, timeout=2
            )

        return await _until_answered(call, killed_at, timeout)

    async def lists_jobs(self, killed_at: float, timeout: float) -> float | None:
        """Seconds until ListJobs, which only the projector answers, works again."""

        async def call() -> object:
            return await self.clients.jobs.ListJobs(
                js.ListJobsRequest(limit=1), metadata=self._auth, timeout=2
            )

        return await _until_answered(call, killed_at, timeout)


async def _until_answered(
    call: Callable[[], Awaitable[object]], killed_at: float, timeout: float
) -> float | None:
    """Seconds from the kill until a call sent after it succeeds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            await call()
        except grpc.aio.AioRpcError:
            await asyncio.sleep(PROBE_INTERVAL_S)
            continue
        return time.time() - killed_at
    return None

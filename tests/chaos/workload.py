"""The jobs a chaos run submits through the gRPC API, as careful users would.

A seeded mix: short simulated batch jobs of 1-8 GPUs, gangs over several nodes,
jobs with a minimum runtime (some resumable), short commands on the process nodes (free
work, some resumable, and resumable charged work that preempts it and is preempted or
drained in turn: their next attempts start on the same agent), Compass workflows on the
serving nodes, and a few invalid jobs. Every submission
has a client request id. A submission that fails with a status that leaves the
outcome unknown (UNAVAILABLE, UNKNOWN, DEADLINE_EXCEEDED, INTERNAL) is retried
with the same id, with backoff; some accepted jobs are submitted again on purpose
(the answer must name the same job), some are cancelled, and each invalid job is
submitted twice (the answer must be the same refusal).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2

from cli.app import load_workflow
from libs.core import simulated
from libs.core.simulated import SimulatedRun
from libs.sim.workflows import PROFILES
from tests.integration.stack import ROOT

EXAMPLE_WORKFLOW = ROOT / "deploy" / "examples" / "workflow-translation.yaml"
# The outcome of the call is unknown: the same request goes again.
RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
    }
)
CALL_TIMEOUT_S = 10.0
GIVE_UP_AFTER_S = 120.0
USERS = (("alice", 50), ("bob", 35), ("erin", 15))
# kind -> share of submissions
KINDS = {
    "small": 50,
    "node": 8,
    "gang": 5,
    "contract": 10,
    "process": 10,
    "resumable": 5,
    "workflow": 10,
    "invalid": 2,
}
CANCEL_SHARE = 0.06
RESUBMIT_SHARE = 0.05
TASK_MARK = "qm-chaos-task"
LOST_NODE_TYPE = "L4"
CANARY_TYPE = "V100"


@dataclass
class Attempt:
    sent: float  # time.time()
    replied: float
    code: str  # grpc status name, "OK" included
    job_id: str = ""
    duplicate: bool = False
    detail: str = ""


@dataclass
class Submission:
    request_id: str
    user: str
    kind: str
    phase: str
    spec: types_pb2.JobSpec
    resubmit_after_s: float | None = None  # submit again on purpose, this long after the answer
    cancel_after_s: float | None = None
    attempts: list[Attempt] = field(default_factory=list)
    resubmits: list[Attempt] = field(default_factory=list)  # on purpose, after an answer
    cancel: list[Attempt] = field(default_factory=list)

    @property
    def job_id(self) -> str:
        return next((a.job_id for a in self.attempts if a.code == "OK"), "")

    @property
    def accepted(self) -> bool:
        return bool(self.job_id)

    @property
    def answer(self) -> str:
        """The final answer to the first submission: OK or the status that refused it."""
        return self.attempts[-1].code if self.attempts else "never sent"


def workflows() -> list[types_pb2.Workflow]:
    """The example workflow and, where ../shared/data is present, the Compass profiles."""
    found = [load_workflow(EXAMPLE_WORKFLOW)]
    if PROFILES.exists():
        for name in ("translation", "question_answer", "img_to_sound", "object_detection"):
            found.append(load_workflow(PROFILES, name))
    return found


def _weighted(rng: random.Random, table: dict[str, int] | tuple[tuple[str, int], ...]) -> str:
    items = list(table.items()) if isinstance(table, dict) else list(table)
    return rng.choices([k for k, _ in items], weights=[w for _, w in items])[0]


def make_spec(rng: random.Random, kind: str, flows: list[types_pb2.Workflow]) -> types_pb2.JobSpec:
    """One job of the given kind; durations are seconds of simulated (or real) run time."""
    spec = types_pb2.JobSpec(
        command=["train.py"],
        priority=rng.randint(-3, 3),
        env=simulated.to_env(SimulatedRun(round(rng.uniform(0.5, 4.0), 2), utilization=0.9)),
        gpu_type="A100",
    )
    if kind == "small":
        spec.gpus = rng.choice((1, 1, 1, 2, 2, 4))
    elif kind == "node":
        spec.gpus = 8
    elif kind == "gang":  # spans two or three 8-GPU nodes
        spec.gpus = rng.choice((16, 24))
        spec.env[simulated.SECONDS] = repr(round(rng.uniform(1.0, 3.0), 2))
    elif kind == "contract":
        spec.gpus = rng.choice((1, 2, 4))
        spec.min_runtime.FromSeconds(rng.choice((2, 10, 60)))
        spec.resumable = rng.random() < 0.5
    elif kind == "process":  # real processes on the process nodes, marked for teardown
        spec.gpu_type = "H100"
        spec.gpus = rng.choice((1, 2))
        spec.resumable = rng.random() < 0.5  # free work: preempted for charged work
        spec.command[:] = ["sh", "-c", f"sleep {rng.uniform(0.2, 2.0):.2f}", TASK_MARK]
    elif kind in ("resumable", "drained"):  # charged, requeued when preempted or drained
        spec.gpu_type = "H100"
        spec.gpus = rng.choice((1, 2)) if kind == "resumable" else 2
        spec.resumable = True
        spec.min_runtime.FromSeconds(1)
        seconds = rng.uniform(2.0, 6.0) if kind == "resumable" else 15.0
        spec.command[:] = ["sh", "-c", f"sleep {seconds:.2f}", TASK_MARK]
    elif kind == "workflow":
        spec.gpu_type = "T4"
        spec.gpus = 1
        spec.workflow.CopyFrom(rng.choice(flows))
        del spec.command[:]
    elif kind == "invalid":  # beyond admission's 64-GPU limit
        spec.gpus = 100
    elif kind == "on-lost-node":  # only the node that is lost for good has this type
        spec.gpu_type, spec.gpus, spec.env[simulated.SECONDS] = LOST_NODE_TYPE, 4, "120.0"
    elif kind == "canary":  # a short job on the node nothing else uses
        spec.gpu_type, spec.gpus, spec.env[simulated.SECONDS] = CANARY_TYPE, 1, "0.5"
    elif kind == "on-process-node":  # outlives the kill of its node agent
        spec.gpu_type, spec.gpus = "H100", 2
        spec.command[:] = ["sh", "-c", "sleep 20", TASK_MARK]
    else:
        raise ValueError(f"unknown job kind {kind!r}")
    return spec


def _code(error: grpc.aio.AioRpcError) -> str:
    return str(error.code().name)


class Workload:
    """Submits the mix at a steady rate while :attr:`phase` says which part of the run it is."""

    def __init__(
        self,
        stub: js_grpc.JobServiceStub,
        auth: Callable[[str], tuple[tuple[str, str], ...]],
        *,
        seed: int,
        run_id: str,
    ) -> None:
        self._stub = stub
        self._auth = auth
        self._rng = random.Random(seed)
        self._run_id = run_id
        self._flows = workflows()
        self.phase = "setup"
        self.submissions: list[Submission] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def new_submission(self, kind: str | None = None) -> Submission:
        rng = self._rng
        kind = kind or _weighted(rng, KINDS)
        user = _weighted(rng, USERS)
        spec = make_spec(rng, kind, self._flows)
        spec.client_request_id = f"{self._run_id}-{len(self.submissions):05d}"
        sub = Submission(spec.client_request_id, user, kind, self.phase, spec)
        if kind == "invalid":
            sub.resubmit_after_s = 0.0
        elif rng.random() < RESUBMIT_SHARE:
            sub.resubmit_after_s = rng.uniform(0.0, 3.0)
        if kind != "invalid" and rng.random() < CANCEL_SHARE:
            sub.cancel_after_s = rng.uniform(0.0, 3.0)
        self.submissions.append(sub)
        return sub

    async def run(self, rate: float, stop: asyncio.Event, max_in_flight: int = 48) -> None:
        """Open loop at ``rate`` per second until ``stop``; waits for no stragglers.

        While ``max_in_flight`` submissions are under way (their retries through an
        outage) it waits, then catches up: the run still offers ``rate`` on average.
        """
        interval = 1.0 / rate
        next_at = time.monotonic()
        while not stop.is_set():
            while len(self._tasks) >= max_in_flight and not stop.is_set():
                await asyncio.sleep(0.05)
            self.spawn(self.new_submission())
            next_at += interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, next_at - time.monotonic()))

    def spawn(self, sub: Submission) -> asyncio.Task[None]:
        task = asyncio.create_task(self.follow(sub))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def settle(self, timeout: float) -> None:
        """Wait for the submissions (their retries, cancels, resubmits) still under way."""
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=timeout)
            for task in late:
                task.cancel()

    async def submit(self, sub: Submission, give_up_s: float = GIVE_UP_AFTER_S) -> None:
        """Submit until answered: the same request id again while the outcome is unknown."""
        await self._submit(sub, sub.attempts, give_up_s)

    async def follow(self, sub: Submission) -> None:
        """Submit until answered, then submit again or cancel as planned."""
        await self.submit(sub)
        if sub.resubmit_after_s is not None and (sub.accepted or sub.kind == "invalid"):
            await asyncio.sleep(sub.resubmit_after_s)
            await self._submit(sub, sub.resubmits)
        if sub.cancel_after_s is not None and sub.accepted:
            await asyncio.sleep(sub.cancel_after_s)
            await self.cancel(sub)

    async def _submit(
        self, sub: Submission, into: list[Attempt], give_up_s: float = GIVE_UP_AFTER_S
    ) -> None:
        started = time.monotonic()
        delay = 0.5
        while True:
            sent = time.time()
            try:
                reply = await self._stub.SubmitJob(
                    js.SubmitJobRequest(spec=sub.spec),
                    metadata=self._auth(sub.user),
                    timeout=CALL_TIMEOUT_S,
                )
            except grpc.aio.AioRpcError as error:
                into.append(Attempt(sent, time.time(), _code(error), detail=error.details() or ""))
                if error.code() not in RETRYABLE or time.monotonic() - started > give_up_s:
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            into.append(Attempt(sent, time.time(), "OK", reply.job_id, reply.duplicate))
            return

    async def cancel(self, sub: Submission) -> None:
        started = time.monotonic()
        while time.monotonic() - started < GIVE_UP_AFTER_S:
            sent = time.time()
            try:
                await self._stub.CancelJob(
                    js.CancelJobRequest(job_id=sub.job_id),
                    metadata=self._auth(sub.user),
                    timeout=CALL_TIMEOUT_S,
                )
            except grpc.aio.AioRpcError as error:
                sub.cancel.append(Attempt(sent, time.time(), _code(error), sub.job_id))
                if error.code() not in RETRYABLE:
                    return
                await asyncio.sleep(1.0)
                continue
            sub.cancel.append(Attempt(sent, time.time(), "OK", sub.job_id))
            return

    def first_success_after(self, t0: float) -> float | None:
        """When the first submission sent after ``t0`` was accepted (None: none yet)."""
        replies = [
            a.replied
            for sub in self.submissions
            for a in (*sub.attempts, *sub.resubmits)
            if a.code == "OK" and a.sent > t0
        ]
        return min(replies, default=None)


def write_specs(path: Path, subs: list[Submission]) -> None:
    """One line per submission, for people reading a failed run."""
    with path.open("w") as out:
        for sub in subs:
            codes = ",".join(a.code for a in sub.attempts)
            again = ",".join(f"{a.code}:{a.job_id}" for a in sub.resubmits)
            out.write(
                f"{sub.request_id} {sub.user} {sub.kind} {sub.phase} job={sub.job_id or '-'} "
                f"answers={codes} resubmits={again or '-'} cancel="
                f"{','.join(a.code for a in sub.cancel) or '-'}\n"
            )

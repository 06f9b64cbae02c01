"""JobService and ClusterService: decode, check, call the core, record, answer."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import replace

import grpc
from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata
from google.protobuf.message import Message
from qm.v1 import cluster_service_pb2, cluster_service_pb2_grpc, events_pb2, types_pb2
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc

from libs.auth import Keys
from libs.bus import EventProducer
from libs.core import JobSpec, Limits, NodeKind, NodeSpec, Violation, validate_job
from libs.core.budget_tree import BudgetTree
from libs.core.compass.workflow import BYTES_PER_MB
from libs.core.ids import array_element_id, is_array_id
from libs.core.limits import (
    MAX_ARRAY_ELEMENTS,
    MAX_ARRAY_INDEX,
    MAX_DEPENDENCIES,
    MAX_NAME_CHARS,
    MAX_REASON_CHARS,
    MAX_SPEC_BYTES,
    MAX_TEXT_CHARS,
)
from libs.core.model import GIB
from libs.events import new_envelope
from libs.events.convert import preemption_from_proto, spec_from_proto
from libs.readmodels import DEFAULT_LIST_LIMIT, JobFilter, Scope, has_ended, scope_of
from services.admission.budget_view import BudgetView
from services.admission.explainer import Explainer
from services.admission.follower import Follower
from services.admission.node_view import NodeView
from services.admission.requests import RequestLog
from services.admission.tasklogs import NoOutput, TaskLogReader, job_output
from services.authn import caller
from services.projector.client import ProjectorClient
from services.status import Unavailable, bounded

log = logging.getLogger("admission")

# What a refusal for the nodes' offer names: checked again against a fresh view first.
_OFFERED_FIELDS = frozenset({"gpu_type", "min_gpu_memory_gib"})
# What a job's size is judged by: one broken leaves the nodes' room unjudged (``_no_room``).
_SIZE_FIELDS = _OFFERED_FIELDS | {"gpus", "nodes"}
# The states a list may ask for: every one a job can be in.
_LISTED_STATES = frozenset(types_pb2.JobState.values()) - {types_pb2.JOB_STATE_UNSPECIFIED}

_NAMESPACE = uuid.UUID("6f1d7a4e-2b1c-4e55-9a43-6c1f0e6f0a11")
PRODUCER = "admission"
# How long the broker may take to write a record, or to show it back: past that the
# call fails UNAVAILABLE (the CLI retries) instead of running into the client's deadline.
LOG_TIMEOUT_S = 5.0
# How long a duplicate waits for the request that claimed its job to decide it (then
# it answers UNAVAILABLE: retry); and how old a claim must be before a duplicate takes
# its claimer for dead and decides the claimed spec itself. A claimer's decision can
# land well after the claimer gave up on it (the producer retries for 40 s), and two
# deciders would admit the job twice.
DECIDE_WITHIN_S = 5.0
TAKE_OVER_AFTER_S = 60.0
SWEEP_EVERY_S = 10.0  # how often claims nobody decided are looked for
# A submission answers within this, whatever it waits for: a client's deadline is 10 s.
SUBMIT_WITHIN_S = 8.0


def job_id_for(user: str, client_request_id: str) -> str:
    """Deterministic for a given request id, so retries land on the same job."""
    if client_request_id:
        return "j-" + _request_hex(user, client_request_id)
    return "j-" + uuid.uuid4().hex[:16]


def array_id_for(user: str, client_request_id: str) -> str:
    """A job array's id: its elements share the request id that names it."""
    return "a-" + _request_hex(user, client_request_id)


def _request_hex(user: str, client_request_id: str) -> str:
    return uuid.uuid5(_NAMESPACE, f"{user}\n{client_request_id}").hex[:16]


def _submitted_id(user: str, spec: types_pb2.JobSpec) -> str:
    """The id a submission names: its own, or its array's and its index."""
    if spec.HasField("array"):
        array_id = array_id_for(user, spec.client_request_id)
        return array_element_id(array_id, spec.array.index)
    return job_id_for(user, spec.client_request_id)


class JobServicer(js_grpc.JobServiceServicer):
    def __init__(
        self,
        *,
        producer: EventProducer,
        topic: str,
        budget: BudgetView,
        projector: ProjectorClient,
        limits: Limits,
        keys: Keys,
        explainer: Explainer,
        requests: RequestLog,
        follower: Follower,
        logs: TaskLogReader,
        operators: frozenset[str] = frozenset(),
        watch_interval_s: float = 0.2,
    ) -> None:
        """``operators`` see every job (as the root's managers do) and change nothing more;
        ``logs`` reads jobs' output from the agents that ran them."""
        self._operators = operators
        self._logs = logs
        self._explainer = explainer
        self._requests = requests
        self._follower = follower
        self._producer = producer
        self._topic = topic
        self._budget = budget
        self._projector = projector
        self._nodes = NodeView(projector)
        self._limits = limits
        self._keys = keys
        self._watch_interval_s = watch_interval_s
        # Jobs this instance recorded, for read-your-writes until the projector has them.
        self._recent: OrderedDict[str, types_pb2.Job] = OrderedDict()

    async def SubmitJob(
        self, request: js.SubmitJobRequest, context: grpc.aio.ServicerContext
    ) -> js.SubmitJobResponse:
        user = await caller(context, self._keys)
        spec = types_pb2.JobSpec()
        spec.CopyFrom(request.spec)
        if spec.user and spec.user != user:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED, f"{user} cannot submit as {spec.user}"
            )
        spec.user = user
        spec.cluster = spec.cluster or "default"
        if not spec.allocation:  # in the claim already, so that every record of it agrees
            mine = (await self._budget.tree()).allocations_of(user)
            spec.allocation = mine[0] if len(mine) == 1 else ""
        if broken := _array_violation(spec):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid job: {broken}")
        job_id = _submitted_id(user, spec)
        try:
            async with asyncio.timeout(SUBMIT_WITHIN_S):
                await self._after_arrays(user, spec)
                return await self._submit(job_id, spec, context)
        except TimeoutError:
            raise Unavailable(
                f"the job could not be recorded within {SUBMIT_WITHIN_S:g} s"
            ) from None

    async def _submit(
        self, job_id: str, spec: types_pb2.JobSpec, context: grpc.aio.ServicerContext
    ) -> js.SubmitJobResponse:
        if unloggable := _unloggable(spec):  # no claim can hold it: rejected, spec left out
            spec.cluster = "default"
            await self._reject(job_id, spec, unloggable.field, str(unloggable), record_spec=False)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid job: {unloggable}")
        if not spec.client_request_id:  # a job id of its own: nothing to deduplicate
            return await self._decide(job_id, spec, context, claimed=False)
        claim = self._requests.claim(job_id)
        if claim is None:
            mine = await self._claim(job_id, spec)
            claim = self._requests.claim(job_id)
            if claim is None or claim.event_id == mine:  # ours is the first in the log
                return await self._decide(job_id, spec, context, claimed=True)
        try:
            outcome = await asyncio.wait_for(self._requests.outcome(job_id), DECIDE_WITHIN_S)
        except TimeoutError:
            age = time.monotonic() - claim.seen_at
            if age < TAKE_OVER_AFTER_S:
                raise Unavailable(
                    f"job {job_id} is still being decided by the request that claimed it "
                    f"{age:.0f} s ago"
                ) from None
            # The request that claimed it died before deciding: decide its spec for it,
            # unless the sweep or another retry is doing so.
            if not self._requests.take(job_id):
                raise Unavailable(f"job {job_id} is being decided; ask again") from None
            log.warning("%s was claimed %.0f s ago but not decided; deciding it here", job_id, age)
            return await self._decide(job_id, claim.spec, context, claimed=True, taken=True)
        if not outcome.admitted:
            code = getattr(grpc.StatusCode, outcome.status, grpc.StatusCode.INVALID_ARGUMENT)
            await context.abort(code, _rejection_text(code, outcome.reason))
        return js.SubmitJobResponse(job_id=job_id, duplicate=True)

    async def _claim(self, job_id: str, spec: types_pb2.JobSpec) -> str:
        """Append the job's claim and read the log up to it; returns its event id."""
        [(claim, written)] = await self.record(
            [events_pb2.JobSubmitted(job_id=job_id, spec=spec)], job_id, spec.cluster
        )
        try:
            await asyncio.wait_for(
                self._follower.reached(written.topic_partition, written.offset), LOG_TIMEOUT_S
            )
        except TimeoutError:
            raise Unavailable("the event log could not be read back in time") from None
        return claim.event_id

    async def _decide(
        self,
        job_id: str,
        spec: types_pb2.JobSpec,
        context: grpc.aio.ServicerContext,
        *,
        claimed: bool,
        taken: bool = False,
    ) -> js.SubmitJobResponse:
        """Admit or reject the job, and answer the caller so; ``taken``: a claim taken
        over from a request that died (``RequestLog.take``)."""
        if taken:
            refusal = await self._judge_taken(job_id, spec)
        else:
            refusal = await self._judge(job_id, spec, claimed=claimed)
        if refusal:
            await context.abort(*refusal)
        return js.SubmitJobResponse(job_id=job_id)

    async def _judge_taken(
        self, job_id: str, spec: types_pb2.JobSpec
    ) -> tuple[grpc.StatusCode, str] | None:
        """``_judge`` a claim taken from the request log (``RequestLog.take``), giving it
        back when no decision could be written."""
        try:
            return await self._judge(job_id, spec, claimed=True)
        except BaseException:
            self._requests.give_back(job_id)
            raise

    async def _judge(
        self, job_id: str, spec: types_pb2.JobSpec, *, claimed: bool
    ) -> tuple[grpc.StatusCode, str] | None:
        """Record the job admitted or rejected; the status and message of a rejection.
        ``claimed``: its JobSubmitted is in the log already."""
        tree = await self._budget.tree()
        refusal = await self._refusal(spec, tree) or await self._unmet_after(job_id, spec)
        if refusal is not None:
            code, field, message = refusal
            await self._reject(job_id, spec, field, message, status=code)
            return code, _rejection_text(code, message)
        decided: list[Message] = [events_pb2.JobAdmitted(job_id=job_id, spec=spec)]
        if not claimed:
            decided.insert(0, events_pb2.JobSubmitted(job_id=job_id, spec=spec))
        [(first, _), *_] = await self.record(decided, job_id, spec.cluster)
        self._remember(
            types_pb2.Job(
                job_id=job_id,
                spec=spec,
                state=types_pb2.JOB_STATE_PENDING,
                submitted_at=first.occurred_at,
            )
        )
        return None

    async def _refusal(
        self, spec: types_pb2.JobSpec, tree: BudgetTree
    ) -> tuple[grpc.StatusCode, str, str] | None:
        """Why ``spec`` may not run (status, first field at fault, every rule broken), or
        None: the site's limits, its nodes' room and the budget tree, and its user's
        membership."""
        mine = tree.allocations_of(spec.user)
        if not spec.allocation:
            return grpc.StatusCode.INVALID_ARGUMENT, "allocation", _membership(spec.user, "", mine)
        # As submitted: a workflow's DAG is checked by validate_job, naming the task.
        submitted = spec_from_proto(spec, workflow_as_given=True)
        violations, on_nodes = _judged(submitted, await self._limits_for(spec), tree.leaves())
        if on_nodes:  # a node may be brand new
            limits = await self._limits_for(spec, fresh=True)
            violations, _ = _judged(submitted, limits, tree.leaves())
        if violations:
            message = "; ".join(str(v) for v in violations)
            return grpc.StatusCode.INVALID_ARGUMENT, violations[0].field, message
        if spec.allocation not in mine:
            message = _membership(spec.user, spec.allocation, mine)
            return grpc.StatusCode.PERMISSION_DENIED, "allocation", message
        return None

    async def _unmet_after(
        self, job_id: str, spec: types_pb2.JobSpec
    ) -> tuple[grpc.StatusCode, str, str] | None:
        """The first job ``spec`` waits for that it may not: one its user cannot see
        (answered as one that does not exist, as ``GetJob`` does), itself, or a workflow
        (the scheduler follows batch jobs' ends only)."""
        for other in (dependency.job_id for dependency in spec.after):
            if other == job_id:
                rule = f"{other} is this job"
            elif (job := await self._seen_by(spec.user, other)) is None:
                rule = f"no job {other} you can see"
            elif job.spec.HasField("workflow"):
                rule = f"{other} is a workflow; --after follows batch jobs only"
            else:
                continue
            return grpc.StatusCode.INVALID_ARGUMENT, "after", f"after: {rule}"
        return None

    async def decide_abandoned(self) -> int:
        """Decide the claims nobody decided within TAKE_OVER_AFTER_S (their request died
        and its client did not retry): without this such a job would stay SUBMITTED.
        Returns how many it decided."""
        decided = 0
        for job_id, claim in self._requests.undecided(older_than_s=TAKE_OVER_AFTER_S):
            if not self._requests.take(job_id):  # a retry of its request took it meanwhile
                continue
            log.warning("%s was claimed but not decided; deciding it here", job_id)
            await self._judge_taken(job_id, claim.spec)
            decided += 1
        return decided

    async def sweep(self, every_s: float = SWEEP_EVERY_S) -> None:
        """Run ``decide_abandoned`` every ``every_s`` until cancelled; a dependency that
        is down only delays it (the claims wait for the next round)."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.decide_abandoned()
            except Unavailable as exc:
                log.warning("abandoned claims wait: %s", exc)

    async def CancelJob(
        self, request: js.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> js.CancelJobResponse:
        if is_array_id(request.job_id):
            cancelled = await self._steer_array(
                request.job_id,
                "cancel",
                context,
                takes=lambda job: not has_ended(job),
                event=lambda job, user: events_pb2.JobCancelRequested(
                    job_id=job.job_id, requested_by=user
                ),
                none_left="is still to end: all have ended",
            )
            return js.CancelJobResponse(job_id=request.job_id, cancelled=cancelled)
        user, job = await self._steerable_job_or_abort(request.job_id, "cancel", context)
        if has_ended(job):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {job.job_id} already ended ({types_pb2.JobState.Name(job.state)})",
            )
        await self.record(
            [events_pb2.JobCancelRequested(job_id=job.job_id, requested_by=user)],
            job.job_id,
            job.spec.cluster or "default",
        )
        return js.CancelJobResponse(job_id=job.job_id)

    async def _steer_array(
        self,
        array_id: str,
        verb: str,
        context: grpc.aio.ServicerContext,
        *,
        takes: Callable[[types_pb2.Job], bool],
        event: Callable[[types_pb2.Job, str], Message],
        none_left: str,
    ) -> list[str]:
        """Act on every element of the array that the caller may steer and that
        ``takes`` (an ``event`` each, as if one by one); the elements acted on. Refused
        (nothing recorded) when the caller sees none, may steer none, or none takes it
        (``none_left`` says why)."""
        user = await caller(context, self._keys)
        elements = await self._elements(user, array_id)
        if not elements:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no job array {array_id!r}")
        tree = await self._budget.tree()
        mine = [job for job in elements if _may_steer(user, job, tree)]
        if not mine:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, _steer_rule(user, verb))
        chosen = [job for job in mine if takes(job)]
        if not chosen:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"no element of job array {array_id} that you may {verb} {none_left}",
            )
        by_cluster: dict[str, list[Message]] = {}
        for job in chosen:
            by_cluster.setdefault(job.spec.cluster or "default", []).append(event(job, user))
        for cluster, events in by_cluster.items():
            await self.record(events, array_id, cluster)
        return [job.job_id for job in chosen]

    async def HoldJob(
        self, request: js.HoldJobRequest, context: grpc.aio.ServicerContext
    ) -> js.HoldJobResponse:
        if is_array_id(request.job_id):
            held = await self._steer_array(
                request.job_id,
                "hold",
                context,
                takes=lambda job: _waits(job) and not job.held,
                event=lambda job, user: events_pb2.JobHeld(
                    job_id=job.job_id, held=True, requested_by=user
                ),
                none_left="is waiting and not held",
            )
            return js.HoldJobResponse(job_id=request.job_id, held=held)
        user, job = await self._steerable_job_or_abort(request.job_id, "hold", context)
        await _waiting_batch_job_or_abort(job, "held", context)
        await self._record_hold(job, user, held=True)
        return js.HoldJobResponse(job_id=job.job_id)

    async def ReleaseJob(
        self, request: js.ReleaseJobRequest, context: grpc.aio.ServicerContext
    ) -> js.ReleaseJobResponse:
        if is_array_id(request.job_id):
            released = await self._steer_array(
                request.job_id,
                "release",
                context,
                takes=lambda job: job.held and not has_ended(job),
                event=lambda job, user: events_pb2.JobHeld(
                    job_id=job.job_id, held=False, requested_by=user
                ),
                none_left="is held",
            )
            return js.ReleaseJobResponse(job_id=request.job_id, released=released)
        user, job = await self._steerable_job_or_abort(request.job_id, "release", context)
        if not job.held:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"job {job.job_id} is not held"
            )
        await self._record_hold(job, user, held=False)
        return js.ReleaseJobResponse(job_id=job.job_id)

    async def UpdateJob(
        self, request: js.UpdateJobRequest, context: grpc.aio.ServicerContext
    ) -> js.UpdateJobResponse:
        user, job = await self._steerable_job_or_abort(request.job_id, "update", context)
        paths = list(request.update_mask.paths)
        if not paths or not set(paths) <= UPDATABLE:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"update_mask: name one or more of {', '.join(sorted(UPDATABLE))}",
            )
        await _waiting_batch_job_or_abort(job, "updated", context)
        spec = types_pb2.JobSpec()
        spec.CopyFrom(job.spec)
        request.update_mask.MergeMessage(request.spec, spec)
        refusal = await self._refusal(spec, await self._budget.tree())
        if refusal is not None:
            code, _, message = refusal
            await context.abort(code, _rejection_text(code, message))
        event = events_pb2.JobUpdated(job_id=job.job_id, spec=spec, requested_by=user)
        await self.record([event], job.job_id, spec.cluster or "default")
        updated = types_pb2.Job()
        updated.CopyFrom(job)
        updated.spec.CopyFrom(spec)
        return js.UpdateJobResponse(job=updated)

    async def _record_hold(self, job: types_pb2.Job, user: str, *, held: bool) -> None:
        event = events_pb2.JobHeld(job_id=job.job_id, held=held, requested_by=user)
        await self.record([event], job.job_id, job.spec.cluster or "default")

    async def _steerable_job_or_abort(
        self, job_id: str, verb: str, context: grpc.aio.ServicerContext
    ) -> tuple[str, types_pb2.Job]:
        """The caller and the job, if they may steer it: their own, or one of an
        allocation they manage."""
        user = await caller(context, self._keys)
        job = await self._visible_job_or_abort(user, job_id, context)
        if not _may_steer(user, job, await self._budget.tree()):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, _steer_rule(user, verb))
        return user, job

    async def GetJob(
        self, request: js.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> js.GetJobResponse:
        user = await caller(context, self._keys)
        return js.GetJobResponse(
            job=await self._visible_job_or_abort(user, request.job_id, context)
        )

    async def ListJobs(
        self, request: js.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> js.ListJobsResponse:
        user = await caller(context, self._keys)
        await bounded(context, "allocation", request.allocation, MAX_TEXT_CHARS)
        await bounded(context, "user", request.user, MAX_NAME_CHARS)
        states = frozenset(request.states)
        if unknown := states - _LISTED_STATES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"states: {', '.join(str(s) for s in sorted(unknown))} name no job state; use "
                + ", ".join(types_pb2.JobState.Name(s) for s in sorted(_LISTED_STATES)),
            )
        await bounded(context, "array_id", request.array_id, MAX_NAME_CHARS)
        if request.array_id and not is_array_id(request.array_id):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"array_id: {request.array_id!r} names no job array (a-<hex>, as submitted)",
            )
        # The filter picks within the caller's scope: the projector applies both.
        where = JobFilter(request.allocation, request.user, states, request.array_id)
        scope = await self._scope(user)
        jobs = await self._projector.list_jobs(where, request.limit or DEFAULT_LIST_LIMIT, scope)
        return js.ListJobsResponse(jobs=jobs)

    async def WatchJob(
        self, request: js.WatchJobRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[js.WatchJobResponse]:
        user = await caller(context, self._keys)
        await bounded(context, "job_id", request.job_id, MAX_NAME_CHARS)
        last: types_pb2.Job | None = None
        while True:
            job = await self._lookup(request.job_id)
            if last is None and (job is None or not await self._may_see(user, job)):
                await context.abort(grpc.StatusCode.NOT_FOUND, _no_job(request.job_id))
            if job is not None and job != last:
                yield js.WatchJobResponse(job=job)
                last = job
                if has_ended(job):
                    return
            await asyncio.sleep(self._watch_interval_s)

    async def StreamLogs(
        self, request: js.StreamLogsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[js.StreamLogsResponse]:
        user = await caller(context, self._keys)
        job = await self._visible_job_or_abort(user, request.job_id, context)
        while request.follow and not _has_output_to_follow(job):
            await asyncio.sleep(self._watch_interval_s)
            job = await self._lookup(job.job_id) or job
        pieces = job_output(
            self._logs,
            job,
            nodes=lambda job: self._projector.list_nodes(job.spec.cluster),
            lookup=self._lookup,
            attempt=request.attempt,
            follow=request.follow,
        )
        try:
            async for task, data in pieces:
                yield js.StreamLogsResponse(
                    data=data,
                    source=task.endpoint,
                    task_id=task.task_id,
                    node_id=task.node_id,
                    attempt=task.attempt,
                    part=task.part,
                )
        except NoOutput as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    async def ExplainJob(
        self, request: js.ExplainJobRequest, context: grpc.aio.ServicerContext
    ) -> js.ExplainJobResponse:
        user = await caller(context, self._keys)
        job = await self._visible_job_or_abort(user, request.job_id, context)
        answer = js.ExplainJobResponse(
            job_id=job.job_id, state=job.state, allocation=job.spec.allocation
        )
        why = self._explainer.explain(job.job_id, job.spec.cluster or "default")
        if why is None or has_ended(job):
            answer.reason = _explain(job)
            return answer
        answer.reason = why.text
        last = preemption_from_proto(job.preemption) if job.HasField("preemption") else None
        if last is not None:  # it waits again, or runs again: say what stopped it before
            answer.reason += f"; earlier {last}"
        answer.jobs_ahead = why.jobs_ahead
        if why.starts_at is not None:
            answer.estimated_start.FromNanoseconds(int(why.starts_at * 1e9))
        if why.standing is not None:
            answer.rank = why.standing.rank
            answer.ranks = why.standing.of
            answer.fair_share_ratio = why.standing.ratio
        return answer

    async def _limits_for(self, spec: types_pb2.JobSpec, *, fresh: bool = False) -> Limits:
        """The limits with the nodes of the job's cluster (``NodeView``; ``fresh``: asked
        now) and, for a workflow, their largest GPU of its type; unknown (anything fits)
        without nodes or projector."""
        nodes = await self._nodes.nodes(spec.cluster, fresh=fresh)
        limits = replace(self._limits, nodes=nodes)
        if not spec.HasField("workflow") or math.isfinite(limits.gpu_memory_mb) or not nodes:
            return limits  # no workflow, or its largest GPU configured (or unknown)
        largest = max(
            (n.gpu_memory_gib for n in nodes if not spec.gpu_type or n.gpu_type == spec.gpu_type),
            default=0.0,
        )
        return replace(limits, gpu_memory_mb=largest * GIB / BYTES_PER_MB) if largest else limits

    async def _job_or_abort(self, job_id: str, context: grpc.aio.ServicerContext) -> types_pb2.Job:
        await bounded(context, "job_id", job_id, MAX_NAME_CHARS)
        job = await self._lookup(job_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, _no_job(job_id))
        assert job is not None
        return job

    async def _visible_job_or_abort(
        self, user: str, job_id: str, context: grpc.aio.ServicerContext
    ) -> types_pb2.Job:
        """The job, if ``user`` may see it; a job they may not see is answered as one that
        does not exist, so that its existence is not told either."""
        job = await self._job_or_abort(job_id, context)
        if not await self._may_see(user, job):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no job {job_id!r}")
        return job

    async def _may_see(self, user: str, job: types_pb2.Job) -> bool:
        scope = await self._scope(user)
        return scope is None or scope.admits(job)

    async def is_operator(self, user: str) -> bool:
        """Whether ``user`` sees every job and may steer the cluster's nodes."""
        return await self._scope(user) is None

    async def _scope(self, user: str) -> Scope | None:
        """The jobs ``user`` may see; None: every job (operators, the root's managers)."""
        return scope_of(user, await self._budget.tree(), self._operators)

    async def _lookup(self, job_id: str) -> types_pb2.Job | None:
        return await self._projector.get_job(job_id) or self._recent.get(job_id)

    async def _seen_by(self, user: str, job_id: str) -> types_pb2.Job | None:
        """The job if ``user`` may see it: as ``_lookup`` finds it, else as the log's claim
        has it (one submitted a moment ago through another instance may not be projected)."""
        job = await self._lookup(job_id)
        if job is None and (claim := self._requests.claim(job_id)) is not None:
            job = types_pb2.Job(job_id=job_id, spec=claim.spec)
        return job if job is not None and await self._may_see(user, job) else None

    async def _elements(self, user: str, array_id: str) -> list[types_pb2.Job]:
        """The elements of a job array that ``user`` may see, by index: as projected, and
        those this instance recorded that are not yet (read-your-writes)."""
        where = JobFilter(array_id=array_id)
        scope = await self._scope(user)
        found = {
            job.job_id: job
            for job in await self._projector.list_jobs(where, MAX_ARRAY_ELEMENTS, scope)
        }
        for job in list(self._recent.values()):
            seen = scope is None or scope.admits(job)
            if job.job_id not in found and where.matches(job) and seen:
                found[job.job_id] = job
        return sorted(found.values(), key=lambda job: job.spec.array.index)

    async def _after_arrays(self, user: str, spec: types_pb2.JobSpec) -> None:
        """Put a dependency on a job array as one on each of its elements that ``user``
        may see now, in the same way; one on an array with none is left for
        ``_unmet_after`` to refuse. Elements submitted later are not waited for."""
        if not any(is_array_id(d.job_id) for d in spec.after) or len(spec.after) > MAX_DEPENDENCIES:
            return
        after: list[types_pb2.Dependency] = []
        for dependency in spec.after:
            elements = []
            if is_array_id(dependency.job_id):
                elements = await self._elements(user, dependency.job_id)
            after += [
                types_pb2.Dependency(job_id=job.job_id, condition=dependency.condition)
                for job in elements
            ] or [dependency]
        del spec.after[:]
        spec.after.extend(after)

    async def _known(self, job_id: str) -> bool:
        return await self._lookup(job_id) is not None

    def _remember(self, job: types_pb2.Job) -> None:
        self._recent[job.job_id] = job
        if len(self._recent) > 10_000:
            self._recent.popitem(last=False)

    async def _reject(
        self,
        job_id: str,
        spec: types_pb2.JobSpec,
        field: str,
        reason: str,
        *,
        status: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT,
        record_spec: bool = True,
    ) -> None:
        rejected = events_pb2.JobRejected(
            job_id=job_id, field=field, reason=_cut(reason), status=status.name
        )
        if record_spec:
            rejected.spec.CopyFrom(spec)
        await self.record([rejected], job_id, spec.cluster or "default")

    async def record(
        self, payloads: list[Message], job_id: str, cluster: str
    ) -> list[tuple[events_pb2.Envelope, RecordMetadata]]:
        """Append events in order; return each with where the broker wrote it, once it
        has all. A broker that does not answer in time makes the call UNAVAILABLE."""
        acks = []
        envelopes: list[events_pb2.Envelope] = []
        try:
            for payload in payloads:
                env = new_envelope(
                    payload,
                    producer=PRODUCER,
                    cluster=cluster,
                    correlation_id=job_id,
                    causation_id=envelopes[-1].event_id if envelopes else "",
                )
                envelopes.append(env)
                acks.append(await self._producer.enqueue(self._topic, env, key=cluster))
            written = await asyncio.wait_for(asyncio.gather(*acks), LOG_TIMEOUT_S)
        except (KafkaError, TimeoutError) as exc:
            raise Unavailable(
                f"the event log (Kafka) did not take the record in {LOG_TIMEOUT_S:g} s "
                f"({type(exc).__name__})"
            ) from None
        return list(zip(envelopes, written, strict=True))


class ClusterServicer(cluster_service_pb2_grpc.ClusterServiceServicer):
    """Nodes for everyone to see; cordons for operators, recorded in the event log
    through ``jobs`` (which holds admission's producer)."""

    def __init__(self, *, projector: ProjectorClient, keys: Keys, jobs: JobServicer) -> None:
        self._projector = projector
        self._keys = keys
        self._jobs = jobs

    async def CordonNode(
        self, request: cluster_service_pb2.CordonNodeRequest, context: grpc.aio.ServicerContext
    ) -> cluster_service_pb2.CordonNodeResponse:
        node = await self._cordon(request.node_id, True, request.drain, context)
        return cluster_service_pb2.CordonNodeResponse(node=node)

    async def UncordonNode(
        self, request: cluster_service_pb2.UncordonNodeRequest, context: grpc.aio.ServicerContext
    ) -> cluster_service_pb2.UncordonNodeResponse:
        node = await self._cordon(request.node_id, False, False, context)
        return cluster_service_pb2.UncordonNodeResponse(node=node)

    async def _cordon(
        self, node_id: str, cordoned: bool, drain: bool, context: grpc.aio.ServicerContext
    ) -> types_pb2.Node:
        user = await caller(context, self._keys)
        if not await self._jobs.is_operator(user):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{user} may not cordon or drain nodes: operators only "
                "(QM_OPERATORS, or a manager of the budget tree's root)",
            )
        await bounded(context, "node_id", node_id, MAX_NAME_CHARS)
        nodes = {n.inventory.node_id: n for n in await self._projector.list_nodes()}
        node = nodes.get(node_id)
        if node is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no node {node_id!r}")
        assert node is not None
        event = events_pb2.NodeCordoned(
            node_id=node_id, cordoned=cordoned, drain=drain, requested_by=user
        )
        await self._jobs.record([event], node_id, node.inventory.cluster or "default")
        return node

    async def ListNodes(
        self, request: cluster_service_pb2.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> cluster_service_pb2.ListNodesResponse:
        await caller(context, self._keys)
        await bounded(context, "cluster", request.cluster, MAX_TEXT_CHARS)
        return cluster_service_pb2.ListNodesResponse(
            nodes=await self._projector.list_nodes(request.cluster)
        )


def _no_job(job_id: str) -> str:
    """What a job id that names no job the caller may see gets; an array's id says how
    to ask for its elements instead."""
    if is_array_id(job_id):
        return (
            f"{job_id} is a job array, not one job: qm status {job_id} lists its elements, "
            f"and {job_id}_N names element N"
        )
    return f"no job {job_id!r}"


def _may_steer(user: str, job: types_pb2.Job, tree: BudgetTree) -> bool:
    """Whether ``user`` may cancel, hold, release or update ``job``: their own, or one of
    an allocation they manage."""
    return job.spec.user == user or tree.can_manage(user, job.spec.allocation)


def _steer_rule(user: str, verb: str) -> str:
    return f"{user} may {verb} only their own jobs or jobs of allocations they manage"


def _array_violation(spec: types_pb2.JobSpec) -> Violation | None:
    """What is wrong with a job array's element as such (``JobSpec.array``)."""
    if not spec.HasField("array"):
        return None
    if not spec.client_request_id:
        return Violation("client_request_id", "an array's elements share one: the array's")
    if spec.HasField("workflow"):
        return Violation("array", "an array is of batch jobs, not workflows")
    if not 1 <= spec.array.count <= MAX_ARRAY_ELEMENTS:
        return Violation("array.count", f"an array holds 1 to {MAX_ARRAY_ELEMENTS} jobs")
    if spec.array.index > MAX_ARRAY_INDEX:
        return Violation("array.index", f"at most {MAX_ARRAY_INDEX}")
    return None


def _membership(user: str, allocation: str, mine: list[str]) -> str:
    if allocation:
        return (
            f"{user} is not a member of allocation {allocation!r}; "
            f"member of: {', '.join(mine) or 'none'}"
        )
    return (
        f"allocation: is required; {user} belongs to {len(mine)} allocations "
        f"({', '.join(mine) or 'none'}): choose one with --allocation"
    )


# What ``qm update`` may change: how much and what kind of room, who pays, the contract;
# never what runs (its command, environment, secrets) or whose it is.
UPDATABLE = frozenset(
    {"gpus", "gpu_type", "min_gpu_memory_gib", "allocation", "min_runtime", "resumable",
     "priority", "runtime_estimate"}
)  # fmt: skip


def _waits(job: types_pb2.Job) -> bool:
    """Whether the job is a batch job that waits: what may be held or updated."""
    waiting = job.state in (types_pb2.JOB_STATE_SUBMITTED, types_pb2.JOB_STATE_PENDING)
    return waiting and not job.spec.HasField("workflow")


async def _waiting_batch_job_or_abort(
    job: types_pb2.Job, done: str, context: grpc.aio.ServicerContext
) -> None:
    """FAILED_PRECONDITION unless the job is a batch job that waits (what can be ``done``)."""
    if not _waits(job):
        state = types_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"only a batch job that waits can be {done}; job {job.job_id} is {state}",
        )


def _judged(
    spec: JobSpec, limits: Limits, allocations: Collection[str]
) -> tuple[list[Violation], bool]:
    """Every rule ``spec`` breaks (``validate_job``'s, then, if its size and GPUs pass
    those, ``_no_room``'s), and whether one rests on the nodes' offer."""
    found = validate_job(spec, limits, allocations)
    offered = any(v.field in _OFFERED_FIELDS for v in found)
    if any(v.field in _SIZE_FIELDS for v in found):
        return found, offered
    room = _no_room(spec, limits.nodes)
    return found + room, offered or bool(room)


def _no_room(spec: JobSpec, nodes: Collection[NodeSpec]) -> list[Violation]:
    """What no set of the cluster's registered nodes could ever hold: a batch job whose
    command must run on more GPUs than one node offers without naming its nodes (the
    core would run it as a gang of whole nodes, which only a simulated run may be), or
    more parts than there are nodes with room for one. Nothing without a view of the
    nodes, nor when none offers its GPUs at all (``validate_job`` names those there are)."""
    if spec.workflow is not None:
        return []
    fit = [n for n in nodes if spec.may_use(n.gpu_type, n.gpu_memory_gib, n.kind)]
    if not fit:
        return []
    gpus = f"{spec.gpu_type} GPUs" if spec.gpu_type else "GPUs"
    if spec.parts == 1:
        largest = max(n.gpu_count for n in fit)
        if spec.gpus <= largest or NodeKind.SIMULATED in spec.node_kinds:
            return []
        rule = f"at most {largest} {gpus} on one node here; for more, --nodes N --gpus-per-node M"
        return [Violation("gpus", rule)]
    room = sum(n.gpu_count >= spec.block for n in fit)
    if room >= spec.parts:
        return []
    have = f"only {room} here {'has' if room == 1 else 'have'}" if room else "none here has"
    rule = f"{spec.parts} parts of {spec.block} {gpus} need {spec.parts} nodes; {have} as many"
    return [Violation("nodes", rule)]


def _has_output_to_follow(job: types_pb2.Job) -> bool:
    """Whether following the job's output can start: its task runs (so its agent knows
    it is still writing) or it is over."""
    return (
        job.state == types_pb2.JOB_STATE_RUNNING
        or has_ended(job)
        or any(task.state == types_pb2.JOB_STATE_RUNNING for task in job.tasks)
    )


def _unloggable(spec: types_pb2.JobSpec) -> Violation | None:
    """What keeps a job from being recorded at all: a spec too large for a record (the
    rule that makes it so, when one does: a 2 MB command is the command's fault), or a
    cluster name too long to key one."""
    size = spec.ByteSize()
    if size > MAX_SPEC_BYTES:
        broken = validate_job(spec_from_proto(spec, workflow_as_given=True))
        return next(
            (v for v in broken if _sizes(v)),
            Violation("spec", f"the job is {size} bytes; at most {MAX_SPEC_BYTES}"),
        )
    if len(spec.cluster) > MAX_TEXT_CHARS:
        return Violation("cluster", f"must be at most {MAX_TEXT_CHARS} characters")
    return None


_SIZED = frozenset(
    {"command", "env", "allocation", "user", "gpu_type", "client_request_id", "after"}
)


def _sizes(violation: Violation) -> bool:
    """A rule that can make a spec too large: a field's size, never a missing field (a
    job without --allocation gets its default later, and is no larger for it)."""
    sized = violation.field in _SIZED or violation.field.startswith("workflow")
    return sized and not violation.rule.startswith("is required")


def _rejection_text(code: grpc.StatusCode, reason: str) -> str:
    """A rejection as its first answer said it: a permission refusal speaks for itself."""
    return reason if code == grpc.StatusCode.PERMISSION_DENIED else f"invalid job: {reason}"


def _cut(reason: str) -> str:
    return reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…"


def _explain(job: types_pb2.Job) -> str:
    state = types_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_").lower()
    if job.state == types_pb2.JOB_STATE_PENDING:
        return job.reason or "waiting for the scheduler to consider it"
    if job.spec.HasField("workflow") and job.tasks:
        done = sum(t.state == types_pb2.JOB_STATE_FINISHED for t in job.tasks)
        progress = f"{done} of {len(job.spec.workflow.tasks)} workflow tasks finished"
        if job.state in (types_pb2.JOB_STATE_PLACED, types_pb2.JOB_STATE_RUNNING):
            return f"{state}: {progress}"
    if job.state in (types_pb2.JOB_STATE_PLACED, types_pb2.JOB_STATE_RUNNING):
        gpus = ",".join(str(g) for g in job.gpu_indices)
        return f"{state} on {job.node_id} (GPUs {gpus})"
    if job.reason.startswith(state):  # "preempted for ...": it says so itself
        return job.reason
    return f"{state}" + (f": {job.reason}" if job.reason else "")

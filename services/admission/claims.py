"""Submitting a job: claimed in the log, then judged, once whatever the retries."""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Collection
from dataclasses import replace

import grpc
from google.protobuf.message import Message
from qm.v1 import events_pb2, types_pb2
from qm.v1 import job_service_pb2 as js

from libs.auth import Keys
from libs.core import JobSpec, Limits, NodeKind, NodeSpec, Violation, validate_job
from libs.core.budget_tree import BudgetTree
from libs.core.compass.workflow import BYTES_PER_MB
from libs.core.ids import array_element_id, is_array_id
from libs.core.limits import (
    MAX_ARRAY_ELEMENTS,
    MAX_ARRAY_INDEX,
    MAX_DEPENDENCIES,
    MAX_SPEC_BYTES,
    MAX_TEXT_CHARS,
)
from libs.core.model import GIB
from libs.events.convert import spec_from_proto
from services.admission.budget_view import BudgetView
from services.admission.follower import Follower
from services.admission.journal import LOG_TIMEOUT_S, Journal
from services.admission.node_view import NodeView
from services.admission.requests import RequestLog
from services.admission.scope import Access
from services.authn import caller
from services.projector.client import ProjectorClient
from services.status import Unavailable

log = logging.getLogger("admission")

# What a refusal for the nodes' offer names: checked again against a fresh view first.
_OFFERED_FIELDS = frozenset({"gpu_type", "min_gpu_memory_gib"})


# What a job's size is judged by: one broken leaves the nodes' room unjudged (``_no_room``).
_SIZE_FIELDS = _OFFERED_FIELDS | {"gpus", "nodes"}


_NAMESPACE = uuid.UUID("6f1d7a4e-2b1c-4e55-9a43-6c1f0e6f0a11")


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


class Submissions:
    """``SubmitJob``: a submission is claimed in the log first (idempotent by its client
    request id: a retry finds the claim and waits for its verdict), then judged against
    the site's limits, the nodes and the budget tree, and admitted or rejected; claims
    whose request died are decided by ``sweep``."""

    def __init__(
        self,
        *,
        journal: Journal,
        access: Access,
        budget: BudgetView,
        projector: ProjectorClient,
        limits: Limits,
        keys: Keys,
        requests: RequestLog,
        follower: Follower,
    ) -> None:
        self._journal = journal
        self._access = access
        self._budget = budget
        self._nodes = NodeView(projector)
        self._limits = limits
        self._keys = keys
        self._requests = requests
        self._follower = follower

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
            await self._journal.reject(
                job_id, spec, unloggable.field, str(unloggable), record_spec=False
            )
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
            await context.abort(code, rejection_text(code, outcome.reason))
        return js.SubmitJobResponse(job_id=job_id, duplicate=True)

    async def _claim(self, job_id: str, spec: types_pb2.JobSpec) -> str:
        """Append the job's claim and read the log up to it; returns its event id."""
        [(claim, written)] = await self._journal.record(
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
        refusal = await self.refusal(spec, tree) or await self._unmet_after(job_id, spec)
        if refusal is not None:
            code, field, message = refusal
            await self._journal.reject(job_id, spec, field, message, status=code)
            return code, rejection_text(code, message)
        decided: list[Message] = [events_pb2.JobAdmitted(job_id=job_id, spec=spec)]
        if not claimed:
            decided.insert(0, events_pb2.JobSubmitted(job_id=job_id, spec=spec))
        [(first, _), *_] = await self._journal.record(decided, job_id, spec.cluster)
        self._journal.remember(
            types_pb2.Job(
                job_id=job_id,
                spec=spec,
                state=types_pb2.JOB_STATE_PENDING,
                submitted_at=first.occurred_at,
            )
        )
        return None

    async def refusal(
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
            elif (job := await self._access.seen_by(spec.user, other)) is None:
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
                elements = await self._access.elements(user, dependency.job_id)
            after += [
                types_pb2.Dependency(job_id=job.job_id, condition=dependency.condition)
                for job in elements
            ] or [dependency]
        del spec.after[:]
        spec.after.extend(after)


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


def rejection_text(code: grpc.StatusCode, reason: str) -> str:
    """A rejection as its first answer said it: a permission refusal speaks for itself."""
    return reason if code == grpc.StatusCode.PERMISSION_DENIED else f"invalid job: {reason}"

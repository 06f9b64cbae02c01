"""Seeded gRPC fuzzing of JobService, ClusterService and BudgetService.

Three sources of requests, all from one ``random.Random(seed)``:

- valid requests with one or two fields made odd (NaN and infinities, zero and
  huge counts, 2 MB commands, maps of 20,000 entries, broken workflows, 100,000-task
  workflows, allocations of others), each labelled with what is odd and whether a
  correct service must refuse it;
- random protobuf messages of each method's request type, every field drawn from
  boundary values (the descriptor is walked, so new fields are fuzzed too);
- bad credentials: no token, malformed, signed with another installation's key, an
  unknown user, junk, expired, for another audience, unsigned (``alg: none``).

Every answer must be a status a client can act on; UNKNOWN, INTERNAL, DATA_LOSS and
UNIMPLEMENTED are not. A call that gets no answer within its deadline counts apart.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import string
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import jwt
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from qm.v1 import budget_service_pb2 as bs
from qm.v1 import cluster_service_pb2 as cs
from qm.v1 import job_service_pb2 as js
from qm.v1 import types_pb2

from libs.auth import SigningKey, issue_token
from libs.core import simulated
from libs.events.wire_time import duration_ms
from services.grpc_server import bearer
from tests.chaos.clients import Clients
from tests.chaos.workload import make_spec, workflows

IMPROPER = frozenset({"UNKNOWN", "INTERNAL", "DATA_LOSS", "UNIMPLEMENTED"})
UNANSWERED = "DEADLINE_EXCEEDED"
CALL_TIMEOUT_S = 15.0
MB = 1 << 20
USERS = ("alice", "bob", "erin", "mallory")

FLOATS = (math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 1e308, 5e-324, 0.5, 3.0)
INTS = (0, 1, -1, 2**31 - 1, -(2**31), 7, 1000)
UINTS = (0, 1, 2, 64, 65, 2**32 - 1, 1000)
STRINGS = (
    "",
    "a",
    "default",
    "vision-detection",
    "ünïcødé 🚀",
    "\x00",
    "../../etc/passwd",
    "'; DROP TABLE jobs; --",
    "j-0000000000000000",
    "x" * 1000,
)


@dataclass(frozen=True)
class Case:
    method: str  # "JobService/SubmitJob"
    request: Message
    metadata: tuple[tuple[str, str], ...]
    user: str  # who the token names ("" for a bad token)
    label: str  # what is odd about it
    must_refuse: bool  # a correct service answers with an error


@dataclass
class FuzzResult:
    sent: int = 0
    codes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (method, code)
    improper: list[str] = field(default_factory=list)  # examples: "method label: code detail"
    unanswered: list[str] = field(default_factory=list)
    accepted_invalid: list[str] = field(default_factory=list)
    accepted_jobs: list[tuple[str, str]] = field(default_factory=list)  # (job id, user)

    @property
    def improper_count(self) -> int:
        return sum(n for (_, code), n in self.codes.items() if code in IMPROPER)

    @property
    def unanswered_count(self) -> int:
        return sum(n for (_, code), n in self.codes.items() if code == UNANSWERED)


def _odd_string(rng: random.Random, budget: list[int]) -> str:
    if rng.random() < 0.02 and budget[0] > 100_000:
        budget[0] -= 100_000
        return "y" * 100_000
    if rng.random() < 0.3:
        return "".join(rng.choices(string.printable, k=rng.randint(1, 40)))
    return rng.choice(STRINGS)


def random_message(message: Message, rng: random.Random, budget: list[int], depth: int = 0) -> None:
    """Fill ``message`` with boundary values, field by field, ``budget`` bytes at most."""
    for fd in message.DESCRIPTOR.fields:
        if rng.random() < 0.4:
            continue
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            entries = getattr(message, fd.name)
            value_fd = fd.message_type.fields_by_name["value"]
            for _ in range(rng.choice((1, 3, 50))):
                key = _odd_string(rng, budget)
                if value_fd.message_type is None:
                    entries[key] = _scalar(value_fd, rng, budget)
            continue
        if fd.is_repeated:
            count = rng.choice((0, 1, 2, 5, 200))
            container = getattr(message, fd.name)
            for _ in range(count):
                if fd.message_type is not None:
                    if depth < 3:
                        random_message(container.add(), rng, budget, depth + 1)
                else:
                    container.append(_scalar(fd, rng, budget))
            continue
        if fd.message_type is not None:
            if depth < 3:
                random_message(getattr(message, fd.name), rng, budget, depth + 1)
            continue
        setattr(message, fd.name, _scalar(fd, rng, budget))


# fd: a FieldDescriptor, of the pure-Python or the upb flavour (typed apart by the stubs).
def _scalar(fd: Any, rng: random.Random, budget: list[int]) -> Any:
    kind = fd.cpp_type
    if kind in (FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT):
        return rng.choice(FLOATS)
    if kind == FieldDescriptor.CPPTYPE_INT32:
        return rng.choice(INTS)
    if kind == FieldDescriptor.CPPTYPE_INT64:
        return rng.choice((*INTS, 2**63 - 1, -(2**63)))
    if kind == FieldDescriptor.CPPTYPE_UINT32:
        return rng.choice(UINTS)
    if kind == FieldDescriptor.CPPTYPE_UINT64:
        return rng.choice((*UINTS, 2**64 - 1))
    if kind == FieldDescriptor.CPPTYPE_BOOL:
        return rng.random() < 0.5
    if kind == FieldDescriptor.CPPTYPE_ENUM:
        assert fd.enum_type is not None
        valid = [v.number for v in fd.enum_type.values]
        return rng.choice((*valid, -1, 99, 2**31 - 1))
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(rng.choice((0, 1, 32, 1000)))
    return _odd_string(rng, budget)


REQUEST_TYPES: list[tuple[str, type[Message]]] = [
    ("JobService/SubmitJob", js.SubmitJobRequest),
    ("JobService/CancelJob", js.CancelJobRequest),
    ("JobService/GetJob", js.GetJobRequest),
    ("JobService/ListJobs", js.ListJobsRequest),
    ("JobService/WatchJob", js.WatchJobRequest),
    ("JobService/ExplainJob", js.ExplainJobRequest),
    ("ClusterService/ListNodes", cs.ListNodesRequest),
    ("BudgetService/GetTree", bs.GetTreeRequest),
    ("BudgetService/SetAllocation", bs.SetAllocationRequest),
    ("BudgetService/GetBalances", bs.GetBalancesRequest),
]


# --- SubmitJob: a valid job with one field made odd ---------------------------------
# (label, change, must a correct service refuse it)
Mutation = tuple[str, Callable[[types_pb2.JobSpec, random.Random], None], bool]


def _set(name: str, value: Any) -> Callable[[types_pb2.JobSpec, random.Random], None]:
    def change(spec: types_pb2.JobSpec, _rng: random.Random) -> None:
        setattr(spec, name, value)

    return change


def _simulated(key: str, text: str) -> Callable[[types_pb2.JobSpec, random.Random], None]:
    """An entry of the environment a simulated node reads (``libs.core.simulated``)."""

    def change(spec: types_pb2.JobSpec, _rng: random.Random) -> None:
        spec.env[key] = text

    return change


def _min_runtime(seconds: int) -> Callable[[types_pb2.JobSpec, random.Random], None]:
    def change(spec: types_pb2.JobSpec, _rng: random.Random) -> None:
        spec.min_runtime.FromSeconds(seconds)

    return change


def _request_id(odd: str) -> Callable[[types_pb2.JobSpec, random.Random], None]:
    """An odd request id, still one per request: a shared one would make later ones retries."""

    def change(spec: types_pb2.JobSpec, _rng: random.Random) -> None:
        spec.client_request_id = odd + spec.client_request_id

    return change


def _command(argv: list[str]) -> Callable[[types_pb2.JobSpec, random.Random], None]:
    def change(spec: types_pb2.JobSpec, _rng: random.Random) -> None:
        spec.command[:] = argv

    return change


def _huge_env(spec: types_pb2.JobSpec, _rng: random.Random) -> None:
    for i in range(20_000):
        spec.env[f"K{i}"] = "v" * 100


def _workflow(change: Callable[[types_pb2.Workflow], None]) -> Callable[..., None]:
    def apply(spec: types_pb2.JobSpec, rng: random.Random) -> None:
        spec.gpu_type, spec.gpus = "T4", 1
        del spec.command[:]
        spec.workflow.CopyFrom(rng.choice(_FLOWS))
        change(spec.workflow)

    return apply


def _cycle(flow: types_pb2.Workflow) -> None:
    flow.tasks[0].parents.append(flow.tasks[-1].task_id)


def _unknown_parent(flow: types_pb2.Workflow) -> None:
    flow.tasks[-1].parents.append("no-such-task")


def _duplicate_ids(flow: types_pb2.Workflow) -> None:
    flow.tasks.add().CopyFrom(flow.tasks[0])


def _no_tasks(flow: types_pb2.Workflow) -> None:
    del flow.tasks[:]


def _task_field(name: str, value: float) -> Callable[[types_pb2.Workflow], None]:
    """Change a task that serves a model (a glue task has no memory to be too large)."""

    def change(flow: types_pb2.Workflow) -> None:
        setattr(next(t for t in flow.tasks if t.model), name, value)

    return change


def _negative_run(flow: types_pb2.Workflow) -> None:
    next(t for t in flow.tasks if t.model).run_duration.FromMilliseconds(-1)


def _wide(count: int) -> Callable[[types_pb2.Workflow], None]:
    """A workflow of ``count`` independent tasks."""

    def change(flow: types_pb2.Workflow) -> None:
        del flow.tasks[:]
        for i in range(count):
            flow.tasks.add(task_id=f"t{i}", model="", run_duration=duration_ms(1.0))

    return change


_FLOWS = workflows()
MUTATIONS: list[Mutation] = [
    ("gpus 0", _set("gpus", 0), True),
    ("gpus 65", _set("gpus", 65), True),
    ("gpus 2^32-1", _set("gpus", 2**32 - 1), True),
    ("simulated seconds nan", _simulated(simulated.SECONDS, "nan"), True),
    ("simulated seconds inf", _simulated(simulated.SECONDS, "inf"), True),
    ("simulated seconds -inf", _simulated(simulated.SECONDS, "-inf"), True),
    ("simulated seconds -1", _simulated(simulated.SECONDS, "-1"), True),
    ("simulated seconds not a number", _simulated(simulated.SECONDS, "soon"), True),
    ("simulated entry unknown", _simulated("QM_SIMULATED_COLOUR", "blue"), True),
    ("min_gpu_memory_gib nan", _set("min_gpu_memory_gib", math.nan), True),
    ("min_gpu_memory_gib inf", _set("min_gpu_memory_gib", math.inf), True),
    ("simulated utilization nan", _simulated(simulated.UTILIZATION, "nan"), True),
    ("simulated utilization 1.5", _simulated(simulated.UTILIZATION, "1.5"), True),
    ("min_runtime 2^32-1 s", _min_runtime(2**32 - 1), True),
    ("min_runtime -1 s", _min_runtime(-1), True),
    ("command empty", _command([]), True),
    ("command ['']", _command([""]), True),
    ("command with NUL", _command(["sh", "-c", "true\x00"]), True),
    ("2 MB command", _command(["x" * (2 * MB)]), True),
    ("5 MB command (over gRPC's limit)", _command(["x" * (5 * MB)]), True),
    ("env of 20,000 entries", _huge_env, True),
    ("allocation unknown", _set("allocation", "no-such-allocation"), True),
    ("allocation not a leaf", _set("allocation", "vision"), True),
    ("submit as another user", _set("user", "carol"), True),
    ("workflow without tasks", _workflow(_no_tasks), True),
    ("workflow with a cycle", _workflow(_cycle), True),
    ("workflow with an unknown parent", _workflow(_unknown_parent), True),
    ("workflow with duplicate task ids", _workflow(_duplicate_ids), True),
    ("workflow model_mb nan", _workflow(_task_field("model_mb", math.nan)), True),
    ("workflow run_duration -1 ms", _workflow(_negative_run), True),
    ("workflow model larger than any GPU", _workflow(_task_field("model_mb", 1e9)), True),
    ("workflow of 100,000 tasks", _workflow(_wide(100_000)), True),
    ("workflow of 3,000 tasks", _workflow(_wide(3_000)), False),
    ("priority -2^31", _set("priority", -(2**31)), False),
    ("priority 2^31-1", _set("priority", 2**31 - 1), False),
    ("simulated exit code -2^31", _simulated(simulated.EXIT, str(-(2**31))), False),
    ("simulated exit code 2^31", _simulated(simulated.EXIT, str(2**31)), True),
    ("unknown gpu_type", _set("gpu_type", "Z9000"), False),
    ("any gpu_type", _set("gpu_type", ""), False),
    ("unknown cluster", _set("cluster", "nowhere"), False),
    ("client_request_id of 100 kB", _request_id("r" * 100_000), False),
    ("unicode request id", _request_id("ünï-🚀"), False),
    ("resumable", _set("resumable", True), False),
]
# Costly mutations (a megabyte or more, or thousands of tasks): each is sent once.
HEAVY = frozenset(
    {
        "2 MB command",
        "5 MB command (over gRPC's limit)",
        "env of 20,000 entries",
        "workflow of 100,000 tasks",
        "workflow of 3,000 tasks",
    }
)


# Another installation's key: its tokens are well formed and must still be refused.
OTHER = SigningKey.generate()


class Fuzzer:
    def __init__(
        self,
        clients: Clients,
        signer: SigningKey,
        *,
        seed: int,
        run_id: str,
        known_jobs: Callable[[], list[tuple[str, str]]],
    ) -> None:
        self._clients = clients
        self._signer = signer
        self._rng = random.Random(seed)
        self._run_id = run_id
        self._known_jobs = known_jobs
        self._count = 0

    # --- cases ------------------------------------------------------------------------

    def _token(self, user: str) -> tuple[tuple[str, str], ...]:
        return bearer(issue_token(user, self._signer))

    def _bad_token(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        rng = self._rng
        choices: list[tuple[str, tuple[tuple[str, str], ...]]] = [
            ("no token", ()),
            ("empty bearer", (("authorization", "Bearer "),)),
            ("malformed token", bearer("qm1.x")),
            ("basic auth", (("authorization", "Basic YWxpY2U6cGFzcw=="),)),
            ("token of another installation", bearer(issue_token("alice", OTHER))),
            ("junk token of 8 kB", bearer("z" * 8192)),
            ("expired token", bearer(issue_token("alice", self._signer, ttl_s=60, now=0))),
            ("token for another audience", bearer(issue_token("alice", replace(
                self._signer, audience="elsewhere"
            )))),
            ("unsigned token (alg none)", bearer(jwt.encode(
                {"sub": "alice", "aud": "quartermaster", "iss": "quartermaster",
                 "iat": int(time.time()), "exp": int(time.time()) + 600}, "", algorithm="none"
            ))),
        ]  # fmt: skip
        return rng.choice(choices)

    def case(self) -> Case:
        rng = self._rng
        roll = rng.random()
        user = rng.choice(USERS)
        if roll < 0.12:
            label, metadata = self._bad_token()
            method, request = self._random_request()
            return Case(method, request, metadata, "", f"{label}; random request", True)
        if roll < 0.22:
            method, request = self._random_request()
            return Case(method, request, self._token(user), user, "random request", False)
        if roll < 0.27:  # a valid user nobody put in the tree
            method, request = self._random_request()
            return Case(method, request, self._token("zed"), "zed", "unknown user", False)
        if roll < 0.75:
            return self._odd_submit(user)
        return self._odd_other(user)

    def _random_request(self) -> tuple[str, Message]:
        method, cls = self._rng.choice(REQUEST_TYPES)
        request = cls()
        random_message(request, self._rng, [2 * MB])
        if isinstance(request, js.ListJobsRequest):
            # A real client asks for a page; a limit of 2^32 lists every job ever.
            request.limit = min(request.limit, 1000)
        return method, request

    def every_mutation(self) -> Iterator[Case]:
        """Each odd submission once, and each bad token once, before the random ones."""
        for mutation in MUTATIONS:
            yield self._odd_submit(self._rng.choice(USERS), [mutation])
        for _ in range(20):
            label, metadata = self._bad_token()
            method, request = self._random_request()
            yield Case(method, request, metadata, "", f"{label}; random request", True)

    def _odd_submit(self, user: str, chosen: list[Mutation] | None = None) -> Case:
        rng = self._rng
        self._count += 1
        spec = make_spec(rng, "small", _FLOWS)
        spec.client_request_id = f"{self._run_id}-fuzz-{self._count}"
        if chosen is None:
            light = [m for m in MUTATIONS if m[0] not in HEAVY]
            chosen = [rng.choice(light)]
            if rng.random() < 0.3:
                chosen.append(rng.choice(light))
        # Those that must be refused go last: two mutations of one field (an exit code
        # too large, then one that fits) would otherwise leave a valid spec labelled odd.
        chosen = sorted(chosen, key=lambda mutation: mutation[2])
        for _, change, _ in chosen:
            change(spec, rng)
        label = " + ".join(name for name, _, _ in chosen)
        refuse = any(must for _, _, must in chosen)
        request = js.SubmitJobRequest(spec=spec)
        return Case("JobService/SubmitJob", request, self._token(user), user, label, refuse)

    def _odd_other(self, user: str) -> Case:
        rng = self._rng
        known = self._known_jobs()
        other = rng.choice(known) if known else ("j-0000000000000000", "alice")
        odd_id = rng.choice(
            ["", "j-deadbeefdeadbeef", "../../x", "ünï", "x" * 100_000, f"{other[0]}/0"]
        )
        choice = rng.randrange(9)
        if choice == 0:
            stranger = next(u for u in USERS if u != other[1])
            return Case(
                "JobService/CancelJob",
                js.CancelJobRequest(job_id=other[0]),
                self._token(stranger),
                stranger,
                "cancel another user's job",
                True,
            )
        if choice == 1:
            return Case(
                "JobService/CancelJob",
                js.CancelJobRequest(job_id=odd_id),
                self._token(user),
                user,
                f"cancel unknown job {odd_id[:20]!r}",
                True,
            )
        if choice in (2, 3, 4):
            method, cls = rng.choice(
                [
                    ("JobService/GetJob", js.GetJobRequest),
                    ("JobService/ExplainJob", js.ExplainJobRequest),
                    ("JobService/WatchJob", js.WatchJobRequest),
                ]
            )
            real = rng.random() < 0.5
            request = cls(job_id=other[0] if real else odd_id)
            label = "a real job" if real else f"unknown job {odd_id[:20]!r}"
            return Case(method, request, self._token(user), user, label, not real)
        if choice == 5:
            odd = types_pb2.JobState.ValueType(99)  # names no state
            choices: list[list[types_pb2.JobState.ValueType]] = [
                [],
                [types_pb2.JOB_STATE_RUNNING],
                [types_pb2.JOB_STATE_UNSPECIFIED],
                [odd],
            ]
            states = rng.choice(choices)
            request = js.ListJobsRequest(
                allocation=rng.choice(["", "nlp", "vision", "nope", "x" * 10_000]),
                user=rng.choice(["", user, "bob", "x" * 10_000]),
                states=states,
                limit=rng.choice([0, 1, 1000]),
            )
            named = set(types_pb2.JobState.values()) - {types_pb2.JOB_STATE_UNSPECIFIED}
            unknown = any(s not in named for s in states)
            label = f"list in states {states}" if unknown else "list"
            return Case("JobService/ListJobs", request, self._token(user), user, label, unknown)
        if choice == 6:
            request = cs.ListNodesRequest(cluster=rng.choice(["", "default", "nowhere", "\x00"]))
            return Case(
                "ClusterService/ListNodes", request, self._token(user), user, "nodes", False
            )
        return self._odd_allocation(user)

    def _odd_allocation(self, user: str) -> Case:
        """A budget change, mostly by mallory (who manages only the `fuzz` leaf)."""
        rng = self._rng
        manager = "mallory" if rng.random() < 0.8 else user
        weight = rng.choice(FLOATS)
        node = types_pb2.BudgetNode(
            name=rng.choice(["fuzz-a", "fuzz-b", "", "vision-detection", "lab", "x" * 1000]),
            parent=rng.choice(["fuzz", "", "lab", "no-such-parent"]),
            weight=weight,
            members=rng.choice([[], ["mallory"], [""], [f"u{i}" for i in range(5000)]]),
            managers=rng.choice([[], ["mallory"]]),
        )
        refuse = (
            manager != "mallory"
            or not (math.isfinite(weight) and weight > 0)
            or node.parent != "fuzz"
            or not node.name
        )
        label = f"set {node.name[:12]!r} under {node.parent!r}, weight {weight}"
        request = bs.SetAllocationRequest(node=node)
        return Case(
            "BudgetService/SetAllocation", request, self._token(manager), manager, label, refuse
        )

    # --- calls ------------------------------------------------------------------------

    async def run(self, requests: int, deadline_s: float, concurrency: int = 16) -> FuzzResult:
        """Send up to ``requests`` cases, stopping early at ``deadline_s`` (loop time)."""
        result = FuzzResult()
        loop = asyncio.get_running_loop()
        first = list(self.every_mutation())
        cases: Iterator[Case] = itertools.chain(
            first, (self.case() for _ in range(requests - len(first)))
        )

        async def worker() -> None:
            for case in cases:
                if loop.time() > deadline_s:
                    return
                await self._call(case, result)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return result

    async def _call(self, case: Case, result: FuzzResult) -> None:
        result.sent += 1
        service, method = case.method.split("/")
        stub: Any = {
            "JobService": self._clients.jobs,
            "ClusterService": self._clients.cluster,
            "BudgetService": self._clients.budget,
        }[service]
        detail = ""
        reply: Any = None
        try:
            if method == "WatchJob":
                stream = stub.WatchJob(case.request, metadata=case.metadata, timeout=5)
                async for _ in stream:  # the first message is the answer
                    break
                stream.cancel()
            else:
                reply = await getattr(stub, method)(
                    case.request, metadata=case.metadata, timeout=CALL_TIMEOUT_S
                )
            code = "OK"
        except grpc.aio.AioRpcError as error:
            code, detail = error.code().name, (error.details() or "")[:200]
        result.codes[(case.method, code)] += 1
        example = f"{case.method} [{case.label}]: {code} {detail!r}"
        if code in IMPROPER:
            result.improper.append(example)
        elif code == UNANSWERED:
            result.unanswered.append(example)
        elif code == "OK" and case.must_refuse:
            result.accepted_invalid.append(example)
        if code == "OK" and method == "SubmitJob":
            result.accepted_jobs.append((reply.job_id, case.user))

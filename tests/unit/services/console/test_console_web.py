"""The console's HTTP surface, on a real aiohttp server with a feed of canned views:
who gets in, what a page may load, and what each user's data holds."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from google.protobuf.duration_pb2 import Duration
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2

from libs.auth import Keys, SigningKey, issue_token
from libs.auth.tokens import _LEEWAY_S as LEEWAY_S
from libs.config.budget import tree_from_mapping
from libs.core.budget_tree import BudgetTree
from services.authn import caller
from services.console.feed import Feed
from services.console.session import COOKIE
from services.console.starts import StartEstimates
from services.console.web_app import RUNNER_OPTIONS, make_app
from services.projector.client import ProjectorUnavailable
from services.tls import TlsSettings

SIGNER = SigningKey.generate()
KEYS = Keys.trusting(SIGNER)
TREE = tree_from_mapping(
    {
        "name": "lab",
        "managers": ["carol"],
        "children": [
            {"name": "vision", "weight": 3, "members": ["alice"]},
            {"name": "nlp", "weight": 1, "members": ["bob"]},
        ],
    }
)
_S = types_pb2.JobState


def waiting(job_id: str, user: str, allocation: str) -> types_pb2.Job:
    return types_pb2.Job(
        job_id=job_id,
        state=_S.JOB_STATE_PENDING,
        reason="<script>alert(1)</script>",
        spec=types_pb2.JobSpec(
            allocation=allocation, user=user, gpus=1, min_runtime=Duration(seconds=60)
        ),
    )


class Projector:
    def __init__(self) -> None:
        self.down = False
        self.jobs = [waiting("j-a", "alice", "vision"), waiting("j-b", "bob", "nlp")]

    async def list_nodes(self, cluster: str = "") -> list[types_pb2.Node]:
        if self.down:
            raise ProjectorUnavailable("projector at http://x unreachable")
        gpus = [types_pb2.Gpu(index=i, type="H100") for i in range(4)]
        return [types_pb2.Node(inventory=types_pb2.NodeInventory(node_id="n0", gpus=gpus))]

    async def list_jobs(self, limit: int = 100) -> list[types_pb2.Job]:
        return self.jobs


class Budget:
    async def tree(self) -> BudgetTree:
        return TREE


class Admission(js_grpc.JobServiceServicer):
    """Explains j-a (which holds nodes, starting at ``START``) and nothing else, to
    whoever shows a token; records who asked about what."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str]] = []

    async def ExplainJob(
        self, request: js.ExplainJobRequest, context: grpc.aio.ServicerContext
    ) -> js.ExplainJobResponse:
        user = await caller(context, KEYS)
        self.asked.append((user, request.job_id))
        answer = js.ExplainJobResponse(job_id=request.job_id)
        if request.job_id == "j-a":
            answer.estimated_start.FromSeconds(START)
        return answer


START = 1_900_000_000


@pytest.fixture
async def admission() -> AsyncIterator[tuple[Admission, str]]:
    servicer, server = Admission(), grpc.aio.server()
    js_grpc.add_JobServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


@pytest.fixture
async def console(
    admission: tuple[Admission, str],
) -> AsyncIterator[tuple[TestServer, Feed, Projector]]:
    projector = Projector()
    feed = Feed(
        projector,
        Budget(),
        window_s=3600,
        poll_s=1,
        job_limit=10,  # type: ignore[arg-type]
        operators=frozenset({"olga"}),
    )
    starts = StartEstimates(admission[1], TlsSettings())
    server = TestServer(make_app(feed, KEYS, starts, secure=False))
    await server.start_server(**RUNNER_OPTIONS)  # served as the console serves it
    try:
        yield server, feed, projector
    finally:
        await server.close()
        await starts.close()


def token(user: str, *, expired: bool = False) -> str:
    return issue_token(user, SIGNER, ttl_s=60, now=time.time() - (3600 if expired else 0))


async def view(server: TestServer, user_token: str) -> tuple[int, dict[str, object]]:
    async with (
        ClientSession(cookies={COOKIE: user_token}) as http,
        http.get(server.make_url("/api/view")) as response,
    ):
        return response.status, await response.json()


async def test_without_a_token_the_page_sends_you_to_sign_in(console) -> None:  # type: ignore[no-untyped-def]
    server, feed, _ = console
    await feed.refresh()
    async with ClientSession() as http:
        async with http.get(server.make_url("/"), allow_redirects=False) as page:
            assert page.status == 303 and page.headers["Location"] == "/login"
        async with http.get(server.make_url("/api/view")) as data:
            assert data.status == 401
        async with http.get(server.make_url("/login")) as login:
            assert login.status == 200
            csp = login.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "unsafe-inline" not in csp
            assert login.headers["X-Content-Type-Options"] == "nosniff"
        # A browser asks for it on a page without an icon: the icon, not a refusal.
        async with http.get(server.make_url("/favicon.ico")) as icon:
            assert icon.status == 200 and icon.url.path == "/static/favicon.svg"


async def test_a_bad_or_expired_token_is_refused_in_words(console) -> None:  # type: ignore[no-untyped-def]
    server, feed, _ = console
    await feed.refresh()
    async with ClientSession() as http:
        origin = {"Origin": str(server.make_url("")).rstrip("/")}
        async with http.post(
            server.make_url("/login"), data={"token": "<b>x</b>"}, headers=origin
        ) as bad:
            body = await bad.text()
            assert bad.status == 401 and "that token does not sign in" in body
            assert "<b>x</b>" not in body  # nothing pasted comes back as markup
        async with http.post(
            server.make_url("/login"),
            data={"token": token("alice")},
            headers={"Origin": "http://evil.example"},
        ) as forged:
            assert forged.status == 403
    assert (await view(server, token("alice", expired=True)))[0] == 401


async def test_signing_in_sets_a_strict_http_only_cookie(console) -> None:  # type: ignore[no-untyped-def]
    server, feed, _ = console
    await feed.refresh()
    async with ClientSession() as http:
        origin = {"Origin": str(server.make_url("")).rstrip("/")}
        async with http.post(
            server.make_url("/login"), data={"token": token("alice")}, headers=origin,
            allow_redirects=False,
        ) as response:  # fmt: skip
            assert response.status == 303 and response.headers["Location"] == "/"
            cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Secure" not in cookie


async def test_a_token_in_the_address_signs_no_one_in_and_is_not_logged(  # type: ignore[no-untyped-def]
    console, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither ``?token=`` nor an ``Authorization`` header reaches the access log, which
    logs each request's method, path and status."""
    server, feed, _ = console
    await feed.refresh()
    secret = token("alice")
    caplog.set_level(logging.DEBUG)
    async with ClientSession() as http:
        for path in ("/", "/api/view", "/login"):
            url = server.make_url(path).with_query(token=secret)
            headers = {"Authorization": f"Bearer {secret}", "Referer": str(url)}
            async with http.get(url, headers=headers, allow_redirects=False) as response:
                assert response.status == 400 and "Set-Cookie" not in response.headers
                assert "a token in the address signs no one in" in await response.text()
        assert not http.cookie_jar.filter_cookies(server.make_url("/"))
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "GET /api/view 400" in logged
    assert secret not in logged and "token=" not in logged


async def test_each_user_sees_their_scope_and_operators_see_all(console) -> None:  # type: ignore[no-untyped-def]
    server, feed, _ = console
    await feed.refresh()
    for user, jobs in (
        ("alice", {"j-a"}),
        ("bob", {"j-b"}),
        ("carol", {"j-a", "j-b"}),
        ("olga", {"j-a", "j-b"}),
    ):
        status, data = await view(server, token(user))
        assert status == 200
        assert {w["job_id"] for w in data["waiting"]} == jobs, user  # type: ignore[index, union-attr]
        assert data["occupancy"]["now"]["capacity"] == 4  # type: ignore[index, call-overload]


async def test_readiness_follows_the_projector_and_stale_data_says_so(console) -> None:  # type: ignore[no-untyped-def]
    server, feed, projector = console
    async with ClientSession() as http:
        async with http.get(server.make_url("/readyz")) as before:
            assert before.status == 503
        await feed.refresh()
        async with http.get(server.make_url("/readyz")) as ready:
            assert ready.status == 200
        projector.down = True
        feed.problem = ""
        with pytest.raises(ProjectorUnavailable):
            await feed.refresh()
        feed.problem = "projector at http://x unreachable"
        async with http.get(server.make_url("/readyz")) as stale:
            assert stale.status == 503
    status, data = await view(server, token("alice"))
    assert status == 200 and data["stale"] == "projector at http://x unreachable"


async def test_events_push_the_view_on_each_refresh(console) -> None:  # type: ignore[no-untyped-def]
    server, feed, projector = console
    await feed.refresh()
    async with (
        ClientSession(cookies={COOKIE: token("bob")}) as http,
        http.get(server.make_url("/events")) as stream,
    ):
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        first = await next_view(stream)
        assert {w["job_id"] for w in first["waiting"]} == {"j-b"}
        projector.jobs = [*projector.jobs, waiting("j-c", "bob", "nlp")]
        await feed.refresh()
        second = await next_view(stream)
        assert {w["job_id"] for w in second["waiting"]} == {"j-b", "j-c"}


async def next_view(stream: web.StreamResponse) -> dict[str, object]:
    event = ""
    async for raw in stream.content:  # type: ignore[attr-defined]
        line = raw.decode().rstrip("\r\n")
        if line.startswith("event:"):
            event = line.removeprefix("event:").strip()
        elif line.startswith("data:") and event == "view":
            return json.loads(line.removeprefix("data:").strip())  # type: ignore[no-any-return]
    raise AssertionError("the stream ended without a view")


async def test_a_stream_ends_when_its_token_expires(console) -> None:  # type: ignore[no-untyped-def]
    server, feed, _ = console
    await feed.refresh()
    # Valid for about two more seconds, the verifier's leeway for clock skew included.
    lapsing = issue_token("bob", SIGNER, ttl_s=60, now=time.time() - 60 - LEEWAY_S + 2)
    async with (
        ClientSession(cookies={COOKIE: lapsing}) as http,
        http.get(server.make_url("/events")) as stream,
    ):
        await next_view(stream)
        await asyncio.sleep(2.5)
        await feed.refresh()
        lines = [raw.decode().strip() async for raw in stream.content]
    assert "event: signed-out" in lines


async def test_a_waiting_job_shows_the_start_admission_estimates_asked_as_its_user(  # type: ignore[no-untyped-def]
    console, admission
) -> None:
    server, feed, _ = console
    await feed.refresh()
    _, alices = await view(server, token("alice"))
    _, bobs = await view(server, token("bob"))
    assert [(w["job_id"], w["estimated_start"]) for w in alices["waiting"]] == [("j-a", START)]  # type: ignore[index]
    assert [(w["job_id"], w["estimated_start"]) for w in bobs["waiting"]] == [("j-b", None)]  # type: ignore[index]
    # Each asked about their own jobs only, with their own token.
    assert sorted(admission[0].asked) == [("alice", "j-a"), ("bob", "j-b")]

"""The console in a real browser against a real stack: it signs users in with the CLI's
tokens (pasted, never from the address), draws a chart per GPU type whose legend reads
the latest figures, shows what the API says (waiting, running and ended jobs), hides
other teams' jobs, and updates without a reload. Its screenshots (console-*.png) go to a
temporary folder, or to ``QM_CONSOLE_SCREENSHOTS`` (``QM_CONSOLE_SCREENSHOTS=docs``
refreshes the README's)."""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from google.protobuf.duration_pb2 import Duration
from qm.v1 import cluster_service_pb2 as cs
from qm.v1 import cluster_service_pb2_grpc as cs_grpc
from qm.v1 import job_service_pb2 as js
from qm.v1 import job_service_pb2_grpc as js_grpc
from qm.v1 import types_pb2
from selenium import webdriver
from selenium.webdriver.common.by import By

from libs.auth import issue_token
from libs.core import simulated
from tests.integration.conftest import eventually
from tests.integration.stack import Stack

ROOT = Path(__file__).resolve().parents[2]
WAITING = {types_pb2.JOB_STATE_SUBMITTED, types_pb2.JOB_STATE_PENDING}
RUNNING = {types_pb2.JOB_STATE_PLACED, types_pb2.JOB_STATE_RUNNING}
ENDED = {types_pb2.JOB_STATE_FINISHED, types_pb2.JOB_STATE_FAILED}
A100_CHART = '#occupancy-charts figure[data-gpu-type="A100"]'  # the simulated node's type
T = TypeVar("T")

# Short: a workflow that finishes in a second on the simulated A100 node.
CAPTION = types_pb2.Workflow(
    name="caption",
    tasks=[
        types_pb2.WorkflowTask(
            task_id="see",
            model="vit",
            model_mb=8_000,
            run_duration=Duration(nanos=200_000_000),
            in_kb=300,
            out_kb=2,
        ),
        types_pb2.WorkflowTask(
            task_id="say",
            model="tts",
            model_mb=8_000,
            run_duration=Duration(nanos=100_000_000),
            in_kb=2,
            out_kb=300,
            parents=["see"],
        ),
    ],
)


def until(probe: Callable[[], T | None], what: str) -> T:
    """``eventually``, with the patience a browser's page wants."""
    return eventually(probe, timeout=45, what=what)


def submit(stack: Stack, user: str, **spec: object) -> str:
    jobs = js_grpc.JobServiceStub(stack.channel())
    reply = jobs.SubmitJob(
        js.SubmitJobRequest(spec=types_pb2.JobSpec(**spec)),  # type: ignore[arg-type]
        metadata=stack.auth(user),
        timeout=30,
    )
    return str(reply.job_id)


def hold_a100(stack: Stack, user: str, allocation: str, gpus: int) -> str:
    """A charged job on the simulated A100 node that runs for ten minutes."""
    return submit(
        stack,
        user,
        allocation=allocation,
        gpus=gpus,
        gpu_type="A100",
        min_runtime=Duration(seconds=600),
        env={simulated.SECONDS: "600"},
        command=["sleep", "600"],
    )


def api_jobs(stack: Stack, user: str) -> list[types_pb2.Job]:
    jobs = js_grpc.JobServiceStub(stack.channel())
    reply = jobs.ListJobs(js.ListJobsRequest(limit=1000), metadata=stack.auth(user), timeout=10)
    return list(reply.jobs)


def api_nodes(stack: Stack, user: str) -> list[types_pb2.Node]:
    nodes = cs_grpc.ClusterServiceStub(stack.channel())
    return list(nodes.ListNodes(cs.ListNodesRequest(), metadata=stack.auth(user)).nodes)


def text(browser: webdriver.Chrome, element_id: str) -> str:
    """An element's text, read in one go: the page may replace it (or be replaced by the
    next one) at any moment; "" while there is no such element."""
    script = "return document.getElementById(arguments[0])?.textContent ?? ''"
    return str(browser.execute_script(script, element_id)).strip()


def row(browser: webdriver.Chrome, tbody_id: str, first: str) -> list[str]:
    """The cells of the row whose first cell is ``first`` ([] while there is none)."""
    script = (
        "const tr = [...document.querySelectorAll(`#${arguments[0]} tr`)]"
        ".find((r) => r.cells[0]?.textContent === arguments[1]);"
        "return tr ? [...tr.cells].map((td) => td.textContent) : [];"
    )
    return list(browser.execute_script(script, tbody_id, first))


def legend(browser: webdriver.Chrome, chart: str) -> list[str]:
    """The values a chart's legend shows (under ``chart``, a CSS selector)."""
    script = "return [...document.querySelectorAll(`${arguments[0]} .u-legend .u-value`)]"
    return [str(v) for v in browser.execute_script(script + ".map((td) => td.textContent)", chart)]


def first_column(browser: webdriver.Chrome, tbody_id: str) -> set[str]:
    """The first cell of every row, read in one go (the page replaces rows as it updates)."""
    script = (
        "return [...document.querySelectorAll(`#${arguments[0]} tr td:first-child`)]"
        ".filter((td) => !td.classList.contains('empty')).map((td) => td.textContent)"
    )
    return set(browser.execute_script(script, tbody_id))


def sign_in_with_form(browser: webdriver.Chrome, stack: Stack, token: str) -> None:
    browser.get(f"{stack.console_url}/login")
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def loaded(browser: webdriver.Chrome) -> None:
    until(lambda: browser.execute_script("return document.body.dataset.updates"), "the page")


def errors(browser: webdriver.Chrome) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


# Pixels in a chart's canvas of a series' colour (not the axes' grey): the series drew.
_SERIES_PIXELS = """
const [chart, r, g, b] = arguments;
const canvas = document.querySelector(`${chart} canvas`);
if (!canvas) return 0;
const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
let n = 0;
for (let i = 0; i < data.length; i += 4) {
  if (data[i + 3] > 200 && Math.abs(data[i] - r) < 24 && Math.abs(data[i + 1] - g) < 24
      && Math.abs(data[i + 2] - b) < 24) n++;
}
return n;
"""


def series_pixels(browser: webdriver.Chrome, chart: str, rgb: tuple[int, int, int]) -> int:
    return int(browser.execute_script(_SERIES_PIXELS, chart, *rgb))


def shows_what_the_api_says(browser: webdriver.Chrome, stack: Stack, user: str) -> bool:
    jobs = api_jobs(stack, user)
    waiting = {job.job_id for job in jobs if job.state in WAITING}
    batch = [job for job in jobs if not job.spec.HasField("workflow")]
    running = {job.job_id for job in batch if job.state in RUNNING}
    ended = {job.job_id for job in batch if job.state in ENDED}
    up = [node for node in api_nodes(stack, user) if not node.lost]
    gpus = sum(len(node.inventory.gpus) for node in up)
    busy = sum(len(task.gpu_indices) for node in up for task in node.running)
    return (
        text(browser, "waiting-count") == str(len(waiting))
        and first_column(browser, "waiting-rows") == waiting
        and first_column(browser, "running-rows") == running
        and ended <= first_column(browser, "ended-rows")
        and text(browser, "gpus-total") == str(gpus)
        and text(browser, "gpus-busy") == str(busy)
        and first_column(browser, "occupancy-rows") == {"A100", "H100"}
        and first_column(browser, "node-rows") == {n.inventory.node_id for n in up}
    )


def test_the_console_shows_each_user_their_part_of_the_cluster_live(
    stack: Stack, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    folder = os.environ.get("QM_CONSOLE_SCREENSHOTS")
    shots = ROOT / folder if folder else tmp_path
    shots.mkdir(exist_ok=True)
    # Without a token: the login page; a bad one is refused in words.
    browser.get(stack.console_url)
    assert browser.current_url.endswith("/login")
    sign_in_with_form(browser, stack, "not-a-token")
    until(lambda: "that token does not sign in" in text(browser, "error"), "the refusal")
    browser.save_screenshot(str(shots / "console-login.png"))
    browser.get_log("browser")  # the refusal's 401 is the point: not an error of the page

    # A workflow that finishes, then the A100 node filled by both teams, and one
    # job of each that must wait for it.
    flow = submit(
        stack,
        "alice",
        allocation="vision",
        gpus=1,
        gpu_type="A100",
        workflow=CAPTION,
    )
    until(
        lambda: any(
            j.job_id == flow and j.state == types_pb2.JOB_STATE_FINISHED
            for j in api_jobs(stack, "alice")
        ),
        "the workflow to finish",
    )
    # Two commands that run as processes on the H100 nodes: one succeeds, one fails.
    done, failed = (
        submit(stack, "alice", allocation="vision", gpus=1, gpu_type="H100",
               command=["python3", "-c", code])
        for code in ("print(42)", "raise SystemExit(3)")
    )  # fmt: skip
    until(
        lambda: {j.job_id for j in api_jobs(stack, "alice") if j.state in ENDED} >= {done, failed},
        "the process jobs to end",
    )
    hold_a100(stack, "alice", "vision", 4)
    hold_a100(stack, "bob", "nlp", 4)
    until(
        lambda: sum(len(t.gpu_indices) for n in api_nodes(stack, "alice") for t in n.running) == 8,
        "both teams' jobs to run",
    )
    alices = hold_a100(stack, "alice", "vision", 4)
    hold_a100(stack, "bob", "nlp", 2)

    # Alice signs in with the form and sees the API's numbers, her waiting job among them.
    sign_in_with_form(browser, stack, issue_token("alice", stack.signer))
    loaded(browser)
    until(lambda: shows_what_the_api_says(browser, stack, "alice"), "alice's page to match")
    assert alices in first_column(browser, "waiting-rows")
    assert flow in first_column(browser, "workflow-rows")
    # The A100 node (simulated) is full, the H100 nodes (processes) idle: each type apart.
    assert row(browser, "occupancy-rows", "A100")[1:] == ["simulated", "8", "8", "0", "0", "100.0%"]
    assert row(browser, "occupancy-rows", "H100")[1:] == ["processes", "8", "0", "0", "0", "0.0%"]
    # How each job ended, and which run now, within alice's scope.
    assert row(browser, "ended-rows", done)[4:6] == ["finished", "exit 0"]
    assert row(browser, "ended-rows", failed)[4] == "failed"
    assert row(browser, "ended-rows", failed)[5].startswith("exit 3")
    assert len(first_column(browser, "running-rows")) == 2  # both teams' A100 jobs
    # Charts: the busy line and the delivered bars (and the target line) are drawn; the
    # legend reads the latest figures, not uPlot's "--".
    until(lambda: series_pixels(browser, A100_CHART, (31, 111, 235)) > 50, "occupancy")
    until(lambda: series_pixels(browser, "#delivered-chart", (26, 127, 55)) > 50, "delivered")
    assert series_pixels(browser, "#delivered-chart", (207, 34, 46)) > 20  # the target line
    values = legend(browser, A100_CHART)
    assert values[1:] == ["8", "0", "8"] and "--" not in values  # busy, idle, capacity
    assert {"vision", "nlp"} <= first_column(browser, "allocations-rows")
    assert "Worst team: " in text(browser, "allocations-note")  # the headline, under its floor
    time.sleep(3)  # a few more samples on the occupancy chart, for the picture
    browser.save_screenshot(str(shots / "console-overview.png"))
    assert errors(browser) == []

    # A token in the address signs no one in: bob is asked to paste it.
    browser.delete_all_cookies()
    browser.get(f"{stack.console_url}/?token={issue_token('bob', stack.signer)}")
    until(lambda: "signs no one in" in text(browser, "error"), "the refusal")
    browser.get(f"{stack.console_url}/api/view")
    assert "not signed in" in browser.page_source
    browser.get_log("browser")  # the refusals' 400 and 401 are the point
    # Bob (nlp only) signs in with the form; he does not see alice's vision jobs.
    sign_in_with_form(browser, stack, issue_token("bob", stack.signer))
    loaded(browser)
    until(lambda: shows_what_the_api_says(browser, stack, "bob"), "bob's page to match")
    assert alices not in first_column(browser, "waiting-rows")
    assert flow not in first_column(browser, "workflow-rows")
    assert not {done, failed} & first_column(browser, "ended-rows")
    assert first_column(browser, "allocations-rows") == {"nlp"}
    until(lambda: series_pixels(browser, "#delivered-chart", (207, 34, 46)) > 20, "the target")

    # A job bob submits now appears on the open page, which is not reloaded.
    browser.execute_script("window.stillTheSamePage = true")
    later = hold_a100(stack, "bob", "nlp", 4)
    until(lambda: later in first_column(browser, "waiting-rows"), "the new job, live")
    assert browser.execute_script("return window.stillTheSamePage") is True
    browser.save_screenshot(str(shots / "console-bob.png"))
    assert errors(browser) == []

    # The page is served with a policy that forbids inline script, and signing out works.
    with urllib.request.urlopen(f"{stack.console_url}/login") as response:
        assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    browser.find_element(By.CSS_SELECTOR, "header button[type=submit]").click()
    until(lambda: browser.current_url.endswith("/login"), "the login page")

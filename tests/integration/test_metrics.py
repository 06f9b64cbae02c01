"""The real stack's metrics: placement, scraped with a metrics client's token after a job is
placed, counts the decision and shows its consumer's lag; every service answers its probes."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from qm.v1 import job_service_pb2_grpc as js_grpc

from libs.auth import issue_token
from tests.integration.conftest import wait_for_end
from tests.integration.stack import Stack
from tests.integration.test_job_lifecycle import submit

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int, token: str | None) -> Samples:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as reply:
        text = reply.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_placement_counts_its_decisions_and_shows_its_lag(
    stack: Stack, jobs: js_grpc.JobServiceStub
) -> None:
    port = stack.metrics_ports["placement"]
    # The stack waits for admission only: placement may still be joining its group.
    stack.wait_ready(f"http://127.0.0.1:{port}/readyz")
    assert status(f"http://127.0.0.1:{port}/metrics") == 401
    token = issue_token("svc-prometheus", stack.signer)

    def placed(samples: Samples) -> float:
        return samples.get(("qm_decisions_total", frozenset({("kind", "task_placed")})), 0.0)

    before = placed(scrape(port, token))
    job = wait_for_end(stack, jobs, submit(stack, jobs, gpus=1, command=["true"]))
    assert job.node_id
    samples = scrape(port, token)
    assert placed(samples) >= before + 1
    lags = {
        dict(labels)["partition"]: value
        for (name, labels), value in samples.items()
        if name == "qm_consumer_lag_records" and dict(labels)["consumer"] == "placement"
    }
    # One gauge per partition of the events topic it owns; it keeps up with a quiet log
    # (the ticker's ticks aside), so none is far behind.
    assert lags and all(0 <= lag < 50 for lag in lags.values()), lags
    admitted = frozenset({("input", "job_admitted")})
    assert samples[("qm_decision_delay_seconds_count", admitted)] >= 1
    assert samples[("qm_decision_seconds_count", admitted)] >= 1


def test_every_service_answers_its_probes_and_the_projector_its_metrics(stack: Stack) -> None:
    for name, port in stack.metrics_ports.items():
        if name != "projector":  # its probe is /ready, on its web port
            stack.wait_ready(f"http://127.0.0.1:{port}/readyz")
            assert status(f"http://127.0.0.1:{port}/healthz") == 200, name
    samples = scrape(stack.projector_port, issue_token("svc-prometheus", stack.signer))
    free = samples[("qm_gpus", frozenset({("cluster", "default"), ("state", "free")}))]
    assert free > 0

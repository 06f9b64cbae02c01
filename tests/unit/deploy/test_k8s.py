"""The Kubernetes overlays render with kustomize and every resource is valid (the
Kubernetes API's schemas and Strimzi's CRDs), and they hold what operators rely on:
probes, one ServiceAccount each, locked-down pods, default-deny networking, GPUs
through the device plugin. Installs the pinned kustomize on first run (Go)."""

from __future__ import annotations

import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from libs.bus.strimzi import kafka_topics
from libs.bus.topics import load_topic_config
from services.node_agent import privileges

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
sys.path.insert(0, str(K8S))
from manifests import OVERLAYS, check, problems  # noqa: E402

# The HTTP contract of every service: (port, liveness path, readiness path).
HTTP = {
    "admission": (9460, "/healthz", "/readyz"),
    "budget": (9461, "/healthz", "/readyz"),
    "placement": (9462, "/healthz", "/readyz"),
    "ticker": (9463, "/healthz", "/readyz"),
    "node-agent": (9464, "/healthz", "/readyz"),
    "console": (8080, "/healthz", "/readyz"),
    "projector": (6066, None, "/ready"),
}


@cache
def rendered(overlay: str) -> tuple[list[dict[str, Any]], list[str]]:
    return check(overlay)


def of_kind(overlay: str, kind: str) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in rendered(overlay)[0] if r["kind"] == kind}


def workloads(overlay: str) -> dict[str, dict[str, Any]]:
    return of_kind(overlay, "Deployment") | of_kind(overlay, "DaemonSet")


def port_number(container: dict[str, Any], port: int | str) -> int:
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    return named[port] if isinstance(port, str) else port


@pytest.mark.timeout(900)  # the first run builds kustomize
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlay_renders_and_every_resource_is_valid(overlay: str) -> None:
    resources, found = rendered(overlay)
    assert found == []
    kinds = {r["kind"] for r in resources}
    assert {"Kafka", "KafkaNodePool", "KafkaTopic", "KafkaUser", "NetworkPolicy"} <= kinds
    assert set(workloads(overlay)) == set(HTTP)


@pytest.mark.timeout(900)
def test_validation_catches_a_misspelt_field_of_either_kind() -> None:
    deployment = of_kind("production", "Deployment")["admission"]
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    assert any("'replica' was unexpected" in p for p in problems(broken))
    topic = of_kind("production", "KafkaTopic")["qm.events"]
    broken = {**topic, "spec": {**topic["spec"], "partition": 3}}
    assert any("'partition' was unexpected" in p for p in problems(broken))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_has_its_probes_account_and_locked_down_pod(overlay: str) -> None:
    accounts = of_kind(overlay, "ServiceAccount")
    for name, workload in workloads(overlay).items():
        pod = workload["spec"]["template"]["spec"]
        [container] = pod["containers"]
        port, live, ready = HTTP[name]
        readiness = container["readinessProbe"]["httpGet"]
        assert (port_number(container, readiness["port"]), readiness["path"]) == (port, ready)
        liveness = container["livenessProbe"]
        if live is not None:
            assert liveness["httpGet"]["path"] == live, name
            assert port_number(container, liveness["httpGet"]["port"]) == port, name
        else:  # the projector: faust's web server answers while its tables recover
            assert port_number(container, liveness["tcpSocket"]["port"]) == port
        assert pod["serviceAccountName"] == name
        assert accounts[name]["automountServiceAccountToken"] is False
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        if name != "node-agent":
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert security["runAsNonRoot"] is True
            assert "add" not in security["capabilities"]


def test_the_node_agent_holds_exactly_its_capabilities_and_all_gpus_by_the_plugin() -> None:
    agent = workloads("production")["node-agent"]
    pod = agent["spec"]["template"]["spec"]
    [container] = pod["containers"]
    kept = privileges.needed(cgroups=False)
    names = ("CHOWN", "DAC_READ_SEARCH", "FOWNER", "KILL", "SETGID", "SETUID", "SYS_ADMIN")
    assert set(container["securityContext"]["capabilities"]["add"]) == {
        name for name in names if getattr(privileges, name) in kept
    }
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert str(gpus) == pod["nodeSelector"]["nvidia.com/gpu.count"]
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in container["env"]}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_namespace_denies_by_default_and_dns_is_allowed(overlay: str) -> None:
    policies = of_kind(overlay, "NetworkPolicy")
    deny = policies["default-deny"]["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    dns = policies["allow-dns"]["spec"]
    assert dns["podSelector"] == {} and {p["port"] for p in dns["egress"][0]["ports"]} == {53}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_kafka_client_logs_in_with_its_users_secret(overlay: str) -> None:
    users = of_kind(overlay, "KafkaUser")
    seen = set()
    for name, workload in workloads(overlay).items():
        pod = workload["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        if name == "console":  # no Kafka account: it reads the projector and admission
            assert "QM_KAFKA_SASL_USERNAME" not in env and name not in users
            continue
        user = env["QM_KAFKA_SASL_USERNAME"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert user in users and volumes["kafka-user"]["secret"]["secretName"] == user
        assert env["QM_KAFKA_SASL_PASSWORD_FILE"] == "/etc/qm/kafka-user/password"
        assert "QM_KAFKA_SASL_PASSWORD" not in env  # never in the environment
        assert volumes["kafka-user"]["secret"]["items"] == [{"key": "password", "path": "password"}]
        assert workload["spec"]["template"]["metadata"]["labels"]["quartermaster.io/kafka-client"]
        seen.add(user)
    assert seen == set(users) - {"auditor"}  # people run `qm audit verify`, not a pod


def test_production_keeps_a_quorum_and_local_one_copy_of_each_topic() -> None:
    budgets = of_kind("production", "PodDisruptionBudget")
    assert budgets["admission"]["spec"] == {
        "minAvailable": 2,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "admission"}},
    }
    assert workloads("production")["admission"]["spec"]["replicas"] == 3
    assert (
        "@sha256:"
        in workloads("production")["admission"]["spec"]["template"]["spec"]["containers"][0][
            "image"
        ]
    )
    [listener] = of_kind("production", "Kafka")["qm-kafka"]["spec"]["kafka"]["listeners"]
    assert (listener["tls"], listener["authentication"]) == (True, {"type": "scram-sha-512"})
    topics = load_topic_config(K8S / "base" / "config" / "topics.yaml")
    assert {t["spec"]["replicas"] for t in of_kind("local", "KafkaTopic").values()} == {1}
    assert of_kind("production", "KafkaTopic") == {
        t["metadata"]["name"]: {**t, "metadata": {**t["metadata"], "namespace": "quartermaster"}}
        for t in kafka_topics(topics)
    }

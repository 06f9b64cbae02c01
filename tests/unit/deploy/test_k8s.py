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

# Whichever test runs first builds kustomize (minutes, on a fresh machine).
pytestmark = pytest.mark.timeout(900)

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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlay_renders_and_every_resource_is_valid(overlay: str) -> None:
    resources, found = rendered(overlay)
    assert found == []
    kinds = {r["kind"] for r in resources}
    assert {"Kafka", "KafkaNodePool", "KafkaTopic", "KafkaUser", "NetworkPolicy"} <= kinds
    assert set(workloads(overlay)) == set(HTTP)


def test_validation_catches_a_misspelt_field_of_either_kind() -> None:
    deployment = of_kind("production", "Deployment")["admission"]
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    assert any("'replica' was unexpected" in p for p in problems(broken))
    topic = of_kind("production", "KafkaTopic")["qm.events"]
    broken = {**topic, "spec": {**topic["spec"], "partition": 3}}
    assert any("'partition' was unexpected" in p for p in problems(broken))


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


# NetworkPolicy semantics, enough for the policies here: an endpoint is its namespace's
# labels and its pod's labels; a flow passes if the source's egress and the
# destination's ingress both allow it (every pod is selected by default-deny).
Endpoint = tuple[dict[str, str], dict[str, str]]
HOME = {"kubernetes.io/metadata.name": "quartermaster"}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", expression  # the only one used here
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def peer_matches(peer: dict[str, Any], endpoint: Endpoint) -> bool:
    namespace, pod = endpoint
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], namespace)
    else:
        in_namespace = namespace == HOME
    return in_namespace and selects(peer.get("podSelector", {}), pod)


def port_matches(rule: dict[str, Any], port: int) -> bool:
    ports = rule.get("ports")
    return not ports or any(p["port"] <= port <= p.get("endPort", p["port"]) for p in ports)


def allows(policies: list[dict[str, Any]], side: str, here: Endpoint, there: Endpoint,
           port: int) -> bool:  # fmt: skip
    """Whether policies selecting ``here`` let it talk to ``there`` (side: egress/ingress)."""
    key, peers = ("egress", "to") if side == "egress" else ("ingress", "from")
    if here[0] != HOME:  # a pod elsewhere: not ours to police
        return True
    return any(
        port_matches(rule, port)
        and (peers not in rule or any(peer_matches(p, there) for p in rule[peers]))
        for policy in policies
        if key.capitalize() in policy["spec"]["policyTypes"]
        and selects(policy["spec"]["podSelector"], here[1])
        for rule in policy["spec"].get(key, [])
    )


def flows(overlay: str) -> Any:
    """Whether a flow between two named endpoints passes, in an overlay."""
    policies = list(of_kind(overlay, "NetworkPolicy").values())
    # What Strimzi makes of the listeners' networkPolicyPeers: the brokers' ingress.
    listeners = of_kind(overlay, "Kafka")["qm-kafka"]["spec"]["kafka"]["listeners"]
    brokers = {"matchLabels": {"strimzi.io/cluster": "qm-kafka"}}
    ingress = [{"from": lis["networkPolicyPeers"], "ports": [{"port": lis["port"]}]}
               for lis in listeners]  # fmt: skip
    policies.append(
        {"spec": {"podSelector": brokers, "policyTypes": ["Ingress"], "ingress": ingress}}
    )
    pods = {name: (HOME, w["spec"]["template"]["metadata"]["labels"])
            for name, w in workloads(overlay).items()}  # fmt: skip
    pods["broker"] = (HOME, {"strimzi.io/cluster": "qm-kafka", "strimzi.io/broker-role": "true"})
    pods["dns"] = ({"kubernetes.io/metadata.name": "kube-system"}, {"k8s-app": "kube-dns"})
    pods["prometheus"] = ({"quartermaster.io/prometheus": "true"}, {"app": "prometheus"})
    pods["laptop"] = ({"kubernetes.io/metadata.name": "elsewhere"}, {})

    def allowed(source: str, destination: str, port: int) -> bool:
        src, dst = pods[source], pods[destination]
        return allows(policies, "egress", src, dst, port) and allows(
            policies, "ingress", dst, src, port
        )

    return allowed


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_network_policies_allow_exactly_the_flows_that_exist(overlay: str) -> None:
    allowed = flows(overlay)
    services = list(HTTP)
    # Every pod resolves names; every Kafka client reaches the brokers' TLS listener.
    assert all(allowed(name, "dns", 53) for name in services)
    for name in services:
        assert allowed(name, "broker", 9093) == (name != "console"), name
    # The plain SCRAM listener only where the overlay keeps it (local).
    assert allowed("ticker", "broker", 9092) == (overlay == "local")
    assert not allowed("laptop", "broker", 9093)
    # The calls between services, and no others.
    calls = {
        ("admission", "budget", 50052),
        ("admission", "projector", 6066),
        ("console", "projector", 6066),
        ("console", "budget", 50052),
        ("console", "admission", 50051),
    }
    for source in services:
        if source == "node-agent":  # its tasks' traffic: see node-agent-tasks
            continue
        for destination, port in [("admission", 50051), ("budget", 50052), ("projector", 6066),
                                  ("console", 8080)]:  # fmt: skip
            if destination != source:
                expected = (source, destination, port) in calls
                assert allowed(source, destination, port) == expected, (source, destination)
    # Task logs: admission alone reads the agents' (qm logs).
    assert [allowed(s, "node-agent", 50061) for s in services if s != "node-agent"] == [
        s == "admission" for s in services if s != "node-agent"
    ]
    # Clients reach the three front doors and nothing else; Prometheus the metrics.
    assert [allowed("laptop", d, p) for d, p in
            [("admission", 50051), ("budget", 50052), ("console", 8080)]] == [True] * 3  # fmt: skip
    assert not allowed("laptop", "projector", 6066)
    assert not allowed("laptop", "placement", 9462)
    port = {name: HTTP[name][0] for name in services}
    assert all(allowed("prometheus", name, port[name]) for name in services if name != "console")
    assert not allowed("prometheus", "broker", 9093)

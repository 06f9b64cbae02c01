"""The bus's grants: each service may do only what its work needs, by topic role, and the
Kubernetes manifests declare exactly the grants the local broker enforces."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from libs.bus.access import PRINCIPALS, Grant, grants
from libs.bus.strimzi import render
from libs.bus.topics import load_topic_config

ROOT = Path(__file__).resolve().parents[4]
TOPICS = load_topic_config(ROOT / "deploy" / "topics.yaml")
K8S = ROOT / "deploy" / "k8s"


def allowed(who: str, operation: str, topic: str) -> bool:
    return Grant(who, "topic", topic, "literal", operation) in grants(TOPICS)


def test_only_placement_writes_decisions() -> None:
    writers = {p.name for p in PRINCIPALS if allowed(p.name, "Write", TOPICS.decisions.name)}
    assert writers == {"placement"}


def test_node_agents_read_decisions_and_nothing_else() -> None:
    [agent] = [p for p in PRINCIPALS if p.name == "node-agent"]
    assert agent.reads == ("decisions",)
    assert not allowed("node-agent", "Read", TOPICS.events.name)
    assert not allowed("node-agent", "Write", TOPICS.decisions.name)


def test_the_auditor_changes_nothing() -> None:
    mine = [g for g in grants(TOPICS) if g.principal == "auditor"]
    assert {g.operation for g in mine} == {"Read", "Describe"}
    assert ("group", "Read") not in {(g.resource, g.operation) for g in mine}  # cannot join


def test_every_writer_may_look_up_the_topic_it_writes() -> None:
    for rule in grants(TOPICS):
        if rule.resource == "topic" and rule.operation == "Write":
            assert replace(rule, operation="Describe") in grants(TOPICS)


def test_grants_follow_the_topic_names_of_the_file(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "deploy" / "topics.yaml").read_text())
    config["topics"]["decisions"]["name"] = "east.decisions"
    (tmp_path / "topics.yaml").write_text(yaml.safe_dump(config))
    renamed = load_topic_config(tmp_path / "topics.yaml")
    assert Grant("placement", "topic", "east.decisions", "literal", "Write") in grants(renamed)
    assert not [g for g in grants(renamed) if g.name == TOPICS.decisions.name]


def test_the_kubernetes_users_are_the_generated_ones() -> None:
    expected = render(load_topic_config(K8S / "config" / "topics.yaml"))
    assert (K8S / "kafka-users.yaml").read_text() == expected, (
        "regenerate: python -m libs.bus.strimzi deploy/k8s/config/topics.yaml "
        "> deploy/k8s/kafka-users.yaml"
    )


def test_every_service_manifest_logs_in_as_a_declared_user() -> None:
    declared = yaml.safe_load_all((K8S / "kafka-users.yaml").read_text())
    users = {doc["metadata"]["name"] for doc in declared}
    seen = set()
    for path in K8S.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            volumes = spec.get("volumes", [])
            for container in spec.get("containers", []):
                if container["command"][:2] != ["python", "-m"]:
                    continue
                env = {e["name"]: e.get("value") for e in container.get("env", [])}
                user = env["QM_KAFKA_SASL_USERNAME"]
                secrets = {v["name"]: v.get("secret", {}).get("secretName") for v in volumes}
                assert user in users and secrets["kafka-user"] == user, path.name
                assert "QM_KAFKA_SASL_PASSWORD" not in env, path.name
                seen.add(user)
    assert seen == users - {"auditor"}  # people run `qm audit verify`, not a pod

"""Every config file qm and the services read: the shipped ones are valid, and a bad one is
an error naming the file, the key path and what is expected, whatever it holds."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from libs.bus import load_topic_config
from libs.config.budget import BudgetNodeEntry, load_budget_tree, tree_from_mapping
from libs.config.document import ConfigError, load, read_document, validate
from libs.config.inventory import InventoryFile
from libs.config.policy import policy_from_mapping
from libs.config.sandbox import CheckpointsEntry, ContainersEntry, SandboxFile, VolumeEntry
from libs.config.topics import TopicsFile
from libs.config.workflow import ProfilesFile, WorkflowFile
from libs.sim.scenario import TRACES
from libs.sim.scenario_file import ScenarioFile, load_scenario
from libs.sim.workflows import PROFILES

REPO = Path(__file__).resolve().parents[4]
DEPLOY = REPO / "deploy"
FILES: dict[type[BaseModel], list[Path]] = {
    BudgetNodeEntry: [
        DEPLOY / "local" / "budget.yaml",
        DEPLOY / "k8s" / "base" / "config" / "budget.yaml",
        DEPLOY / "sim" / "budget-tree.yaml",
    ],
    ScenarioFile: [DEPLOY / "sim" / f"{name}.yaml" for name in TRACES],
    TopicsFile: [DEPLOY / "topics.yaml", DEPLOY / "k8s" / "base" / "config" / "topics.yaml"],
    InventoryFile: [DEPLOY / "local" / "nodes.yaml"],
    SandboxFile: [
        DEPLOY / "local" / "sandbox.yaml",
        DEPLOY / "k8s" / "overlays" / "production" / "sandbox.yaml",
    ],
    WorkflowFile: [DEPLOY / "examples" / "workflow-translation.yaml"],
}


@pytest.mark.parametrize(
    ("model", "path"), [(m, p) for m, paths in FILES.items() for p in paths], ids=str
)
def test_the_shipped_files_are_valid(model: type[BaseModel], path: Path) -> None:
    validate(model, read_document(path), str(path))


def test_the_shipped_files_give_what_they_say() -> None:
    assert load_budget_tree(DEPLOY / "local" / "budget.yaml").allocations_of("alice") == [
        "vision-detection"
    ]
    assert (
        load_topic_config(
            DEPLOY / "k8s" / "base" / "config" / "topics.yaml"
        ).events.replication_factor
        == 3
    )
    philly = load_scenario(DEPLOY / "sim" / "philly.yaml")
    assert (philly.skip_head, philly.cluster and philly.cluster.nodes) == (1000, 48)
    assert philly.tree_path == DEPLOY / "sim" / "budget-tree.yaml"
    # The defaults, and what is off unless declared: a checkpoint folder per job, images
    # through podman and a dataset volume.
    assert load(SandboxFile, DEPLOY / "local" / "sandbox.yaml") == SandboxFile(
        checkpoints=CheckpointsEntry(root="/var/tmp/qm-checkpoints"),
        containers=ContainersEntry(),
        volumes={"datasets": VolumeEntry(host_path="/var/tmp/qm-datasets")},
    )


@pytest.mark.shared_data
def test_the_compass_profiles_are_valid() -> None:
    validate(ProfilesFile, read_document(PROFILES), str(PROFILES))


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"name": "lab", "children": [{"name": "a", "members": "alice"}]},
            'children[0].members: expected a list, got "alice"',
        ),
        (
            {"name": "lab", "children": [{"name": "a", "membres": ["x"]}]},
            "children[0].membres: unknown key; known keys: name, weight, members, managers, "
            "children",
        ),
        (
            {"name": "lab", "children": [{"name": "a", "weight": float("nan")}]},
            "children[0].weight: expected a finite number, got NaN",
        ),
        (
            {"name": "lab", "children": [{"name": "a", "weight": 0}]},
            "children[0].weight: expected a number > 0, got 0",
        ),
        (
            {"name": "lab", "children": [{"name": "a", "weight": "2"}]},
            'children[0].weight: expected a number, got "2"',
        ),
        ({"name": "lab", "children": [{"name": "a"}, {"name": "a"}]}, "a: duplicate name"),
        ({"children": []}, "name: required"),
        (None, "expected a mapping, got null"),
    ],
)
def test_a_bad_budget_tree_names_the_key(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        tree_from_mapping(raw, "budget.yaml")
    assert str(caught.value) == f"budget.yaml: {message}"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"trace": "philly", "path": "t.csv", "skip_heda": 1},
            "skip_heda: unknown key; known keys: trace,",
        ),
        (
            {"trace": "helios", "path": "t.csv"},
            "trace: expected one of 'philly', 'alibaba', 'bluewaters', 'theta', 'csv' or "
            "'eventlog', got \"helios\"",
        ),
        ({"trace": "csv", "path": "t.csv", "label": ""}, "label: expected at least 1 character"),
        ({"trace": "philly"}, "path: required"),
        (
            {"trace": "philly", "path": "t", "cluster": {"nodes": "48"}},
            'cluster.nodes: expected an integer, got "48"',
        ),
        (
            {"trace": "philly", "path": "t", "contracts": {"resumable_share": 1.5}},
            "contracts.resumable_share: expected a number <= 1, got 1.5",
        ),
        (
            {"trace": "philly", "path": "t", "contracts": {"priority_shares": [[1, "a"]]}},
            'contracts.priority_shares[0][1]: expected a number, got "a"',
        ),
        (
            {"trace": "philly", "path": "t", "start_s": 5, "end_s": 1},
            "end_s (1) must be after start_s (5)",
        ),
    ],
)
def test_a_bad_scenario_names_the_key(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate(ScenarioFile, raw, "s.yaml")
    assert str(caught.value).startswith(f"s.yaml: {message}")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("partitions: 0\n", "partitions: expected a number >= 1, got 0; topics: required"),
        ("partitions: 3\ntopics: {events: {name: 'a b'}}\n", "topics.events.name: expected text"),
        ("partitions: [\n", "line 2, column 1: not valid YAML"),
    ],
)
def test_a_bad_topics_file_names_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "topics.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_topic_config(path)
    assert str(caught.value).startswith(f"{path}: {message}")


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"^{tmp_path}/none.yaml: cannot read: No such file"):
        read_document(tmp_path / "none.yaml")
    with pytest.raises(ConfigError, match=rf"^{tmp_path}: cannot read: Is a directory"):
        read_document(tmp_path)
    (tmp_path / "p.json").write_text("{\n  'single': 1}")
    with pytest.raises(ConfigError, match=r"p\.json: line 2: not valid JSON"):
        read_document(tmp_path / "p.json")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    [
        "name",
        "weight",
        "members",
        "children",
        "trace",
        "path",
        "nodes",
        "tasks",
        "workflows",
        "models",
        "partitions",
        "topics",
        "cluster",
    ]
)
NEAR = st.dictionaries(FIELDS, JSON, max_size=6)  # documents with the right keys, wrong values


READERS: list[Callable[[object, str], object]] = [
    tree_from_mapping,  # the core's own rules too
    policy_from_mapping,
    *(functools.partial(validate, model) for model in (*FILES, ProfilesFile)),
]


@settings(max_examples=300, deadline=None)
@given(raw=JSON | NEAR, read=st.sampled_from(READERS))
def test_whatever_a_file_holds_the_only_error_is_a_config_error(
    raw: object, read: Callable[[object, str], object]
) -> None:
    try:
        read(raw, "f.yaml")
    except ConfigError as exc:
        assert str(exc).startswith("f.yaml: ")

"""The sandbox file's containers and volumes: defaults, and a bad entry named by its key."""

from __future__ import annotations

import pytest

from libs.config.document import ConfigError, validate
from libs.config.sandbox import ContainersEntry, SandboxFile, VolumeEntry


def sandbox(raw: object) -> SandboxFile:
    return validate(SandboxFile, raw, "sandbox.yaml")


def test_containers_are_off_and_no_volume_is_declared_unless_set() -> None:
    config = sandbox({})
    assert config.containers is None
    assert config.volumes == {}


def test_the_defaults_run_runc_on_overlay_and_pull_nothing() -> None:
    assert sandbox({"containers": {}}).containers == ContainersEntry(
        runtime="runc",
        storage_root=None,
        storage_driver="overlay",
        pull="never",
        required=False,
        registries_auth_file=None,
    )


def test_an_operator_sets_every_containers_key() -> None:
    raw = {
        "runtime": "/usr/local/bin/runc",
        "storage_root": "/var/lib/qm/podman",
        "storage_driver": "vfs",
        "pull": "missing",
        "required": True,
        "registries_auth_file": "/etc/qm/auth.json",
    }
    entry = sandbox({"containers": raw}).containers
    assert entry is not None
    assert entry.model_dump() == raw


def test_volumes_are_read_only_and_for_every_allocation_unless_said() -> None:
    config = sandbox(
        {
            "volumes": {
                "datasets": {"host_path": "/srv/datasets"},
                "vision-out": {
                    "host_path": "/srv/out/vision",
                    "read_only": False,
                    "allocations": ["vision-detection"],
                },
            }
        }
    )
    assert config.volumes == {
        "datasets": VolumeEntry(host_path="/srv/datasets", read_only=True, allocations=[]),
        "vision-out": VolumeEntry(
            host_path="/srv/out/vision", read_only=False, allocations=["vision-detection"]
        ),
    }


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"containers": {"pull": "always"}}, "containers.pull: expected one of 'never' or"),
        ({"containers": {"storage_driver": "btrfs"}}, "containers.storage_driver: expected one"),
        ({"containers": {"storage_root": "podman"}}, "containers.storage_root: expected an abs"),
        (
            {"containers": {"registries_auth_file": "auth.json"}},
            "containers.registries_auth_file: expected an absolute path",
        ),
        ({"containers": {"runtime": "../runc"}}, "containers.runtime: expected a runtime's name"),
        ({"containers": {"required": "yes"}}, "containers.required: expected true or false"),
        ({"containers": {"image": "x"}}, "containers.image: unknown key; known keys: runtime"),
        ({"volumes": {"data": {}}}, "volumes.data.host_path: required"),
        ({"volumes": {"data": {"host_path": "data"}}}, "expected an absolute path"),
        ({"volumes": {"data": {"host_path": "/srv/../etc"}}}, "expected a normalized path"),
        ({"volumes": {"data": {"host_path": "/srv//data"}}}, "expected a normalized path"),
        ({"volumes": {"data": {"host_path": "/srv/a,b"}}}, "without commas or newlines"),
        ({"volumes": {"a:b": {"host_path": "/srv"}}}, "volumes.a:b (a key): expected text"),
        ({"volumes": {"-a": {"host_path": "/srv"}}}, "volumes.-a (a key): expected text"),
        (
            {"volumes": {"data": {"host_path": "/srv", "allocations": [""]}}},
            "volumes.data.allocations[0]: expected at least 1 character(s)",
        ),
    ],
)
def test_a_bad_entry_is_named_by_its_key(raw: object, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        sandbox(raw)
    assert str(error.value).startswith("sandbox.yaml: ")
    assert expected in str(error.value)

"""A task in an image as the agent launches it: the podman command, the environment in a
file only root reads (never on the command line), the agent's folders bound, and what
cannot run here refused with a reason."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from qm.v1 import events_pb2, types_pb2

from libs.config.sandbox import ContainersEntry, VolumeEntry
from services.node_agent.containers import ContainerError
from services.node_agent.images import Images, exit_code


def placed(
    *mounts: tuple[str, str], image: str = "localhost/qm-example:1"
) -> events_pb2.TaskPlaced:
    return events_pb2.TaskPlaced(
        job_id="j-1",
        task_id="j-1/0",
        node_id="n0",
        gpu_indices=[],
        spec=types_pb2.JobSpec(
            allocation="vision",
            image=image,
            mounts=[types_pb2.Mount(volume=v, path=p) for v, p in mounts],
        ),
    )


def images(tmp_path: Path, podman: bool = True) -> Images:
    (tmp_path / "bin").mkdir()
    if podman:
        (tmp_path / "bin" / "podman").write_text("#!/bin/sh\n")
        (tmp_path / "bin" / "podman").chmod(0o755)
    config = ContainersEntry(storage_root=str(tmp_path / "podman"))
    volumes = {"datasets": VolumeEntry(host_path="/srv/datasets")}
    return Images(config, volumes, path=str(tmp_path / "bin"))


def test_a_launch_binds_the_agents_folders_and_keeps_the_environment_off_the_command_line(
    tmp_path: Path,
) -> None:
    scratch, checkpoints = tmp_path / "scratch" / "j-1", tmp_path / "ckpt" / "j-1"
    launch = images(tmp_path).launch(
        placed(("datasets", "/data")),
        ["sh", "-c", "echo 42"],
        uid=65534,
        gid=65534,
        scratch=scratch,
        binds={"QM_CHECKPOINT_DIR": checkpoints},
        env={"TOKEN": "s3cret", "QM_JOB_ID": "j-1"},
    )
    assert "s3cret" not in " ".join(launch.argv)
    assert launch.argv[-4:] == ["localhost/qm-example:1", "sh", "-c", "echo 42"]
    joined = " ".join(launch.argv)
    assert f"source={scratch},destination={scratch}" in joined
    assert f"source={checkpoints},destination={checkpoints},nosuid" in joined  # writable
    assert "source=/srv/datasets,destination=/data,ro=true" in joined
    assert f"--workdir {scratch}" in joined and "--user=65534:65534" in joined
    env_file = Path(launch.argv[launch.argv.index("--env-file") + 1])
    assert env_file.read_text() == "TOKEN=s3cret\nQM_JOB_ID=j-1\n"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert launch.env == {
        "PATH": str(tmp_path / "bin"),
        "CONTAINERS_CONF": str(tmp_path / "podman" / "containers.conf"),
    }


@pytest.mark.parametrize(
    ("task", "podman", "reason"),
    [
        (placed(("secrets", "/x")), True, "mount: no volume secrets here; declared: datasets"),
        (placed(image="qm-example:1"), True, "is not a full reference"),
        (placed(), False, "image: this node has no podman"),
    ],
)
def test_what_cannot_run_here_is_refused_with_a_reason(
    tmp_path: Path, task: events_pb2.TaskPlaced, podman: bool, reason: str
) -> None:
    with pytest.raises(ContainerError, match=reason):
        images(tmp_path, podman).launch(
            task, ["true"], uid=1, gid=1, scratch=tmp_path / "s", binds={}, env={}
        )


@pytest.mark.parametrize(("code", "reported"), [(0, 0), (3, 3), (143, -15), (137, -9), (125, 125)])
def test_a_containers_exit_code_reads_as_a_processs(code: int, reported: int) -> None:
    assert exit_code(code) == reported

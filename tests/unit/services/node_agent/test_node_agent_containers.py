"""A task in an OCI image: the containers.conf, the podman command lines, its mounts, GPUs
and environment as the agent builds them; and, where podman and the example image are
here (make example-image, as root), one task really run that way."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from libs.config.sandbox import ContainersEntry, VolumeEntry
from services.node_agent.containers import (
    CDI_KIND,
    LABEL_JOB,
    LABEL_NODE,
    LABEL_TASK,
    Bind,
    Container,
    ContainerError,
    ContainerRun,
    Storage,
    container_name,
    containers_conf,
    env_file_text,
    gpu_devices,
    nvidia_cdi_spec,
    parse_ps,
    podman_argv,
    podman_kill_argv,
    podman_ps_argv,
    podman_rm_argv,
    podman_stop_argv,
    podman_wait_argv,
    resolve_mounts,
    task_labels,
    validate_image_ref,
    write_private,
)

REPO = Path(__file__).resolve().parents[4]
STORAGE = Storage(Path("/var/lib/qm/podman"))
FLAGS = [
    "--root",
    "/var/lib/qm/podman/storage",
    "--runroot",
    "/var/lib/qm/podman/run",
    "--storage-driver",
    "overlay",
]
PODMAN_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
EXAMPLE = "localhost/qm-example:1"
NOBODY = 65534


def test_the_conf_keeps_podman_apart_from_the_host_and_within_its_limits() -> None:
    conf = tomllib.loads(containers_conf(ContainersEntry(), STORAGE))
    assert conf == {
        "containers": {"default_ulimits": [], "http_proxy": False, "pids_limit": 0},
        "network": {"network_config_dir": "/var/lib/qm/podman/networks"},
        "engine": {
            "runtime": "runc",
            "cgroup_manager": "cgroupfs",
            "events_logger": "file",
            "tmp_dir": "/var/lib/qm/podman/run/libpod",
            "lock_type": "file",
            "image_copy_tmp_dir": "/var/lib/qm/podman/storage/tmp",
        },
    }


def test_the_conf_holds_any_path_as_written() -> None:
    runtime = '/opt/odd "rt"\\bin'
    storage = Storage(Path("/srv/qm podman/é"))
    conf = tomllib.loads(containers_conf(ContainersEntry(runtime=runtime), storage))
    assert conf["engine"]["runtime"] == runtime
    assert conf["engine"]["tmp_dir"] == "/srv/qm podman/é/run/libpod"


def test_the_storage_is_the_configured_one_else_the_agents_default_made_absolute() -> None:
    configured = ContainersEntry(storage_root="/var/lib/qm/podman", storage_driver="vfs")
    assert Storage.of(configured, Path(".local/podman")) == Storage(
        Path("/var/lib/qm/podman"), "vfs"
    )
    assert Storage.of(ContainersEntry(), Path(".local/podman")) == Storage(
        Path.cwd() / ".local" / "podman", "overlay"
    )
    assert STORAGE.flags() == FLAGS
    assert STORAGE.environment("/usr/bin:/bin") == {
        "PATH": "/usr/bin:/bin",
        "CONTAINERS_CONF": "/var/lib/qm/podman/containers.conf",
    }
    assert STORAGE.env_file("qm-x") == Path("/var/lib/qm/podman/env/qm-x.env")


@pytest.mark.parametrize(
    "task_id", ["j-1/0", "j-1/2.3", "alice-7/encode", "a b/ü", "%/~", "-x/.", "j" * 500]
)
def test_a_container_name_is_valid_short_and_the_same_for_the_same_task(task_id: str) -> None:
    name = container_name(task_id)
    assert PODMAN_NAME.fullmatch(name)
    assert name.startswith("qm-")
    assert len(name) <= 64
    assert container_name(task_id) == name


def test_ids_that_sanitize_alike_get_different_names() -> None:
    names = {container_name(task_id) for task_id in ("j/1", "j_1", "j%2F1", "j 1")}
    assert len(names) == 4


def test_labels_name_the_job_task_and_node() -> None:
    assert task_labels("j-1", "j-1/0", "gpu-1") == {
        LABEL_JOB: "j-1",
        LABEL_TASK: "j-1/0",
        LABEL_NODE: "gpu-1",
    }


@pytest.mark.parametrize(
    "ref",
    [
        EXAMPLE,
        "localhost/qm-example",
        "localhost:5000/team/train:v1.2_rc-3",
        "images.invalid/team/sub/train:latest",
        "127.0.0.1:5000/train",
        "registry:5000/train",
        "[::1]:5000/train:1",
        "images.invalid/a__b/c-d/e.f:1@sha256:" + "a" * 64,
        "images.invalid/train@sha256:" + "0" * 64,
    ],
)
def test_a_full_reference_is_taken(ref: str) -> None:
    assert validate_image_ref(ref) == ref


@pytest.mark.parametrize(
    ("ref", "why"),
    [
        ("", "empty reference"),
        ("qm-example:1", "not a full reference"),  # a short name: each node's own lookup
        ("team/train:1", "not a full reference"),
        ("-x/train", "not a full reference"),
        ("--privileged", "not a full reference"),
        ("localhost/Train:1", "not a full reference"),
        ("localhost/train:1 --privileged", "not a full reference"),
        ("localhost/train:\n1", "not a full reference"),
        ("localhost/train:" + "t" * 129, "not a full reference"),
        ("localhost/train:ü", "not a full reference"),
        ("localhost/train@sha256:abc", "not a full reference"),
        ("localhost//train", "not a full reference"),
        ("localhost/" + "a" * 250, "at most 255 characters"),
    ],
)
def test_anything_else_is_refused(ref: str, why: str) -> None:
    with pytest.raises(ContainerError, match=why):
        validate_image_ref(ref)


VOLUMES = {
    "datasets": VolumeEntry(host_path="/srv/datasets"),
    "vision-out": VolumeEntry(
        host_path="/srv/out/vision", read_only=False, allocations=["vision-detection"]
    ),
}


def test_declared_volumes_are_bound_where_the_job_asks() -> None:
    binds = resolve_mounts(
        [("datasets", "/data/./sets/"), ("vision-out", "//out")],
        VOLUMES,
        "vision-detection",
        taken=["/var/tmp/qm-scratch/j-1"],
    )
    assert binds == [
        Bind("/srv/datasets", "/data/sets", read_only=True),
        Bind("/srv/out/vision", "/out", read_only=False),
    ]
    assert resolve_mounts([], VOLUMES, "") == []


@pytest.mark.parametrize(
    ("requested", "allocation", "message"),
    [
        ([("models", "/m")], "nlp", "mount: no volume models here; declared: datasets, vision-out"),
        (
            [("vision-out", "/out")],
            "nlp",
            "mount: volume vision-out is not for allocation nlp; it is for: vision-detection",
        ),
        (
            [("vision-out", "/out")],
            "",
            "mount: volume vision-out is not for allocation (none); it is for: vision-detection",
        ),
        ([("datasets", "data")], "nlp", "mount datasets: 'data' must be an absolute path"),
        ([("datasets", "/data/../etc")], "nlp", "mount datasets: '/data/../etc' may not contain"),
        ([("datasets", "/a,b")], "nlp", "mount datasets: '/a,b' may not hold a comma"),
        ([("datasets", "/")], "nlp", "mount datasets: / is the container runtime's"),
        ([("datasets", "/proc/x")], "nlp", "mount datasets: /proc/x is the container runtime's"),
        ([("datasets", "/dev")], "nlp", "mount datasets: /dev is the container runtime's"),
        (
            [("datasets", "/d"), ("datasets", "/d/")],
            "nlp",
            "mount: /d twice: volume datasets and volume datasets",
        ),
        (
            [("datasets", "/var/tmp/qm-scratch/j-1")],
            "nlp",
            "mount: /var/tmp/qm-scratch/j-1 twice: volume datasets and the job's scratch folder",
        ),
    ],
)
def test_a_mount_that_cannot_be_made_says_why(
    requested: list[tuple[str, str]], allocation: str, message: str
) -> None:
    with pytest.raises(ContainerError) as error:
        resolve_mounts(requested, VOLUMES, allocation, taken=["/var/tmp/qm-scratch/j-1"])
    assert str(error.value).startswith(message)


def test_no_volume_declared_says_none() -> None:
    with pytest.raises(ContainerError) as error:
        resolve_mounts([("data", "/data")], {}, "nlp")
    assert str(error.value) == "mount: no volume data here; declared: none"


UUIDS = {0: "GPU-aaaa", 1: "GPU-bbbb", 3: "GPU-dddd"}


def test_with_the_toolkits_spec_a_task_gets_its_gpus_by_cdi_name() -> None:
    assert gpu_devices([3, 1], cdi=True, uuids=UUIDS, exists=lambda _: True) == [
        f"{CDI_KIND}=GPU-dddd",
        f"{CDI_KIND}=GPU-bbbb",
    ]
    with pytest.raises(ContainerError, match="no UUID known for GPU 2"):
        gpu_devices([1, 2], cdi=True, uuids=UUIDS, exists=lambda _: True)


def test_without_it_a_task_gets_its_device_nodes_and_the_control_nodes_there() -> None:
    present = {"/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm"}
    assert gpu_devices([3, 1], cdi=False, uuids={}, exists=present.__contains__) == [
        "/dev/nvidia3",
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
    ]
    assert gpu_devices([3], cdi=False, uuids={}, exists=present.__contains__, minors={3: 1}) == [
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
    ]


def test_a_task_without_gpus_gets_no_device() -> None:
    assert gpu_devices([], cdi=False, uuids={}, exists=lambda _: True) == []
    assert gpu_devices([], cdi=True, uuids={}, exists=lambda _: True) == []
    assert gpu_devices([0], cdi=False, uuids={}, exists=lambda _: False) == []


def test_the_nvidia_cdi_spec_is_found_by_its_kind(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    (etc / "vendor.yaml").write_text("cdiVersion: 0.5.0\nkind: vendor.example/fpga\n")
    (etc / "broken.yaml").write_text("kind: [\n")
    (etc / "notes.txt").write_text("kind: nvidia.com/gpu\n")
    assert not nvidia_cdi_spec([etc, run])
    run.mkdir()
    (run / "nvidia.json").write_text(json.dumps({"cdiVersion": "0.5.0", "kind": CDI_KIND}))
    assert nvidia_cdi_spec([etc, run])


def test_the_environment_file_carries_values_as_they_are() -> None:
    env = {"A": "plain", "B": " spaced = and # hash ", "C": "", "D": "ünï'\"$x"}
    assert env_file_text(env) == "A=plain\nB= spaced = and # hash \nC=\nD=ünï'\"$x\n"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KEY": "-----BEGIN-----\nsecret"}, "environment: KEY holds a newline"),
        ({"KEY": "secret\r"}, "environment: KEY holds a newline"),
        ({"#KEY": "v"}, "a variable named '#KEY'"),
        ({" KEY": "v"}, "a variable named ' KEY'"),
        ({"": "v"}, "a variable named ''"),
        ({"K\nEY": "v"}, "a variable named 'K\\nEY'"),
        ({"KEY": "x" * 65_532}, "environment: KEY is longer than 65535 bytes"),
    ],
)
def test_a_variable_the_file_cannot_carry_is_named_never_shown(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ContainerError) as error:
        env_file_text(env)
    assert message in str(error.value)
    assert "secret" not in str(error.value)


def test_the_longest_line_podman_reads_is_written() -> None:
    assert env_file_text({"KEY": "x" * 65_531}) == "KEY=" + "x" * 65_531 + "\n"


SCRATCH = "/var/tmp/qm-scratch/j-1"
RUN = ContainerRun(
    name="qm-j-1_0-0123456789ab",
    image="localhost/train:1",
    command=("python", "--version", "-x"),
    uid=1000,
    gid=1001,
    workdir=SCRATCH,
    scratch=SCRATCH,
    binds=(Bind("/srv/datasets", "/data"), Bind("/srv/out", "/out", read_only=False)),
    devices=("nvidia.com/gpu=GPU-aaaa",),
    env_file="/var/lib/qm/podman/env/qm-j-1_0-0123456789ab.env",
    memory_bytes=2**30,
    labels={LABEL_JOB: "j-1", LABEL_TASK: "j-1/0"},
)


def test_podman_runs_the_task_as_its_account_with_only_what_it_was_given() -> None:
    assert podman_argv("/usr/bin/podman", STORAGE, RUN) == [
        "/usr/bin/podman",
        *FLAGS,
        "run",
        "--name",
        "qm-j-1_0-0123456789ab",
        "--label",
        "qm.job=j-1",
        "--label",
        "qm.task=j-1/0",
        "--pull=never",
        "--user=1000:1001",
        "--security-opt=no-new-privileges",
        "--cap-drop=all",
        "--network=host",
        "--init",
        "--log-driver=passthrough",
        "--workdir",
        SCRATCH,
        "--mount",
        f"type=bind,source={SCRATCH},destination={SCRATCH},nosuid,nodev",
        "--mount",
        "type=bind,source=/srv/datasets,destination=/data,ro=true,nosuid,nodev",
        "--mount",
        "type=bind,source=/srv/out,destination=/out,nosuid,nodev",
        "--device",
        "nvidia.com/gpu=GPU-aaaa",
        "--env-file",
        "/var/lib/qm/podman/env/qm-j-1_0-0123456789ab.env",
        "--memory",
        "1073741824",
        "--memory-swap",
        "1073741824",
        "--shm-size",
        "1073741824",
        "localhost/train:1",
        "python",
        "--version",
        "-x",
    ]


def test_podman_is_kept_from_registries_and_the_container_kept_for_its_exit_code() -> None:
    argv = podman_argv("podman", STORAGE, RUN)
    assert "--rm" not in argv
    assert "--pull=never" in argv
    pulling = podman_argv("podman", STORAGE, RUN, pull="missing", authfile="/etc/qm/auth.json")
    assert "--pull=missing" in pulling
    assert pulling[pulling.index("--authfile") + 1] == "/etc/qm/auth.json"


def test_a_bare_run_passes_no_environment_memory_or_device() -> None:
    bare = ContainerRun(
        name="qm-x", image=EXAMPLE, command=(), uid=1, gid=1, workdir="/w", scratch="/s"
    )
    argv = podman_argv("podman", STORAGE, bare)
    assert argv[-1] == EXAMPLE  # the image's own command
    for flag in ("--env-file", "--memory", "--device", "--label", "--authfile"):
        assert flag not in argv


@pytest.mark.parametrize(
    ("run", "message"),
    [
        (dataclasses.replace(RUN, image="train:1"), "image: 'train:1' is not a full reference"),
        (dataclasses.replace(RUN, workdir="work"), "workdir: 'work' must be an absolute path"),
        (dataclasses.replace(RUN, workdir="/a/../b"), "workdir: '/a/../b' may not contain .."),
        (
            dataclasses.replace(RUN, scratch="/var/tmp/a,b"),
            "bind: '/var/tmp/a,b' may not hold a comma",
        ),
    ],
)
def test_a_run_podman_would_misread_is_refused(run: ContainerRun, message: str) -> None:
    with pytest.raises(ContainerError) as error:
        podman_argv("podman", STORAGE, run)
    assert str(error.value).startswith(message)


def test_the_agent_stops_signals_waits_for_removes_and_lists_containers() -> None:
    name = "qm-j-1_0-0123456789ab"
    assert podman_stop_argv("podman", STORAGE, name, 9.2) == [
        "podman",
        *FLAGS,
        "stop",
        "--time=10",
        name,
    ]
    assert podman_kill_argv("podman", STORAGE, name, signal.SIGUSR1) == [
        "podman",
        *FLAGS,
        "kill",
        "--signal=SIGUSR1",
        name,
    ]
    assert podman_wait_argv("podman", STORAGE, name) == ["podman", *FLAGS, "wait", name]
    assert podman_rm_argv("podman", STORAGE, name) == [
        "podman",
        *FLAGS,
        "rm",
        "--force",
        "--ignore",
        name,
    ]
    assert podman_ps_argv("podman", STORAGE, {LABEL_NODE: "gpu-1", LABEL_JOB: "j-1"}) == [
        "podman",
        *FLAGS,
        "ps",
        "--all",
        "--format=json",
        "--filter",
        "label=qm.node=gpu-1",
        "--filter",
        "label=qm.job=j-1",
    ]


# What podman 4.3 prints (trimmed): a container still running, and one that ended.
PS_OUTPUT = """[
  {"AutoRemove": false, "Command": ["sleep", "60"], "Exited": false, "ExitedAt": -62135596800,
   "ExitCode": 0, "Id": "a5f6", "Image": "localhost/qm-example:1",
   "Labels": {"qm.job": "j-1", "qm.task": "j-1/0"}, "Names": ["qm-a"], "Pid": 25203,
   "State": "running", "Status": "Up 1 second ago"},
  {"Exited": true, "ExitCode": 143, "Id": "b7c8", "Labels": null, "Names": ["qm-b"],
   "State": "exited", "Status": "Exited (143) 2 seconds ago"}
]"""


def test_the_listing_says_which_containers_ended_and_how() -> None:
    assert parse_ps(PS_OUTPUT) == [
        Container("qm-a", "a5f6", "running", None, {"qm.job": "j-1", "qm.task": "j-1/0"}),
        Container("qm-b", "b7c8", "exited", 143, {}),
    ]
    assert parse_ps("[]\n") == []
    assert parse_ps("") == []


@pytest.mark.parametrize("text", ["{}", '[{"Names": ["x"]}]', '[{"Id": "1"}]', "[1]"])
def test_a_listing_that_is_not_podmans_is_an_error(text: str) -> None:
    with pytest.raises(ValueError, match="podman ps"):
        parse_ps(text)


def test_a_private_file_is_written_whole_for_its_owner_alone(tmp_path: Path) -> None:
    path = tmp_path / "env" / "qm-x.env"
    write_private(path, "A=1\n")
    write_private(path, "A=2\n")
    assert path.read_text() == "A=2\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert os.listdir(path.parent) == ["qm-x.env"]


# The real thing: podman as the agent runs it, on the example image.


def _example_storage() -> Storage:
    """The local stack's storage with the example image in it, or a skip saying why not."""
    if os.geteuid() != 0:
        pytest.skip("the node agent's podman runs as root")
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install podman runc)")
    storage = Storage.of(ContainersEntry(), REPO / ".local" / "podman")
    if not storage.conf.is_file():
        pytest.skip(f"no podman storage at {storage.root}: run make example-image")
    exists = subprocess.run(
        ["podman", *storage.flags(), "image", "exists", EXAMPLE],
        env=storage.environment(os.environ["PATH"]),
        capture_output=True,
        check=False,
    )
    if exists.returncode != 0:
        pytest.skip(f"{EXAMPLE} is not in {storage.root}: run make example-image")
    return storage


@pytest.fixture
def example() -> Iterator[tuple[Storage, list[str]]]:
    """The example storage, and the containers a test ran there: removed after it."""
    storage = _example_storage()
    names: list[str] = []
    yield storage, names
    for name in names:
        subprocess.run(
            podman_rm_argv("podman", storage, name),
            env=storage.environment(os.environ["PATH"]),
            capture_output=True,
            check=False,
        )


SCRIPT = """
echo "$QM_ANSWER"
id -u
id -G
cat /data/greeting
touch /data/written 2>/dev/null && echo volume-written || echo volume-read-only
echo kept > scratch-file && echo scratch-written
cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes
echo devices: $(ls /dev)
"""


def test_a_task_runs_in_the_example_image_as_its_account_with_only_what_it_was_given(
    tmp_path: Path, example: tuple[Storage, list[str]]
) -> None:
    storage, names = example
    podman_env = storage.environment(os.environ["PATH"])
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    os.chown(scratch, NOBODY, NOBODY)
    data = tmp_path / "data"
    data.mkdir()
    (data / "greeting").write_text("hello from the host\n")
    data.chmod(0o777)  # read-only for the task all the same: the bind is
    task_id = f"test-{uuid.uuid4().hex[:8]}/0"
    name = container_name(task_id)
    names.append(name)
    env_file = tmp_path / "env" / f"{name}.env"
    write_private(env_file, env_file_text({"QM_ANSWER": "42"}))
    binds = resolve_mounts(
        [("data", "/data")], {"data": VolumeEntry(host_path=str(data))}, "nlp", taken=[str(scratch)]
    )
    run = ContainerRun(
        name=name,
        image=EXAMPLE,
        command=("sh", "-c", SCRIPT),
        uid=NOBODY,
        gid=NOBODY,
        workdir=str(scratch),
        scratch=str(scratch),
        binds=binds,
        devices=gpu_devices([], cdi=nvidia_cdi_spec(), uuids={}, exists=os.path.exists),
        env_file=str(env_file),
        memory_bytes=256 * 2**20,
        labels=task_labels(task_id.partition("/")[0], task_id, "test-node"),
    )
    done = subprocess.run(
        podman_argv("podman", storage, run),
        env=podman_env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:8] == [
        "42",
        str(NOBODY),
        str(NOBODY),  # no group of the image's
        "hello from the host",
        "volume-read-only",
        "scratch-written",
        str(256 * 2**20),
        lines[7],
    ]
    assert lines[7].startswith("devices: ")
    assert "nvidia" not in lines[7]
    assert not (data / "written").exists()
    assert (scratch / "scratch-file").stat().st_uid == NOBODY
    listed = subprocess.run(
        podman_ps_argv("podman", storage, {LABEL_TASK: task_id}),
        env=podman_env,
        capture_output=True,
        text=True,
        check=True,
    )
    [container] = parse_ps(listed.stdout)
    assert (container.name, container.state, container.exit_code) == (name, "exited", 0)


def test_a_stopped_task_ends_on_sigterm_even_as_a_containers_first_process(
    tmp_path: Path, example: tuple[Storage, list[str]]
) -> None:
    storage, names = example
    podman_env = storage.environment(os.environ["PATH"])
    task_id = f"test-{uuid.uuid4().hex[:8]}/0"
    run = ContainerRun(
        name=container_name(task_id),
        image=EXAMPLE,
        command=("sleep", "60"),
        uid=NOBODY,
        gid=NOBODY,
        workdir="/",
        scratch=str(tmp_path),
        labels={LABEL_TASK: task_id},
    )
    names.append(run.name)
    started = subprocess.Popen(podman_argv("podman", storage, run), env=podman_env)
    try:
        deadline = time.monotonic() + 30
        while not _running(storage, task_id):
            assert time.monotonic() < deadline, "the container did not start"
            time.sleep(0.1)
        before = time.monotonic()
        stop = podman_stop_argv("podman", storage, run.name, 20)
        subprocess.run(stop, env=podman_env, check=True)
        assert started.wait(timeout=30) == 128 + signal.SIGTERM
        assert time.monotonic() - before < 10  # SIGTERM ended it: no wait for SIGKILL
    finally:
        started.kill()
        started.wait()


def _running(storage: Storage, task_id: str) -> bool:
    listed = subprocess.run(
        podman_ps_argv("podman", storage, {LABEL_TASK: task_id}),
        env=storage.environment(os.environ["PATH"]),
        capture_output=True,
        text=True,
        check=True,
    )
    return any(container.state == "running" for container in parse_ps(listed.stdout))

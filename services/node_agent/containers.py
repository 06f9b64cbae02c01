"""What the node agent needs to run a task in an OCI image through podman
(``qm submit --image``; ``docs/containers.md``): the text it writes and the command lines
it runs, built by pure functions; only ``nvidia_cdi_spec`` and ``write_private`` touch files.

Podman runs as root with the agent's own storage and ``containers.conf`` (``Storage``),
never the host's, and with the agent's environment, never the task's: variables such as
``CONTAINERS_CONF``, ``TMPDIR`` or proxies would steer it. The task runs as its account
(``UID:GID``: an image's ``/etc/group`` adds no groups then), without capabilities or new
privileges, on the host's network, with its job's scratch folder bound at the same path,
the declared volumes it asked for (``resolve_mounts``) and its own GPUs (``gpu_devices``).
Its environment comes from a file only root reads (``env_file_text``), never the command
line. Its container outlives a ``podman run`` that dies with the agent (its output goes
straight to the pipes it was given), and is kept after it ends, for its exit code; the
agent removes it (``podman_rm_argv``) and finds its own by label (``podman_ps_argv``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import signal
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from libs.config.sandbox import ContainersEntry, VolumeEntry
from services.node_agent.names import safe_name

# Where the NVIDIA container toolkit writes its CDI spec (nvidia-ctk cdi generate).
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
CDI_KIND = "nvidia.com/gpu"
# What CUDA opens besides its GPUs' own /dev/nvidiaN, where the host has them.
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")

LABEL_JOB = "qm.job"
LABEL_TASK = "qm.task"
LABEL_NODE = "qm.node"

# podman reads an env file with Go's bufio.Scanner: a longer line is refused.
_ENV_LINE_MAX = 65_535
# The runtime's own mounts: a volume over them would hide or break them.
_RESERVED = ("proc", "sys", "dev")

# A reference as the distribution spec writes it (the repository's components in lower
# case), its registry named: a short name would resolve through each node's own
# registries.conf, to whatever image that names.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
# A registry: localhost, a name with a dot, any name with a port, or an IPv6 address.
_DOMAIN = rf"(?:(?:localhost|{_HOST}(?:\.{_HOST})+|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?|{_HOST}:[0-9]+)"
_REFERENCE = re.compile(
    rf"{_DOMAIN}/{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::\w[\w.-]{0,127})?"
    r"(?:@[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-fA-F]{32,})?",
    re.ASCII,
)
_MAX_REFERENCE = 255


class ContainerError(ValueError):
    """A task's container cannot be set up as asked; the message says why (the job's
    launch fails with it)."""


@dataclass(frozen=True)
class Storage:
    """The agent's podman storage: images and containers under ``root/storage``, their
    runtime state under ``root/run``, and the ``containers.conf`` it writes in ``root``."""

    root: Path
    driver: Literal["overlay", "vfs"] = "overlay"

    @classmethod
    def of(cls, config: ContainersEntry, default_root: Path) -> Storage:
        """The storage ``config`` names, else ``default_root`` (made absolute: podman
        records its paths)."""
        root = Path(config.storage_root) if config.storage_root else default_root
        return cls(root.absolute(), config.storage_driver)

    @property
    def conf(self) -> Path:
        return self.root / "containers.conf"

    def env_file(self, name: str) -> Path:
        """Where the agent writes a container's environment (``name``: its container's)."""
        return self.root / "env" / f"{name}.env"

    def flags(self) -> list[str]:
        """podman's global options that select this storage."""
        return [
            "--root",
            str(self.root / "storage"),
            "--runroot",
            str(self.root / "run"),
            "--storage-driver",
            self.driver,
        ]

    def environment(self, path: str) -> dict[str, str]:
        """podman's whole environment: ``path`` (the agent's PATH) and this storage's
        ``containers.conf``, which podman then reads instead of the host's."""
        return {"PATH": path, "CONTAINERS_CONF": str(self.conf)}


def containers_conf(config: ContainersEntry, storage: Storage) -> str:
    """The ``containers.conf`` the agent writes for ``storage`` (``Storage.conf``)."""
    run = storage.root / "run"

    def string(value: str | Path) -> str:
        return json.dumps(str(value))  # a TOML basic string

    return "\n".join(
        [
            "# Written by the Quartermaster node agent (services/node_agent/containers.py);",
            "# podman reads this file alone (CONTAINERS_CONF). docs/containers.md says why.",
            "[containers]",
            "# Tasks keep the limits they inherit: podman's default rlimits exceed what a",
            "# limited host lets it set, and every container fails to start.",
            "default_ulimits = []",
            "# podman's own proxy variables are not the task's.",
            "http_proxy = false",
            "# As a task run as a process: no limit on its processes and threads.",
            "pids_limit = 0",
            "",
            "[network]",
            f"network_config_dir = {string(storage.root / 'networks')}",
            "",
            "[engine]",
            f"runtime = {string(config.runtime)}",
            "# Root's cgroups, made by podman on cgroup v1 and v2 alike; no systemd needed.",
            'cgroup_manager = "cgroupfs"',
            "# No journald needed; the file is rotated at 1 MiB.",
            'events_logger = "file"',
            "# Its state and locks apart from the host's podman: nothing shared with it.",
            f"tmp_dir = {string(run / 'libpod')}",
            'lock_type = "file"',
            "# Pulls land beside the storage, not in /var/tmp.",
            f"image_copy_tmp_dir = {string(storage.root / 'storage' / 'tmp')}",
            "",
        ]
    )


@dataclass(frozen=True)
class Bind:
    """A host folder seen in the container at ``path``."""

    host_path: str
    path: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerRun:
    """One task's container: ``command`` runs (after the image's entrypoint; empty: the
    image's own command) as ``uid``:``gid`` in ``workdir``, with ``scratch`` bound
    read-write at the same path, ``binds``, ``devices`` (``gpu_devices``), the
    environment in ``env_file`` and at most ``memory_bytes`` of memory (shared memory
    included)."""

    name: str
    image: str
    command: Sequence[str]
    uid: int
    gid: int
    workdir: str
    scratch: str
    binds: Sequence[Bind] = ()
    devices: Sequence[str] = ()
    env_file: str | None = None
    memory_bytes: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


def container_name(task_id: str) -> str:
    """A valid podman name for the task's container, the same for the same task id:
    readable, and unique by a digest of the id (sanitizing is not one to one)."""
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", safe_name(task_id))[:48]
    return f"qm-{readable}-{hashlib.sha256(task_id.encode()).hexdigest()[:12]}"


def task_labels(job_id: str, task_id: str, node_id: str) -> dict[str, str]:
    """The labels a restarted agent finds its containers by."""
    return {LABEL_JOB: job_id, LABEL_TASK: task_id, LABEL_NODE: node_id}


def validate_image_ref(ref: str) -> str:
    """``ref`` if it is a reference podman takes as written (its registry named:
    ``localhost/NAME:TAG``, ``HOST[:PORT]/PATH[:TAG][@DIGEST]``), else ContainerError."""
    if not ref:
        raise ContainerError("image: empty reference")
    if len(ref) > _MAX_REFERENCE:
        raise ContainerError(f"image: at most {_MAX_REFERENCE} characters, got {len(ref)}")
    match = _REFERENCE.fullmatch(ref)
    if match is None:
        raise ContainerError(
            f"image: {ref!r} is not a full reference: REGISTRY/PATH[:TAG][@DIGEST], "
            "with its registry named (localhost/NAME:TAG for an image only on the node) "
            "and its path in lower case"
        )
    return ref


def container_path(path: str, what: str) -> str:
    """``path`` as an absolute path in the container, normalized (``//`` and ``.``
    dropped); ContainerError naming ``what`` for a relative path or one with ``..``."""
    if not path.startswith("/"):
        raise ContainerError(f"{what}: {path!r} must be an absolute path in the container")
    if any(char in path for char in ",\n\0"):
        raise ContainerError(f"{what}: {path!r} may not hold a comma or a newline")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ContainerError(f"{what}: {path!r} may not contain ..")
    return "/" + "/".join(parts)


def resolve_mounts(
    requested: Iterable[tuple[str, str]],
    volumes: Mapping[str, VolumeEntry],
    allocation: str,
    *,
    taken: Sequence[str] = (),
) -> list[Bind]:
    """The binds for a job's ``(volume, path)`` mounts, from the volumes declared here,
    for a job of ``allocation``; ``taken``: paths the agent binds itself (the scratch
    folder). ContainerError for the first mount that cannot be made."""
    binds: list[Bind] = []
    used = {container_path(path, "scratch"): "the job's scratch folder" for path in taken}
    for name, asked in requested:
        volume = volumes.get(name)
        if volume is None:
            declared = ", ".join(sorted(volumes)) or "none"
            raise ContainerError(f"mount: no volume {name} here; declared: {declared}")
        if volume.allocations and allocation not in volume.allocations:
            raise ContainerError(
                f"mount: volume {name} is not for allocation {allocation or '(none)'}; "
                f"it is for: {', '.join(volume.allocations)}"
            )
        path = container_path(asked, f"mount {name}")
        if path == "/" or path.split("/")[1] in _RESERVED:
            raise ContainerError(f"mount {name}: {path} is the container runtime's")
        if path in used:
            raise ContainerError(f"mount: {path} twice: volume {name} and {used[path]}")
        used[path] = f"volume {name}"
        binds.append(Bind(volume.host_path, path, volume.read_only))
    return binds


def gpu_devices(
    gpu_indices: Sequence[int],
    *,
    cdi: bool,
    uuids: Mapping[int, str],
    exists: Callable[[str], bool],
    minors: Mapping[int, int] | None = None,
) -> list[str]:
    """The ``--device`` values that give a task its GPUs and no others: their CDI names
    where the NVIDIA toolkit's spec is (``cdi``: ``nvidia_cdi_spec``; it brings the
    driver's libraries too), else their device nodes and CUDA's control nodes, those that
    ``exists``. ``minors``: a GPU's device minor where it is not its NVML index."""
    if cdi:
        missing = [index for index in gpu_indices if index not in uuids]
        if missing:
            raise ContainerError(f"devices: no UUID known for GPU {missing[0]}")
        return [f"{CDI_KIND}={uuids[index]}" for index in gpu_indices]
    minor = minors or {}
    nodes = [f"/dev/nvidia{minor.get(index, index)}" for index in gpu_indices]
    return [node for node in [*nodes, *CONTROL_NODES] if exists(node)] if nodes else []


def nvidia_cdi_spec(dirs: Iterable[Path] = CDI_DIRS) -> bool:
    """Whether a CDI spec for NVIDIA GPUs is in ``dirs`` (reads them)."""
    for folder in dirs:
        with contextlib.suppress(OSError):
            for spec in sorted(folder.iterdir()):
                if spec.suffix not in (".yaml", ".yml", ".json"):
                    continue
                try:
                    content = yaml.safe_load(spec.read_text())
                except (OSError, UnicodeDecodeError, yaml.YAMLError):
                    continue
                if isinstance(content, dict) and content.get("kind") == CDI_KIND:
                    return True
    return False


def env_file_text(env: Mapping[str, str]) -> str:
    """``env`` as podman's ``--env-file`` reads it back exactly; ContainerError naming
    (never showing) a variable it cannot carry: a newline or carriage return, a name
    podman would trim or take for a comment, a line longer than it reads."""
    lines = []
    for name, value in env.items():
        if not name or "=" in name or name[0] in "# \t" or _breaks_line(name):
            raise ContainerError(f"environment: a variable named {name!r} cannot be passed")
        if _breaks_line(value):
            raise ContainerError(f"environment: {name} holds a newline, which cannot be passed")
        line = f"{name}={value}"
        if len(line.encode()) > _ENV_LINE_MAX:
            raise ContainerError(f"environment: {name} is longer than {_ENV_LINE_MAX} bytes")
        lines.append(line + "\n")
    return "".join(lines)


def _breaks_line(text: str) -> bool:
    return any(char in text for char in "\n\r\0")


def podman_argv(
    podman: str,
    storage: Storage,
    run: ContainerRun,
    *,
    pull: Literal["never", "missing"] = "never",
    authfile: str | None = None,
) -> list[str]:
    """``podman run`` for ``run``, attached: the caller gives it the task's stdout and
    stderr (``passthrough``: the container writes to them itself, on after this podman
    ends) and its exit code is the task's (125-127: podman's own failures)."""
    argv = [
        podman,
        *storage.flags(),
        "run",
        "--name",
        run.name,
        *(arg for key, value in run.labels.items() for arg in ("--label", f"{key}={value}")),
        f"--pull={pull}",
        *(["--authfile", authfile] if authfile else []),
        # UID:GID: with a uid alone, podman adds the groups the image's /etc/group gives it.
        f"--user={run.uid}:{run.gid}",
        "--security-opt=no-new-privileges",
        "--cap-drop=all",
        "--network=host",
        # PID 1 forwards signals and reaps: a task's own PID 1 ignores SIGTERM.
        "--init",
        "--log-driver=passthrough",
        "--workdir",
        container_path(run.workdir, "workdir"),
        "--mount",
        _bind(Bind(run.scratch, run.scratch, read_only=False)),
    ]
    for bind in run.binds:
        argv += ["--mount", _bind(bind)]
    for device in run.devices:
        argv += ["--device", device]
    if run.env_file is not None:
        argv += ["--env-file", run.env_file]
    if run.memory_bytes is not None:
        memory = str(run.memory_bytes)
        # Swap and /dev/shm within the same limit (podman: 64 MiB of shm otherwise).
        argv += ["--memory", memory, "--memory-swap", memory, "--shm-size", memory]
    return [*argv, validate_image_ref(run.image), *run.command]


def _bind(bind: Bind) -> str:
    source = container_path(bind.host_path, "bind")
    target = container_path(bind.path, "bind")
    read_only = ",ro=true" if bind.read_only else ""
    return f"type=bind,source={source},destination={target}{read_only},nosuid,nodev"


def podman_stop_argv(podman: str, storage: Storage, name: str, grace_s: float) -> list[str]:
    """SIGTERM to the container's processes, SIGKILL after ``grace_s`` (whole seconds)."""
    return [podman, *storage.flags(), "stop", f"--time={math.ceil(grace_s)}", name]


def podman_kill_argv(podman: str, storage: Storage, name: str, sig: signal.Signals) -> list[str]:
    """``sig`` to the container (its init passes it on): a stop's warning."""
    return [podman, *storage.flags(), "kill", f"--signal={sig.name}", name]


def podman_wait_argv(podman: str, storage: Storage, name: str) -> list[str]:
    """Waits for the container to end and prints its exit code."""
    return [podman, *storage.flags(), "wait", name]


def podman_rm_argv(podman: str, storage: Storage, name: str) -> list[str]:
    """Removes the container, running or not; no error when it is gone already."""
    return [podman, *storage.flags(), "rm", "--force", "--ignore", name]


def podman_ps_argv(podman: str, storage: Storage, labels: Mapping[str, str]) -> list[str]:
    """Every container with all of ``labels``, running or ended, as JSON (``parse_ps``)."""
    filters = [arg for key, value in labels.items() for arg in ("--filter", f"label={key}={value}")]
    return [podman, *storage.flags(), "ps", "--all", "--format=json", *filters]


@dataclass(frozen=True)
class Container:
    """A container ``podman ps`` listed; ``exit_code`` once it has ended."""

    name: str
    id: str
    state: str
    exit_code: int | None
    labels: Mapping[str, str]


def parse_ps(text: str) -> list[Container]:
    """``podman ps --format=json``'s output; ValueError when it is not that."""
    listed = json.loads(text) if text.strip() else []
    if not isinstance(listed, list):
        raise ValueError("podman ps: expected a JSON list")
    containers = []
    for entry in listed:
        try:
            names = entry["Names"]
            containers.append(
                Container(
                    name=names[0] if names else "",
                    id=str(entry["Id"]),
                    state=str(entry["State"]),
                    exit_code=int(entry["ExitCode"]) if entry.get("Exited") else None,
                    labels=dict(entry.get("Labels") or {}),
                )
            )
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ValueError(f"podman ps: unexpected entry: {exc!r}") from None
    return containers


def write_private(path: Path, text: str) -> None:
    """Write ``path`` whole (a reader sees the old text or the new) for its owner alone
    (0600): an env file holds the task's secrets."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise

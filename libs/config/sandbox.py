"""How a node agent runs tasks (``QM_SANDBOX``; the defaults when unset).

``users`` maps a Quartermaster user to the local account (a name or a uid) that runs
their tasks; ``default`` runs everyone else's (``nobody`` unless set; ``null`` refuses
their tasks). Tasks never run as root. ``environment`` names the only variables of the
agent's environment a task sees; everything else (the agent's credentials included)
stays with the agent.

``cgroups`` (where the host lets the agent make them): ``parents`` are folders the agent
may make cgroups in, a cgroup v2 folder delegated to it or, on cgroup v1, one per
controller (``.../memory/qm``, ``.../devices/qm``); each task gets its own cgroup in
each, limited to ``memory_per_gpu_gib`` times its GPUs (v1 and v2) and, on v1's devices
controller, to the GPU devices it was given.

``scratch``: where each job gets a folder of its own on the node (``<root>/<job id>``,
its account's, 0700): the task's temporary folder, and its working directory and home
when its account has no home it can use. It is kept across the job's attempts here and
removed once the job ends; a job that has not run here for ``expire_after_s`` (it was
requeued and ran elsewhere, or the agent stopped while it ran) loses it too. Every
account that runs tasks must be able to reach ``root`` (each folder above it searchable).

``checkpoints`` (off unless set): where each job gets a checkpoint folder
(``<root>/<job id>``, its account's, 0700; ``QM_CHECKPOINT_DIR``), the same for every
attempt: on a file system every node mounts at ``root``, a requeued job finds there what
it saved wherever it ran before. Removed once the job ends, or unused for
``expire_after_s`` (longer than any job runs: an agent cannot see another node's use).

``containers`` (off unless set; a root agent only): how jobs with an image
(``qm submit --image``) run, through podman (``docs/containers.md``). ``runtime``: the
OCI runtime podman uses (a name podman knows, or an absolute path; crun refuses hybrid
cgroup v1 hosts). ``storage_root``: the agent's own podman storage (``storage/``,
``run/`` and the ``containers.conf`` it writes there), never the host's; unset: the
agent's default beside its other state (the local stack's ``.local/podman``, where
``make example-image`` imports). ``storage_driver``: ``overlay``, or ``vfs`` where the
storage's file system cannot hold overlay layers (every container a full copy).
``pull``: ``never`` (only images already in the storage run) or ``missing``; with
``registries_auth_file``, podman's credentials for pulls (a file here, never from a job).
``required``: this node refuses jobs without an image.

``volumes``: what jobs may mount in their containers (``--mount NAME:/path``), by name:
``host_path`` on this node, read-only unless ``read_only: false``, for jobs of the
``allocations`` listed (exact names: the agent does not know the budget tree), or of
every allocation when none are.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints, field_validator

from libs.config.document import FileModel

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"expected an absolute path, got {path!r}")
    return path


Account = Annotated[int, Field(ge=1)] | Name
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]

DEFAULT_ENVIRONMENT = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


class CgroupsEntry(FileModel):
    parents: Annotated[list[Name], Field(min_length=1)]  # folders (absolute paths)
    memory_per_gpu_gib: Annotated[float, Field(gt=0)] | None = None


class ScratchEntry(FileModel):
    root: Annotated[Name, AfterValidator(_absolute)] = "/var/tmp/qm-scratch"
    expire_after_s: Annotated[float, Field(gt=0)] = 7 * 86_400.0


class CheckpointsEntry(FileModel):
    root: Annotated[Name, AfterValidator(_absolute)]
    expire_after_s: Annotated[float, Field(gt=0)] = 30 * 86_400.0


def _runtime(runtime: str) -> str:
    if not (runtime.startswith("/") or re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", runtime)):
        raise ValueError(f"expected a runtime's name or an absolute path, got {runtime!r}")
    return runtime


def _bind_source(path: str) -> str:
    """A folder podman binds as written: ``--mount`` options are comma-separated."""
    _absolute(path)
    parts = path.split("/")[1:]
    if any(part in ("", ".", "..") for part in parts) and path != "/":
        raise ValueError(f"expected a normalized path (no //, . or ..), got {path!r}")
    if any(char in path for char in ",\n\0"):
        raise ValueError(f"expected a path without commas or newlines, got {path!r}")
    return path


AbsolutePath = Annotated[Name, AfterValidator(_absolute)]
# qm submit --mount NAME:/path: no colon in a name.
VolumeName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]


class ContainersEntry(FileModel):
    runtime: Annotated[Name, AfterValidator(_runtime)] = "runc"
    storage_root: AbsolutePath | None = None
    storage_driver: Literal["overlay", "vfs"] = "overlay"
    pull: Literal["never", "missing"] = "never"
    required: bool = False
    registries_auth_file: AbsolutePath | None = None


class VolumeEntry(FileModel):
    host_path: Annotated[Name, AfterValidator(_bind_source)]
    read_only: bool = True
    allocations: list[Name] = Field(default_factory=list)  # empty: every allocation's jobs


class SandboxFile(FileModel):
    users: dict[Name, Account] = Field(default_factory=dict)
    default: Account | None = "nobody"
    environment: list[EnvName] = Field(default_factory=lambda: list(DEFAULT_ENVIRONMENT))
    cgroups: CgroupsEntry | None = None
    scratch: ScratchEntry = Field(default_factory=ScratchEntry)
    checkpoints: CheckpointsEntry | None = None
    containers: ContainersEntry | None = None
    volumes: dict[VolumeName, VolumeEntry] = Field(default_factory=dict)

    @field_validator("users", mode="after")
    @classmethod
    def _not_root(cls, users: dict[str, int | str]) -> dict[str, int | str]:
        for account in users.values():
            _refuse_root(account)
        return users

    @field_validator("default", mode="after")
    @classmethod
    def _default_not_root(cls, account: int | str | None) -> int | str | None:
        if account is not None:
            _refuse_root(account)
        return account


def _refuse_root(account: int | str) -> None:
    if account == "root":
        raise ValueError("tasks never run as root; name an unprivileged account")

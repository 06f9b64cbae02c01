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
"""

from __future__ import annotations

from typing import Annotated

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


class SandboxFile(FileModel):
    users: dict[Name, Account] = Field(default_factory=dict)
    default: Account | None = "nobody"
    environment: list[EnvName] = Field(default_factory=lambda: list(DEFAULT_ENVIRONMENT))
    cgroups: CgroupsEntry | None = None
    scratch: ScratchEntry = Field(default_factory=ScratchEntry)

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

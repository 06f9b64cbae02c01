"""Whose account a task runs under, and what of the agent's environment it sees.

A root agent runs each task as the local account its user maps to (``QM_SANDBOX``,
``libs.config.sandbox``), never as root: the agent's credentials (files only it reads,
its environment in ``/proc``) and other users' task logs are out of the task's reach.
An agent that is not root cannot switch accounts; it says so once and runs tasks as
itself, still with a clean environment.

A task starts in its account's home if the account can use it (reach it and write in
it), else in its job's scratch folder (``scratch.py``), which is its ``HOME`` then and
its ``TMPDIR`` always. Its ``PATH`` keeps only the folders its account can search
(``reach.py``), and Python's output is unbuffered unless the job says otherwise, so
that its lines reach the log (and ``qm logs -f``) as they are printed.
"""

from __future__ import annotations

import logging
import os
import pwd
from collections.abc import Mapping
from pathlib import Path

from libs.config.document import ConfigError, load
from libs.config.sandbox import (
    CheckpointsEntry,
    ContainersEntry,
    SandboxFile,
    ScratchEntry,
    VolumeEntry,
)
from services.node_agent.accounts import Account
from services.node_agent.cgroups import TaskCgroups
from services.node_agent.reach import SEARCH, WRITE, Ids, look_up, reachable, usable_path

log = logging.getLogger(__name__)


class Refused(Exception):
    """This task's user has no local account here; the message says how to give one."""


def account(spec: int | str) -> Account:
    """The account a name or uid names; a uid without a passwd entry gets its own gid."""
    try:
        entry = pwd.getpwuid(spec) if isinstance(spec, int) else pwd.getpwnam(spec)
    except KeyError:
        if isinstance(spec, int):
            return Account(str(spec), spec, spec, "/")
        raise ConfigError(f"sandbox: no local account {spec!r} on this node") from None
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


class Sandbox:
    """Resolves accounts once, at start: a name unknown on this node stops the agent."""

    def __init__(
        self,
        config: SandboxFile,
        agent_env: Mapping[str, str],
        *,
        switch: bool,
        cgroups: TaskCgroups | None = None,
    ) -> None:
        """``cgroups``: instead of the ones ``config`` names (tests give their own)."""
        self._env = {name: agent_env[name] for name in config.environment if name in agent_env}
        self._switch = switch
        self.scratch: ScratchEntry = config.scratch
        self.checkpoints: CheckpointsEntry | None = config.checkpoints
        self.containers: ContainersEntry | None = config.containers
        self.volumes: dict[str, VolumeEntry] = config.volumes
        self._users = {user: account(spec) for user, spec in config.users.items()}
        self._default = account(config.default) if config.default is not None else None
        # Only a root agent makes cgroups (and then switches accounts inside them).
        if cgroups is None and config.cgroups and switch:
            cgroups = TaskCgroups(config.cgroups)
        self.cgroups = cgroups

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Sandbox:
        """The agent's sandbox: the file ``QM_SANDBOX`` names (or the defaults); switches
        accounts when the agent runs as root."""
        env = os.environ if environ is None else environ
        path = env.get("QM_SANDBOX")
        config = load(SandboxFile, Path(path)) if path else SandboxFile()
        switch = os.geteuid() == 0
        if not switch:
            log.warning(
                "the node agent is not root (uid %d): tasks run as its own user and could "
                "read its files; run it as root to run each task as its user's account",
                os.geteuid(),
            )
        return cls(config, env, switch=switch)

    def closed_to(self, folder: str) -> Account | None:
        """An account tasks run as here (the agent's own, if it does not switch) that
        cannot reach ``folder``; None: every one can."""
        if not self._switch:
            ok = reachable(os.path.realpath(folder), _ids(None), look_up)
            return None if ok else account(os.geteuid())
        mapped = [*self._users.values(), *([self._default] if self._default else [])]
        closed = (a for a in mapped if not reachable(os.path.realpath(folder), _ids(a), look_up))
        return next(closed, None)

    def account_for(self, user: str) -> Account | None:
        """The account ``user``'s tasks run as; ``None``: as the agent (it cannot switch)."""
        if not self._switch:
            return None
        found = self._users.get(user, self._default)
        if found is None:
            raise Refused(
                f"user {user!r} has no local account on this node: map it under users: in "
                "the node agent's sandbox file (QM_SANDBOX), or set a default account"
            )
        return found

    def home(self, runs_as: Account | None) -> str | None:
        """The account's home if it can enter it and write in it; None: it has none."""
        home = os.path.expanduser("~") if runs_as is None else runs_as.home
        if reachable(os.path.realpath(home), _ids(runs_as), look_up, SEARCH | WRITE):
            return home
        return None

    def environment(
        self, runs_as: Account | None, *, home: str | None, scratch: Path
    ) -> dict[str, str]:
        """What a task starts with, before its job's variables and the agent's own:
        ``home`` is its account's usable home (``home``), ``scratch`` its job's scratch
        folder."""
        ids = _ids(runs_as)
        path = usable_path(self._env.get("PATH", "").split(":"), ids, look_up, os.path.realpath)
        env = {
            "PYTHONUNBUFFERED": "1",  # unless the agent passes its own
            **self._env,
            "PATH": ":".join(path),
            "HOME": home or str(scratch),
            "TMPDIR": str(scratch),
        }
        if runs_as is not None:
            env |= {"USER": runs_as.name, "LOGNAME": runs_as.name}
        return env


def _ids(runs_as: Account | None) -> Ids:
    """Whom the kernel checks for a task: its account with its primary group alone (it
    runs with no other), or the agent itself."""
    if runs_as is None:
        return Ids(os.geteuid(), frozenset({os.getegid(), *os.getgroups()}))
    return Ids(runs_as.uid, frozenset({runs_as.gid}))

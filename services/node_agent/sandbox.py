"""Whose account a task runs under, and what of the agent's environment it sees.

A root agent runs each task as the local account its user maps to (``QM_SANDBOX``,
``libs.config.sandbox``), never as root: the agent's credentials (files only it reads,
its environment in ``/proc``) and other users' task logs are out of the task's reach.
An agent that is not root cannot switch accounts; it says so once and runs tasks as
itself, still with a clean environment.
"""

from __future__ import annotations

import logging
import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from libs.config.document import ConfigError, load
from libs.config.sandbox import SandboxFile
from services.node_agent.cgroups import TaskCgroups

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Account:
    """A local account a task runs as."""

    name: str
    uid: int
    gid: int
    home: str


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

    @classmethod
    def as_agent(cls) -> Sandbox:
        """Tasks run as the agent itself, with the default clean environment."""
        return cls(SandboxFile(), os.environ, switch=False)

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

    def environment(self, runs_as: Account | None) -> dict[str, str]:
        """What a task starts with, before its job's variables and the agent's own."""
        if runs_as is None:
            return dict(self._env)
        return {**self._env, "HOME": runs_as.home, "USER": runs_as.name, "LOGNAME": runs_as.name}

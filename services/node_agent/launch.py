"""Starting a task's process: what the agent and a task's keeper (``keeper.py``) share,
kept light (the keeper imports it as it starts, once per task)."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

# How long a task's output may take to reach its log after the task ended.
OUTPUT_DRAIN_S = 2.0


class LaunchError(Exception):
    """The task could not start; exit codes as in a shell: 127 not found, 126 not runnable."""

    def __init__(self, reason: str, exit_code: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.exit_code = exit_code


async def spawn(
    argv: list[str],
    command: str,
    output: tuple[int, int],
    env: dict[str, str],
    identity: dict[str, Any],
) -> asyncio.subprocess.Process:
    """Start ``argv`` with its stdout and stderr on the ``output`` descriptors;
    ``LaunchError`` naming ``command`` (the task's own, whatever runs before it) when it
    cannot start."""
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output[0],
            stderr=output[1],
            env=env,
            # Its own process group: stop() reaches the task's children too, and a
            # Ctrl-C meant for the agent does not hit tasks before their grace period.
            start_new_session=True,
            **identity,
        )
    except FileNotFoundError:
        raise LaunchError(f"command not found: {command}", 127) from None
    except PermissionError:
        raise LaunchError(f"permission denied: {command}", 126) from None
    except OSError as exc:
        raise LaunchError(f"cannot run {command}: {exc.strerror}", 126) from None
    except ValueError as exc:  # a NUL in an argument or the environment
        raise LaunchError(f"cannot run {command}: {exc}", 126) from None
    except subprocess.SubprocessError as exc:  # the child died before it could say why
        raise LaunchError(f"cannot run {command}: {exc}", 126) from None

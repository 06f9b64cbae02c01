"""Progress bars of the long commands: on stderr, and only when stderr is a terminal, so
that a pipe, a file or a JSON document on stdout never holds one."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from cli.render import errors

BAR_AFTER_S = 2.0  # work this long gets a bar; shorter work is over before one would help


def _bar(
    stdout: Console, *columns: TaskProgressColumn | MofNCompleteColumn, disable: bool = False
) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        *columns,
        TimeElapsedColumn(),
        console=errors,
        transient=True,
        redirect_stdout=stdout.is_terminal,  # a piped stdout stays in its pipe
        disable=disable,
    )


@contextmanager
def fractions(stdout: Console) -> Iterator[Callable[[str, float], None] | None]:
    """A bar per named part (a policy, say), told its fraction done, once the work has
    taken ``BAR_AFTER_S``, until the part is done; None unless stderr is a terminal. The
    bars go when the work ends, leaving what was printed meanwhile."""
    if not errors.is_terminal:
        yield None
        return
    bar = _bar(stdout, TaskProgressColumn())
    tasks: dict[str, TaskID] = {}
    began = time.monotonic()

    def show(name: str, done: float) -> None:
        if done >= 1.0:  # a part that is done makes room for the others
            if name in tasks:
                bar.remove_task(tasks.pop(name))
            return
        if not bar.live.is_started:
            if time.monotonic() - began < BAR_AFTER_S:
                return
            bar.start()
        if name not in tasks:
            tasks[name] = bar.add_task(name, total=1.0)
        bar.update(tasks[name], completed=done)

    try:
        yield show
    finally:
        bar.stop()


@contextmanager
def counting(stdout: Console, what: str, total: int | None) -> Iterator[Callable[[int], None]]:
    """One bar counting ``total`` steps of ``what`` (a spinner-like count when None);
    call the function yielded with how many more are done. Nothing when stderr is not a
    terminal."""
    bar = _bar(stdout, MofNCompleteColumn(), disable=not errors.is_terminal)
    task = bar.add_task(what, total=total)
    with bar:
        yield lambda steps: bar.advance(task, steps)


def tallies(stdout: Console, *, shown: bool = True) -> Progress:
    """Bars counting steps (M of N) of the tasks the caller adds, when ``shown`` and stderr
    is a terminal; start it with ``with``."""
    return _bar(stdout, MofNCompleteColumn(), disable=not (shown and errors.is_terminal))

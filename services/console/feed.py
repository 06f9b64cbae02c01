"""What the console shows, refreshed by polling the projector's views and the budget tree.

Polling, not streaming: the projector serves its tables over plain HTTP GETs and has no
push channel; one poll every ``poll_s`` (default 2 s) for every viewer together costs
three requests, and the timeline's integrals need a sample at a steady pace anyway.
Each refresh bumps ``version`` and wakes every stream waiting in ``changed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from qm.v1 import types_pb2

from libs.core.budget_tree import BudgetTree
from libs.readmodels.dashboard import Json, dashboard
from libs.readmodels.jobs import scope_of
from libs.readmodels.occupancy import Timeline, history, sample
from services.admission.budget_view import BudgetView
from services.projector.client import ProjectorClient, ProjectorError
from services.status import Unavailable

log = logging.getLogger("qm.console")


class Feed:
    """The latest nodes, jobs and budget tree, and the timeline sampled from them."""

    def __init__(
        self,
        projector: ProjectorClient,
        budget: BudgetView,
        *,
        window_s: float,
        poll_s: float,
        job_limit: int,
        operators: frozenset[str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._projector = projector
        self._budget = budget
        self._poll_s = poll_s
        self._job_limit = job_limit
        self._operators = operators
        self._clock = clock
        self.timeline = Timeline(window_s)
        self._nodes: list[types_pb2.Node] = []
        self._jobs: list[types_pb2.Job] = []
        self._tree: BudgetTree | None = None
        self.version = 0
        self.problem = "not refreshed yet"  # empty while the last refresh worked
        self._changed = asyncio.Condition()

    @property
    def ready(self) -> bool:
        return self.version > 0 and not self.problem

    async def run(self) -> None:
        """Refresh every ``poll_s`` until cancelled; a failed refresh keeps the last data."""
        while True:
            try:
                await self.refresh()
            except (ProjectorError, Unavailable) as exc:
                if self.problem != str(exc):
                    log.warning("console data is stale: %s", exc)
                self.problem = str(exc)
            await asyncio.sleep(self._poll_s)

    async def refresh(self) -> None:
        nodes = await self._projector.list_nodes()
        jobs = await self._projector.list_jobs(limit=self._job_limit)
        tree = await self._budget.tree()
        self._nodes, self._jobs, self._tree = nodes, jobs, tree
        now, entitlements = self._clock(), tree.entitlements()
        current = sample(now, nodes, jobs)
        if self.version == 0:  # the first sample: the timeline starts from the jobs' history
            for past in history(jobs, nodes, now - self.timeline.window_s, now):
                self.timeline.add(past, entitlements)
        self.timeline.add(current, entitlements)
        self.problem = ""
        async with self._changed:
            self.version += 1
            self._changed.notify_all()

    async def changed(self, seen: int, timeout_s: float) -> int:
        """The version after ``seen``, once there is one (or the current, after timeout_s)."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.version > seen), timeout_s
                )
            return self.version

    def view(self, user: str) -> Json:
        """The page's data as ``user`` may see it."""
        if self._tree is None:
            raise Unavailable(f"the console has no data yet: {self.problem}")
        picture = dashboard(
            user=user,
            scope=scope_of(user, self._tree, self._operators),
            now=self._clock(),
            timeline=self.timeline,
            nodes=self._nodes,
            jobs=self._jobs,
            entitlements=self._tree.entitlements(),
        )
        picture["stale"] = self.problem
        return picture

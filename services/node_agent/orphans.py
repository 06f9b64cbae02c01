"""What a node agent knows of its running tasks across its own restarts: a record per task
in its state folder, and each node's incarnation.

A task runs under its keeper (``keeper.py``), in a session of its own, so it outlives
an agent that is restarted or killed. Each running task has a record (``TaskRecord``:
its placement, its keeper's and its own pid with their start times from /proc, so that a
pid the kernel has since reused is never taken for them, where its keeper writes how it
ended, and its container and cgroups). A restarted agent takes its tasks back
(``Adoption``): a node whose every recorded task still runs under its keeper, or ended
and said how, keeps its incarnation, and placement sees nothing but an agent that
registered again; on any other node (a record it cannot take back, a simulated node,
whose runs were timers) it kills what the records name and registers a new incarnation,
by which placement counts that node's tasks as lost.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import signal
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from qm.v1 import events_pb2

from services.node_agent.names import safe_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskRecord:
    """A running task, as a restarted agent needs it: ``placed`` (its ``TaskPlaced``,
    serialized), its keeper's pid and start time, its own pid (its process group) and
    start time, the file its keeper writes how it ended into, its container (a task in
    an image) and cgroup folders."""

    placed: str  # base64 of the TaskPlaced
    keeper_pid: int
    keeper_started: str
    task_pid: int
    task_started: str
    status: str
    container: str = ""
    cgroups: tuple[str, ...] = ()

    @property
    def task(self) -> events_pb2.TaskPlaced:
        return events_pb2.TaskPlaced.FromString(base64.b64decode(self.placed))

    def adoptable(self) -> bool:
        """A batch task whose keeper still runs, or wrote how the task ended (a workflow
        task's GPU queue lived in the agent alone)."""
        if self.task.HasField("serving"):
            return False
        return start_time(self.keeper_pid) == self.keeper_started or Path(self.status).exists()

    def kill(self) -> None:
        """SIGKILL to the task's process group, if it is still the task's."""
        if start_time(self.task_pid) == self.task_started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.task_pid, signal.SIGKILL)
                log.warning("killed task process group %d left by an earlier agent", self.task_pid)


def record_of(
    task: events_pb2.TaskPlaced,
    *,
    keeper_pid: int,
    keeper_started: str,
    task_pid: int,
    status: Path,
    container: str = "",
    cgroups: Iterable[Path] = (),
) -> TaskRecord:
    return TaskRecord(
        placed=base64.b64encode(task.SerializeToString()).decode(),
        keeper_pid=keeper_pid,
        keeper_started=keeper_started,
        task_pid=task_pid,
        task_started=start_time(task_pid) or "",
        status=str(status),
        container=container,
        cgroups=tuple(str(path) for path in cgroups),
    )


class TaskRecords:
    """The records of the running tasks, in ``folder`` (the agent's, 0700), with the
    keepers' status files and each node's incarnation."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def prepare(self) -> None:
        for path in (self.folder, self._tasks):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(path, 0o700)

    @property
    def _tasks(self) -> Path:
        return self.folder / "tasks"

    def status_file(self, task_id: str) -> Path:
        """Where the task's keeper writes how it ended (in a folder only the agent enters)."""
        self.prepare()
        return self._tasks / f"{safe_name(task_id)}.ended"

    def write(self, task_id: str, record: TaskRecord) -> None:
        self.prepare()
        path = self._tasks / f"{safe_name(task_id)}.json"
        temporary = path.with_suffix(".new")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump(asdict(record), file)
        os.replace(temporary, path)

    def forget(self, task_id: str) -> None:
        """The task ended and its end was reported."""
        for path in (self._tasks / f"{safe_name(task_id)}.json", self.status_file(task_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def load(self) -> list[TaskRecord]:
        """Every record an earlier agent left; one that does not read back is dropped."""
        found = []
        for path in sorted(self._tasks.glob("*.json")) if self._tasks.is_dir() else []:
            try:
                raw = json.loads(path.read_text())
                raw["cgroups"] = tuple(raw.get("cgroups", ()))
                record = TaskRecord(**raw)
                record.task  # noqa: B018  (it must parse)
            except (OSError, ValueError, TypeError) as exc:
                log.warning("dropping unreadable task record %s: %s", path.name, exc)
                path.unlink(missing_ok=True)
                continue
            found.append(record)
        return found

    def mark_serving(self, node_id: str) -> None:
        """The node's GPUs queue workflow tasks: only the agent knows those queues, so
        the next agent cannot take the node's tasks back (``adopt``)."""
        self.prepare()
        (self.folder / f"serving-{safe_name(node_id)}").touch()

    def serves(self, node_id: str) -> bool:
        return (self.folder / f"serving-{safe_name(node_id)}").exists()

    def incarnations(self) -> dict[str, str]:
        try:
            raw = json.loads((self.folder / "incarnations.json").read_text())
        except (OSError, ValueError):
            return {}
        return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

    def keep_incarnations(self, incarnations: Mapping[str, str]) -> None:
        self.prepare()
        path = self.folder / "incarnations.json"
        fd = os.open(path.with_suffix(".new"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            json.dump(dict(incarnations), file)
        os.replace(path.with_suffix(".new"), path)


@dataclass(frozen=True)
class Adoption:
    """What a restarted agent takes back: the records of its tasks to follow again, and
    each node's incarnation (the last one where its tasks were all taken back)."""

    records: tuple[TaskRecord, ...]
    incarnations: dict[str, str]


def adopt(records: TaskRecords, process_nodes: Iterable[str], all_nodes: Iterable[str]) -> Adoption:
    """Take back what an earlier agent left: on each of ``process_nodes`` whose recorded
    tasks can all be taken back, those tasks and its incarnation; everywhere else a new
    incarnation, and the recorded tasks killed and forgotten."""
    earlier = records.incarnations()
    by_node: dict[str, list[TaskRecord]] = {}
    for record in records.load():
        by_node.setdefault(record.task.node_id, []).append(record)
    kept: list[TaskRecord] = []
    incarnations = {}
    process = set(process_nodes)
    for node_id in all_nodes:
        found = by_node.pop(node_id, [])
        serves = records.serves(node_id)
        if serves:
            (records.folder / f"serving-{safe_name(node_id)}").unlink()
        takes_back = node_id in process and node_id in earlier and not serves
        if takes_back and all(r.adoptable() for r in found):
            incarnations[node_id] = earlier[node_id]
            kept += found
            continue
        incarnations[node_id] = new_incarnation()
        _drop(records, found)
    for found in by_node.values():  # of nodes this agent no longer runs
        _drop(records, found)
    records.keep_incarnations(incarnations)
    return Adoption(tuple(kept), incarnations)


def _drop(records: TaskRecords, found: Iterable[TaskRecord]) -> None:
    for record in found:
        record.kill()
        records.forget(record.task.task_id)


def new_incarnation() -> str:
    """A fresh id for an agent's registration of a node: new at every (re)start."""
    return uuid.uuid4().hex[:16]


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, as /proc says; None: gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its end.
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19]  # field 22 of the whole line

"""Declared state (``libs/core/state.py``): the digest covers what the scheduler remembers.

After every input of random histories (the generators of ``test_properties.py``)
and of the golden logs, the incremental digest must equal one hashed from
scratch over every declared table, and each derived cache must equal its
rebuild from declared state. Every attribute of the scheduler and of its parts
must be declared state, config, the input clock or a named derived cache, so a
field added without a table fails here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from libs.core import Decision, Input, Planned, Refused, Reject, Scheduler, StopCause
from libs.core.capacity import Capacity
from libs.core.charges import Charges
from libs.core.compass.backlog import Backlogs
from libs.core.compass.busy import BusyMeter
from libs.core.compass.load import Load
from libs.core.compass.peers import Peers
from libs.core.compass.pool import Pool
from libs.core.compass.routing import Router
from libs.core.compass.serving import Serving
from libs.core.compass.touch import GpuTouch
from libs.core.dependencies import Dependencies
from libs.core.estimates import LearnedRuntimes
from libs.core.facts import Facts
from libs.core.liveness import Liveness
from libs.core.queues import TIERS, Queues, Waiting
from libs.core.reservations import Reservations
from libs.core.rooms import RoomIndex
from libs.core.running import Running, RunningWork
from libs.core.state import Cell, State, Table
from libs.events.convert import to_input
from libs.events.logfile import read_log
from tests.builders import job
from tests.unit.libs.core.test_properties import HISTORIES, for_histories, play_hostile

GOLDEN = Path(__file__).resolve().parents[3] / "golden"

CONFIG = {"config", "mode", "_costs", "_planner"}  # the policy's settings, and what they make
# What else is not declared state, besides the caches each class names in DERIVED.
NOT_STATE: dict[type, set[str]] = {
    # The input clock (the largest time in the log: every replay shares it), the
    # State itself, and the parts that are checked in turn.
    Scheduler: CONFIG | {"_facts"},
    Facts: CONFIG
    | {
        "now",
        "state",
        "capacity",
        "queues",
        "running",
        "charges",
        "reservations",
        "liveness",
        "learned",
        "dependencies",
        "serving",
    },
    # Memos: the last shape, dropped as the indexes change; the nodes plans read and the
    # node classes fits read, dropped as nodes change; and the count of those changes,
    # which prices key on.
    Capacity: {"_shape", "_schedulable", "_matching", "generation"},
    # The heads asked since each queue changed, and the queues changed since their heads
    # last heard why they wait (both checked below).
    Queues: {"_heads", "_moved"},
    RunningWork: CONFIG | {"_roomy"},  # the rooms for a window of the clock (checked below)
    # Its nodes price running work; the last rank is a memo keyed by all it read, and
    # so are running jobs' prices.
    Charges: CONFIG | {"_capacity", "_ranked", "_prices"},
    # Memos: one keyed by all it read; the open nodes, dropped as reservations change;
    # each node's floors, keyed by the entries read.
    Reservations: CONFIG | {"_failed", "_open", "_floors"},
    Liveness: CONFIG,
    LearnedRuntimes: set(),
    Dependencies: set(),
    # Its parts, checked in turn, and the scheduler's capacity it borrows from.
    Serving: CONFIG | {"pool", "_backlogs", "_load", "_batch", "peers", "_router", "_touch"},
    # Serving's parts they read and change, and its digest's touch.
    Peers: {"_backlogs", "_touch"},
    Router: CONFIG | {"_pool", "_backlogs", "_touch"},
    GpuTouch: {"_pool", "_backlogs"},
    # The scheduler's capacity it borrows from; its meter, checked in turn.
    Pool: {"config", "_batch", "_meter"},
    Backlogs: {"_planner"},
    Load: {"arrival_window_ms", "admit_window_ms"},  # config
    BusyMeter: {"window_ms"},  # config
}


def parts(scheduler: Scheduler) -> list[object]:
    """The scheduler and the parts that declare its state."""
    facts = scheduler._facts
    return [
        scheduler,
        facts,
        facts.capacity,
        facts.queues,
        facts.running,
        facts.charges,
        facts.reservations,
        facts.liveness,
        facts.learned,
        facts.dependencies,
        facts.serving,
        facts.serving.pool,
        facts.serving._backlogs,
        facts.serving._load,
        facts.serving.peers,
        facts.serving._router,
        facts.serving._touch,
        facts.serving.pool._meter,
    ]


def undeclared(part: object) -> list[str]:
    """The attributes of ``part`` that are neither declared state nor allowed otherwise."""
    kind = type(part)
    allowed = NOT_STATE[kind] | set(getattr(kind, "DERIVED", ()))
    return sorted(
        name
        for name, value in vars(part).items()
        if not isinstance(value, Table | Cell) and name not in allowed
    )


def check(scheduler: Scheduler) -> None:
    assert scheduler.digest() == scheduler.recomputed_digest()
    facts = scheduler._facts
    running = facts.running
    derived = running.derived()
    assert derived["free_work_gpus"] == running.free_work_gpus
    assert derived["_deadlines"] == running._deadlines
    on_node = {n: list(jobs) for n, jobs in running._on_node.items() if jobs}
    assert on_node == {n: list(jobs) for n, jobs in derived["_on_node"].items()}  # type: ignore[attr-defined]
    preemptible = {n: list(jobs.items()) for n, jobs in running._preemptible.items() if jobs}
    assert preemptible == {n: list(jobs.items()) for n, jobs in derived["_preemptible"].items()}  # type: ignore[attr-defined]
    assert running._room == derived["_room"]  # each node's room bound, kept as jobs change
    roomy = running._roomy
    if roomy.covers(roomy.window[0]):  # the nodes by room, kept as jobs change, hold
        rebuilt = RoomIndex()
        rebuilt.rebuild(running._room, roomy.window[0])
        assert roomy.most == rebuilt.most
        assert [{k: set(v) for k, v in by.items()} for by in roomy.nodes] == [
            {k: set(v) for k, v in by.items()} for by in rebuilt.nodes
        ]
    generation, prices = facts.charges._prices
    if generation == facts.capacity.generation:  # remembered prices hold
        for job_id, (tasks, priced) in prices.items():  # of running jobs only
            assert facts.charges._priced(tasks) == priced
            assert job_id in facts.running.jobs
    assert facts.charges.derived() == {"_entitlements": facts.charges._entitlements}
    reservations = facts.reservations
    assert reservations.derived() == {"_earmarked": reservations.earmarked()}
    if (open_nodes := reservations._open) is not None:  # the remembered open nodes hold
        assert open_nodes == reservations.reserved.keys() - reservations.earmarked()
    assert facts.serving.derived() == {"_tasks": facts.serving._tasks}
    assert facts.dependencies.derived() == facts.dependencies._dependents
    queues = facts.queues
    assert queues.derived() == queues.index
    for tier, heads in queues._heads.items():  # a remembered head is the first
        for allocation, key in heads.items():
            assert key == min(keys[0] for keys in queues.index[tier][allocation].values())
    for tier in TIERS:  # a queue not marked moved has a head that heard why it waits
        for allocation in set(queues.index[tier]) - queues.moved(tier):
            head = queues.head(tier, allocation)
            assert head is None or head.job_id in facts.reasons
    kept, rebuilt = facts.capacity.indexes(), facts.capacity.derived()
    if (memo := facts.capacity._shape) is not None:  # the remembered shape holds
        facts.capacity._shape = None
        assert facts.capacity.shape(memo[0]) == memo[1]
    assert _in_order(kept[0]) == _in_order(rebuilt[0])  # type: ignore[arg-type]
    assert kept[1:] == rebuilt[1:]


def _in_order(by_class: dict[object, dict[int, dict[str, None]]]) -> object:
    """Buckets with their nodes in order: best fit takes a bucket's first node."""
    return {cls: {n: list(nodes) for n, nodes in b.items()} for cls, b in by_class.items()}


class Checked(Scheduler):
    """A scheduler that checks its digest and caches after every input (``every``
    False: after every input that decides something, as placement records it)."""

    every = True

    def handle(self, event: Input) -> list[Decision]:
        decisions = super().handle(event)
        if decisions or self.every:
            check(self)
        return decisions


@pytest.mark.parametrize(("kind", "examples"), [("random", 60), ("hostile", 100), ("tied", 60)])
def test_the_digest_is_the_declared_state_after_every_input(kind: str, examples: int) -> None:
    played = HISTORIES[kind][1]
    for_histories(kind, examples, lambda history: played(history, Checked()))


@pytest.mark.parametrize("log", sorted(p.name for p in GOLDEN.glob("*.input.bin")))
def test_the_digest_is_the_declared_state_through_the_golden_logs(log: str) -> None:
    """Workflows, model caches, lost nodes: the golden logs cover what hypothesis does not."""
    scheduler = Checked()
    scheduler.every = False  # thousands of inputs: the checks would take a minute
    decisions: list[Decision] = []
    for env in read_log(GOLDEN / log):
        event = to_input(env)
        if event is not None and not isinstance(event, Reject | Refused):  # the edge's answers
            decisions += scheduler.handle(event)
    check(scheduler)
    assert any(isinstance(d, Planned) for d in decisions) or "serving" not in log


def test_every_attribute_is_declared_state_config_or_a_derived_cache() -> None:
    scheduler = play_hostile([("arrive", 2, "a"), ("time", 5)]).scheduler
    assert {type(p): undeclared(p) for p in parts(scheduler)} == {
        type(p): [] for p in parts(scheduler)
    }
    # Every derived cache is rebuilt (and so compared by ``check``); serving's kept
    # timelines (``Backlogs.DERIVED``) are held to rebuilt ones by
    # compass/test_serving.py instead.
    assert set(scheduler._facts.running.derived()) == set(RunningWork.DERIVED)
    assert set(scheduler._facts.charges.derived()) == set(Charges.DERIVED)
    assert set(scheduler._facts.serving.derived()) == set(Serving.DERIVED)


def test_a_field_added_without_a_table_is_caught() -> None:
    scheduler = Scheduler()
    scheduler._shortcut = {}  # type: ignore[attr-defined]
    scheduler._facts.serving._memo = None  # type: ignore[attr-defined]
    assert undeclared(scheduler) == ["_shortcut"]
    assert undeclared(scheduler._facts.serving) == ["_memo"]


def test_every_table_and_cell_is_in_the_digest() -> None:
    scheduler = Scheduler()
    found = {
        value.name
        for part in parts(scheduler)
        for value in vars(part).values()
        if isinstance(value, Table | Cell)
    }
    assert found == set(scheduler._facts.state.names)


# -- the tables themselves ---------------------------------------------------------


def test_writes_deletes_and_cells_keep_the_digest_equal_to_a_fresh_one() -> None:
    state = State()
    jobs: Table[str, tuple[int, ...]] = state.table("jobs")
    clock = state.cell("clock", 0.0)
    empty = state.digest()
    jobs["a"] = (1,)
    jobs["b"] = (2,)
    jobs["a"] = (3,)
    del jobs["b"]
    clock.value = 5.0
    assert state.digest() == state.recomputed() != empty
    jobs.pop("a")
    clock.value = 0.0
    assert state.digest() == state.recomputed() == empty


def test_a_value_changed_in_place_without_a_touch_is_caught() -> None:
    state = State()
    held: Table[str, list[int]] = state.table("held")
    held["n0"] = [1]
    state.digest()
    held["n0"].append(2)  # a mutable value changed behind the table's back
    assert state.digest() != state.recomputed()
    held.touch("n0")
    assert state.digest() == state.recomputed()


def test_equal_contents_give_equal_digests_whatever_the_order_of_digests() -> None:
    one, two = State(), State()
    a: Table[str, int] = one.table("t")
    b: Table[str, int] = two.table("t")
    a["x"], a["y"] = 1, 5
    one.digest()
    a["y"] = 2
    b["x"], b["y"] = 1, 2
    assert one.digest() == two.digest()


def test_the_same_value_under_another_table_or_key_is_another_fact() -> None:
    one, two, three = State(), State(), State()
    one.table("t")["k"] = 1
    two.table("u")["k"] = 1
    three.table("t")["j"] = 1
    assert len({one.digest(), two.digest(), three.digest()}) == 3


def test_a_name_is_declared_once() -> None:
    state = State()
    state.table("t")
    with pytest.raises(ValueError, match="declared twice"):
        state.cell("t", 0)


def test_the_order_of_a_table_is_in_its_digest() -> None:
    one, two = State(), State()
    a: Table[str, int] = one.table("t")
    b: Table[str, int] = two.table("t")
    a["x"], a["y"] = 1, 2
    b["y"], b["x"] = 2, 1
    assert list(a) != list(b) and one.digest() != two.digest()
    a["x"] = 3  # a key written again keeps its place
    assert list(a) == ["x", "y"] and one.digest() == one.recomputed()


def test_facts_are_hashed_when_the_digest_is_read_each_once() -> None:
    hashed: list[str] = []

    def fact(value: int) -> str:
        hashed.append(str(value))
        return str(value)

    state = State()
    table: Table[str, int] = state.table("t", fact)
    table["k"], table["j"] = 1, 2
    table["k"] = 3  # written twice, hashed once, and only when the digest is read
    assert hashed == []
    assert state.digest() == state.recomputed()
    assert sorted(hashed[:2]) == ["2", "3"]


def test_writes_that_would_bypass_the_digest_are_refused() -> None:
    table: Table[str, int] = State().table("t")
    with pytest.raises(TypeError, match="one by one"):
        table.update({"k": 1})
    with pytest.raises(TypeError):
        table.clear()


@pytest.mark.parametrize(
    "value",
    [
        Waiting("j1", job(2), 7, 1, 30.0),
        Running("j1", job(2), 7, 1, 30.0, {"j1/1": ("n0", (0, 1))}, 31.0, True, None, (), ""),
    ],
)
def test_a_hand_written_fact_names_every_field(value: Waiting | Running) -> None:
    """The facts written field by field (hot tables) change with any field but the key."""
    other = {str: "x", int: 99, float: 99.5, tuple: ("x",), dict: {}}
    for f in dataclasses.fields(value):
        if f.name == "job_id":
            continue
        current = getattr(value, f.name)
        changed = (
            job(3)
            if f.name == "spec"
            else StopCause.CANCELLED
            if current is None
            else not current
            if isinstance(current, bool)
            else other[type(current)]
        )
        assert dataclasses.replace(value, **{f.name: changed}).fact() != value.fact(), f.name


def test_a_running_job_copied_with_changes_is_what_replace_gives() -> None:
    run = Running("j1", job(2), 7, 1, 30.0, {"j1/1": ("n0", (0, 1))})
    changed = run.but(ended=("j1/1",), idle=True)
    assert changed == dataclasses.replace(run, ended=("j1/1",), idle=True) != run
    assert run.ended == () and not run.idle

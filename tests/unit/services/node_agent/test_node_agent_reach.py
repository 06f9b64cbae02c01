"""Which folders a task's account can use: its PATH keeps only those, its home must be one."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.node_agent.reach import (
    FALLBACK_PATH,
    SEARCH,
    WRITE,
    Folder,
    Ids,
    allows,
    look_up,
    reachable,
    usable_path,
)

TASK = Ids(1000, frozenset({100}))
DIR = stat.S_IFDIR


def folder(mode: int, uid: int = 0, gid: int = 0) -> Folder:
    return Folder(DIR | mode, uid, gid)


def test_the_owners_bits_decide_for_the_owner_even_if_others_may_more() -> None:
    assert not allows(folder(0o601, uid=TASK.uid), TASK, SEARCH)
    assert allows(folder(0o100, uid=TASK.uid), TASK, SEARCH)
    assert not allows(folder(0o701, gid=100), TASK, SEARCH)  # its group's bits: none
    assert allows(folder(0o710, gid=100), TASK, SEARCH)
    assert allows(folder(0o701), TASK, SEARCH) and not allows(folder(0o701), TASK, SEARCH | WRITE)
    assert allows(folder(0o703), TASK, SEARCH | WRITE)
    assert not allows(Folder(stat.S_IFREG | 0o777, 0, 0), TASK, SEARCH)  # not a folder


# A made-up tree: paths of up to three levels over a few names, each with a mode, owner
# and group drawn from the task's own, another's, or root's.
NAMES = ("a", "b", "bin")
paths = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(lambda p: "/" + "/".join(p))
folders = st.builds(
    folder,
    st.integers(0, 0o777),
    st.sampled_from([0, TASK.uid, 2000]),
    st.sampled_from([0, 100, 200]),
)
trees = st.dictionaries(paths, folders, max_size=20).map(lambda tree: {"/": folder(0o755), **tree})
entries = st.lists(st.one_of(paths, st.sampled_from(["", "bin", "./x", "/", *FALLBACK_PATH])))


def reachable_by_walking_down(tree: dict[str, Folder]) -> set[str]:
    """The folders the task reaches going down from /: the reference the filter must match."""
    found = {"/"} if allows(tree["/"], TASK, SEARCH) else set()
    changed = True
    while changed:
        changed = False
        for path, found_folder in tree.items():
            parent = os.path.dirname(path)
            if path not in found and parent in found and allows(found_folder, TASK, SEARCH):
                found.add(path)
                changed = True
    return found


@given(trees, entries)
def test_path_keeps_exactly_the_folders_the_task_can_reach_in_order(
    tree: dict[str, Folder], path: list[str]
) -> None:
    kept = usable_path(path, TASK, tree.get, lambda p: p)
    reach = reachable_by_walking_down(tree)
    wanted = [e for e in dict.fromkeys(path) if e.startswith("/") and e in reach]
    assert kept == (wanted or [e for e in FALLBACK_PATH if e in reach])


def test_a_home_must_be_searchable_all_the_way_down_and_writable() -> None:
    tree = {"/": folder(0o755), "/home": folder(0o755), "/home/t": folder(0o700, uid=TASK.uid)}
    assert reachable("/home/t", TASK, tree.get, SEARCH | WRITE)
    assert not reachable("/home/t", TASK, {**tree, "/home": folder(0o700)}.get, SEARCH)
    assert not reachable("/nonexistent", TASK, tree.get, SEARCH)
    assert not reachable("relative", TASK, tree.get, SEARCH)


@pytest.mark.skipif(os.geteuid() != 0, reason="making folders of another account needs root")
def test_on_this_machine_the_filter_agrees_with_the_kernel() -> None:
    """As nobody: a folder under a closed one is dropped, one under an open one kept, as
    the kernel says."""
    nobody = Ids(65534, frozenset({65534}))
    top = Path(tempfile.mkdtemp(prefix="qm-reach-"))  # not under pytest's, closed to others
    try:
        top.chmod(0o755)
        for name, mode in (("closed", 0o700), ("open", 0o755)):
            (top / name / "bin").mkdir(parents=True)
            (top / name).chmod(mode)
        entries = [str(top / "closed" / "bin"), str(top / "open" / "bin")]
        kept = usable_path(entries, nobody, look_up, os.path.realpath)
        usable = [
            e for e in entries
            if subprocess.run(["test", "-x", e], user=65534, group=65534).returncode == 0
        ]  # fmt: skip
        assert kept == usable == [str(top / "open" / "bin")]
    finally:
        shutil.rmtree(top)

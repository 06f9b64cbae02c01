"""Exits read from a supervised service's log: crashes carry the error that caused them."""

from __future__ import annotations

import time
from pathlib import Path

from tests.chaos.exits import crashes, exits

LOG = """\
2026-12-03 05:00:56,771 placement INFO services.placement.service: job_pending j-1
Traceback (most recent call last):
  File "/work/services/placement/__main__.py", line 31, in <module>
    main()
libs.core.budget_tree.InvalidTree: lab: weight must be > 0, got nan
2026-12-03 05:00:57,066 placement WARNING supervise: pid 19911 exited with code 1 after 402.0 s; \
restart 2 in 1 s
2026-12-03 05:00:58,070 placement INFO supervise: started pid 22574: python -m services.placement
2026-12-03 05:01:10,500 placement WARNING supervise: pid 22574 was killed by SIGKILL after 12.4 s; \
restart 3 in 2 s
"""


def test_each_exit_names_its_pid_and_the_error_logged_before_it(tmp_path: Path) -> None:
    path = tmp_path / "placement.log"
    path.write_text(LOG)
    found = exits(path)
    assert [(e.pid, e.how, e.cause) for e in found] == [
        (
            19911,
            "exited with code 1",
            "libs.core.budget_tree.InvalidTree: lab: weight must be > 0, got nan",
        ),
        (22574, "was killed by SIGKILL", ""),
    ]
    assert (
        found[0].at
        == time.mktime(time.strptime("2026-12-03 05:00:57", "%Y-%m-%d %H:%M:%S")) + 0.066
    )


def test_a_crash_is_an_exit_the_harness_did_not_cause_within_the_window(tmp_path: Path) -> None:
    (tmp_path / "placement.log").write_text(LOG)
    everything = (0.0, 2e9)
    assert [
        e.pid for e in crashes(tmp_path, killed={22574}, since=everything[0], until=everything[1])
    ] == [19911]
    assert crashes(tmp_path, killed=set(), since=0.0, until=1.0) == []

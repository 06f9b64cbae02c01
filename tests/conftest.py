"""Rules for every test: what needs ../shared/data says so, and is never skipped in silence.

The public traces and the Compass profiles live beside the repository, not in it. A test
that reads them is marked ``shared_data``; where the folder is missing those tests are
skipped and the run ends with a line that says how many did not run, and why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
_MISSING = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "shared_data: reads ../shared/data (public traces, Compass profiles)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    needing = [item for item in items if item.get_closest_marker("shared_data")]
    config.stash[_MISSING] = 0 if SHARED_DATA.is_dir() else len(needing)
    if config.stash[_MISSING]:
        skip = pytest.mark.skip(reason=f"needs {SHARED_DATA}, which is missing")
        for item in needing:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    missing = terminalreporter.config.stash.get(_MISSING, 0)
    if missing:
        terminalreporter.write_line(
            f"{missing} tests that read the public traces or Compass profiles did NOT run: "
            f"{SHARED_DATA} is missing (check out ../shared beside the repository)",
            red=True,
            bold=True,
        )

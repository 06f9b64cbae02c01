"""The security suite: attacks on every trust boundary, each refused (the table is in
README's "Security" section). Tests that talk to the real broker and services run
where it runs (``make test``), like the integration tests. Once the suite is over, no
log of the stacks it ran (nor of their broker) may hold a token or a password
(``suite``)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.integration.stack import Stack
from tests.security.exposure import Secrets, logged

_ON_THE_BROKER = ("test_bus.py", "test_tokens.py", "test_privacy.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "security" in str(item.path) and item.path.name in _ON_THE_BROKER:
            item.add_marker(pytest.mark.kafka)


def open_folder() -> Path:
    """A folder every account may enter (unlike pytest's tmp_path, private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="qm-security-"))
    folder.chmod(0o755)
    return folder


@pytest.fixture
def shared() -> Iterator[Path]:
    """An open folder, for tasks that run as unprivileged accounts."""
    folder = open_folder()
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Suite:
    """The stacks of services this suite runs (each fixture that starts one adds it), and
    the open folders it made (removed once the logs in them are checked)."""

    stacks: list[Stack] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)

    def open_folder(self) -> Path:
        folder = open_folder()
        self.folders.append(folder)
        return folder


@pytest.fixture(scope="session", autouse=True)
def suite() -> Iterator[Suite]:
    """After the suite: every log its stacks and their broker wrote, services' and tasks',
    is free of tokens and of every password file's content (the suite sends tokens of
    every kind: valid, expired, forged, in addresses and headers)."""
    ran = Suite()
    yield ran
    try:
        leaks = logged(ran.stacks, Secrets.of_stacks(ran.stacks)) if ran.stacks else {}
        if leaks:
            pytest.fail(
                "secrets in the logs: "
                + "; ".join(f"{path}: {', '.join(named)}" for path, named in leaks.items())
            )
    finally:
        for folder in ran.folders:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def front_door(tmp_path_factory: pytest.TempPathFactory, suite: Suite) -> Iterator[Stack]:
    """The services that check callers: budget, projector and admission (no placement:
    a job is admitted and seen, never run)."""
    stack = Stack(tmp_path_factory.mktemp("front-door"))
    suite.stacks.append(stack)
    try:
        stack.create_topics()
        stack.start("budget")
        stack.start("projector")
        stack.wait_ready(
            f"grpc:127.0.0.1:{stack.budget_port}", f"http://127.0.0.1:{stack.projector_port}/ready"
        )
        stack.start("admission")
        stack.wait_ready(f"grpc:127.0.0.1:{stack.admission_port}")
        yield stack
    finally:
        stack.down()

"""The security suite: attacks on every trust boundary, each refused (the table is in
README's "Security" section). Tests that talk to the real broker and services run
where it runs (``make test``), like the integration tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.stack import Stack

_ON_THE_BROKER = ("test_bus.py", "test_tokens.py", "test_privacy.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "security" in str(item.path) and item.path.name in _ON_THE_BROKER:
            item.add_marker(pytest.mark.kafka)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every account may enter (unlike pytest's tmp_path, private to root): for
    tasks that run as unprivileged accounts."""
    folder = Path(tempfile.mkdtemp(prefix="qm-security-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def front_door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The services that check callers: budget, projector and admission (no placement:
    a job is admitted and seen, never run)."""
    stack = Stack(tmp_path_factory.mktemp("front-door"))
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

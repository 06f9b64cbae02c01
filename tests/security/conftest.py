"""The security suite: attacks on every trust boundary, each refused (see README's
"Security" section for the table). Tests here talk to the real broker, like the
integration tests, so they run where it runs (``make test``)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "security" in str(item.path) and item.path.name in ("test_bus.py", "test_tokens.py"):
            item.add_marker(pytest.mark.kafka)

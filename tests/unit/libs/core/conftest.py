from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.libs.core.determinism import OtherProcess, other_hash_seed


@pytest.fixture(scope="module")
def other_process() -> Iterator[OtherProcess]:
    """A replayer in another process, under another hash seed than this one's."""
    worker = OtherProcess(other_hash_seed())
    yield worker
    worker.close()

"""The client says clearly when no projector answers."""

from __future__ import annotations

import socket

import pytest

from services.projector.client import ProjectorClient, ProjectorUnavailable


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_unreachable_projector_raises_projector_unavailable() -> None:
    async with ProjectorClient(f"http://127.0.0.1:{closed_port()}") as client:
        with pytest.raises(ProjectorUnavailable, match="unreachable"):
            await client.get_job("j1")
        with pytest.raises(ProjectorUnavailable):
            await client.list_nodes()
        assert await client.ready() is False


async def test_close_without_use_and_twice() -> None:
    client = ProjectorClient("http://127.0.0.1:1/")
    await client.close()
    await client.close()
    assert client.base_url == "http://127.0.0.1:1"

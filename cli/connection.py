"""Where the services are and who the user is, for every qm command.

``QM_ADDR`` (JobService/ClusterService, default 127.0.0.1:50051),
``QM_BUDGET_ADDR`` (BudgetService, default 127.0.0.1:50052), and the token:
``QM_TOKEN``, else the file ``$QM_TOKEN_FILE`` (default ~/.config/qm/token).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from services.grpc_server import bearer

DEFAULT_TOKEN_FILE = Path.home() / ".config" / "qm" / "token"


class NotSignedIn(Exception):
    pass


@dataclass(frozen=True)
class Connection:
    address: str
    budget_address: str
    token: str

    @classmethod
    def from_env(cls) -> Connection:
        return cls(
            address=os.environ.get("QM_ADDR", "127.0.0.1:50051"),
            budget_address=os.environ.get("QM_BUDGET_ADDR", "127.0.0.1:50052"),
            token=_token(),
        )

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.address)

    def budget_channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.budget_address)

    @property
    def metadata(self) -> tuple[tuple[str, Any], ...]:
        return bearer(self.token)


def _token() -> str:
    if token := os.environ.get("QM_TOKEN"):
        return token.strip()
    path = Path(os.environ.get("QM_TOKEN_FILE", DEFAULT_TOKEN_FILE))
    if path.exists():
        return path.read_text().strip()
    raise NotSignedIn(
        f"no token: set QM_TOKEN or write one to {path} (`make up` does this for the local stack)"
    )

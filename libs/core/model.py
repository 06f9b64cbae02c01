"""What the core knows of jobs and nodes: frozen values converted once at the edge."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class JobSpec:
    allocation: str
    user: str
    gpus: int
    command: tuple[str, ...]
    gpu_type: str = ""
    min_runtime_s: int = 0
    resumable: bool = False
    priority: int = 0
    client_request_id: str = ""
    cluster: str = "default"
    env: tuple[tuple[str, str], ...] = ()
    simulated_duration_s: float = 0.0
    simulated_exit_code: int = 0


@dataclass(frozen=True)
class NodeSpec:
    node_id: str
    gpu_type: str
    gpu_indices: tuple[int, ...] = field(default=())

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_indices)

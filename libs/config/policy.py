"""The policy file (``QM_POLICY_FILE``, ``qm audit verify --policy``): PolicyConfig's knobs.

Part of the replay contract: placement and its auditors must read the same file. A
knob left out keeps its default; an empty file is the default policy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, Strict

from libs.config.document import FileModel, read_document, validate
from libs.core import limits as L
from libs.core.compass import CacheModel, PlanMode
from libs.core.config import PolicyConfig

_D = PolicyConfig()
GpuType = Annotated[str, Field(min_length=1, max_length=L.MAX_TEXT_CHARS)]
Price = Annotated[float, Field(gt=0)]


class PolicyFile(FileModel):
    lookback_window_s: float = Field(_D.lookback_window_s, gt=0)
    max_min_runtime_s: float = Field(_D.max_min_runtime_s, ge=0)
    running_horizon_s: float = Field(_D.running_horizon_s, ge=0)
    protect_borrowed: bool = _D.protect_borrowed
    debug_headroom: float = Field(_D.debug_headroom, ge=0, le=1)
    free_stop_grace_s: float = Field(_D.free_stop_grace_s, gt=0)
    # GPU type -> what one of its GPU-seconds costs (types not listed cost 1).
    gpu_prices: dict[GpuType, Price] = Field(default_factory=dict, max_length=L.MAX_GPU_TYPES)
    serving_mode: Annotated[PlanMode, Strict(False)] = PlanMode(_D.serving_mode)
    serving_cache_model: Annotated[CacheModel, Strict(False)] = CacheModel(_D.serving_cache_model)
    adjust_threshold: float = Field(_D.adjust_threshold, ge=0)
    adjust_joins: bool = _D.adjust_joins
    refuse_margin: float = Field(_D.refuse_margin, ge=0)
    hold_threshold: float = Field(_D.hold_threshold, ge=0)
    due_slack: float = Field(_D.due_slack, ge=0)
    admit_load: float = Field(_D.admit_load, ge=0)
    arrival_window_s: float = Field(_D.arrival_window_s, gt=0, le=L.MAX_ADMIT_WINDOW_S)
    admit_window_s: float = Field(_D.admit_window_s, gt=0, le=L.MAX_ADMIT_WINDOW_S)
    serving_planner: str = Field(_D.serving_planner, max_length=L.MAX_TEXT_CHARS)
    host_to_gpu_mb_per_ms: float = Field(_D.host_to_gpu_mb_per_ms, gt=0)
    node_to_node_mb_per_ms: float = Field(_D.node_to_node_mb_per_ms, gt=0)
    serving_max_fraction: float = Field(_D.serving_max_fraction, gt=0, le=1)
    serving_reserve: float = Field(_D.serving_reserve, ge=0, le=L.MAX_SERVING_RESERVE)
    serving_reserve_min: int = Field(_D.serving_reserve_min, ge=0, le=L.MAX_SERVING_RESERVE_MIN)
    serving_load_window_s: float = Field(
        _D.serving_load_window_s, gt=0, le=L.MAX_SERVING_LOAD_WINDOW_S
    )
    serving_lend_s: float = Field(_D.serving_lend_s, ge=0)
    serving_linger_s: float = Field(_D.serving_linger_s, ge=0)
    node_lost_timeout_s: float = Field(_D.node_lost_timeout_s, gt=0)
    max_stop_warning_s: float = Field(_D.max_stop_warning_s, ge=0, le=L.DAY_S)
    rendezvous_port: int = Field(_D.rendezvous_port, ge=1024, le=65535 - L.MAX_NODE_GPUS)
    # More than a node has GPUs (each gang's part takes one at least): a port is always free.
    rendezvous_ports: int = Field(_D.rendezvous_ports, ge=L.MAX_NODE_GPUS, le=10_000)

    def to_config(self) -> PolicyConfig:
        values = self.model_dump()
        values["gpu_prices"] = tuple(sorted(self.gpu_prices.items()))
        values["serving_mode"] = self.serving_mode.value
        values["serving_cache_model"] = self.serving_cache_model.value
        return PolicyConfig(**values)


def policy_from_mapping(raw: object, source: str) -> PolicyConfig:
    """The policy a parsed file describes (``None``, an empty file: the defaults)."""
    return validate(PolicyFile, {} if raw is None else raw, source).to_config()


def load_policy(path: Path) -> PolicyConfig:
    return policy_from_mapping(read_document(path), str(path))

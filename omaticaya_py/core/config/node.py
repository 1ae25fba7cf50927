"""The settings section every program on a GPU node reads (the agent, its device plugin and DRA
plugin, ``omaticaya mps``): where the GPUs are read from (``OMATICAYA_TRACE``) and the address
their metrics and probe ports bind to (``OMATICAYA_METRICS_ADDRESS``). Each port is the
program's own (``OMATICAYA_METRICS_PORT``, ``OMATICAYA_MPS_METRICS_PORT``). Raises
``ValueError`` (``SettingsError`` through ``load``) on a bad value, naming the variable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from .settings_base import CommonSettings, check_bind_address, check_trace

__all__ = ["NodeSection"]


class NodeSection(CommonSettings):
    """What every node program reads (see the module docstring)."""

    trace: Path | None = Field(
        default=None, description="Read the GPUs from this trace instead of NVML (a replay)."
    )
    metrics_address: str = Field(
        default="0.0.0.0",
        description="Address the metrics and probe ports bind to ('::' for IPv6, and IPv4 too "
        "on a dual-stack host).",
    )

    @field_validator("trace", mode="before")
    @classmethod
    def _empty_trace_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("trace")
    @classmethod
    def _trace_exists(cls, value: Path | None) -> Path | None:
        return check_trace(value)

    @field_validator("metrics_address")
    @classmethod
    def _check_metrics_address(cls, value: str) -> str:
        return check_bind_address(value)

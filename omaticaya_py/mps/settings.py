"""``omaticaya mps``'s settings: the node's plugin sections (``DevicePluginSettings``: which GPUs
are shared, the unit, the enforcement, the MPS folders) and the supervisor's own section,
``MpsSection``. Environment names are ``OMATICAYA_<FIELD>`` in upper case:

- ``OMATICAYA_MPS_CONTROL`` (``nvidia-cuda-mps-control``): the control program, a name on
  ``PATH`` or a path (the image's test stand-in: ``/opt/omaticaya/standin/nvidia-cuda-mps-control``);
- ``OMATICAYA_MPS_CHECK_S`` (2): seconds between checks of the daemons;
- ``OMATICAYA_MPS_START_TIMEOUT_S`` (10): how long a daemon may take to answer;
- ``OMATICAYA_MPS_SHM_MIB`` (1024): each slice's shared-memory tmpfs, MiB (0: a plain folder, no
  mount);
- ``OMATICAYA_MPS_HOST_ROOT`` (empty): where the host's root is seen in this container, when
  not at its own path (``supervisor.Supervisor``'s ``host_root``);
- ``OMATICAYA_MPS_METRICS_PORT`` (9403; 0: off) on ``OMATICAYA_METRICS_ADDRESS`` (``0.0.0.0``);
- ``OMATICAYA_TRACE``: read the GPUs from this trace instead of NVML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from ..core.config.settings import DevicePluginSettings
from ..core.config.settings_base import CommonSettings

__all__ = ["MpsSection", "MpsSettings"]


class MpsSection(CommonSettings):
    """The MPS supervisor's own settings (see the module docstring for the variables and their
    defaults). Raises ``ValueError`` (``SettingsError`` through ``core.config.settings.load``,
    naming the variable) on a bad value."""

    model_config = SettingsConfigDict(env_prefix="OMATICAYA_", populate_by_name=True)

    mps_control: str = Field(
        default="nvidia-cuda-mps-control",
        min_length=1,
        description="The MPS control program `omaticaya mps` runs, one daemon per slice and a "
        "probe per shared GPU: "
        "a name on PATH or a path (the image's test stand-in, for nodes without a GPU: "
        "/opt/omaticaya/standin/nvidia-cuda-mps-control).",
    )
    mps_check_s: float = Field(
        default=2, gt=0, le=3600, description="Seconds between checks of each MPS daemon."
    )
    mps_start_timeout_s: float = Field(
        default=10, gt=0, le=3600, description="How long an MPS daemon may take to answer."
    )
    mps_shm_mib: int = Field(
        default=1024,
        ge=0,
        le=1 << 20,
        description="Size of each slice's shared-memory tmpfs (its MPS daemon's and its "
        "container's /dev/shm: one tenant fills only its own), MiB (0: a plain folder and no "
        "mount, /dev/shm not shared: tests and runs without CAP_SYS_ADMIN).",
    )
    mps_host_root: Path | None = Field(
        default=None,
        description="Where the host's OMATICAYA_MPS_ROOT is seen in this container, when not at "
        "its own path (the chart: /host/run/omaticaya/mps, the host's /run mounted at /host/run): "
        "the folders and the tmpfs are made there and bound at the root's path. Empty: the root "
        "itself.",
    )
    mps_metrics_port: int = Field(
        default=9403,
        ge=0,
        le=65535,
        description="Port of the MPS supervisor's /metrics, /healthz and /readyz (0: off).",
    )

    @field_validator("mps_host_root", mode="before")
    @classmethod
    def _empty_host_root(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("mps_host_root")
    @classmethod
    def _absolute_host_root(cls, value: Path | None) -> Path | None:
        if value is not None and (not value.is_absolute() or ".." in value.parts):
            raise ValueError("expected an absolute folder path without '..', like "
                             "'/host/run/omaticaya/mps' (or empty: the root itself)")
        return value



class MpsSettings(MpsSection, DevicePluginSettings):
    """Every setting of ``omaticaya mps``: its own section (``MpsSection``) and the node's
    plugin sections it shares with the agent (``DevicePluginSettings``)."""

    model_config = SettingsConfigDict(env_prefix="OMATICAYA_", populate_by_name=True)

"""The settings sections of the node's kubelet plugins and of the MPS folders they share.

- ``DevicePluginSection``: whether to serve the GPUs to the kubelet as a device plugin, its
  folder and its device list strategies (``OMATICAYA_DEVICE_PLUGIN*``,
  ``OMATICAYA_DEVICE_LIST_STRATEGY``);
- ``DraSection``: the DRA driver ``gpu.omaticaya.io`` (``OMATICAYA_DRA*``);
- ``MpsPathsSection``: where the MPS daemons and their states live, and how a slice's
  container uses its daemon (``OMATICAYA_MPS_ROOT``, ``_STATE_DIR``, ``_THREAD_SHARE``,
  ``_STALE_S``): the plugins and ``omaticaya mps`` read them alike.

Environment names are ``OMATICAYA_<FIELD>`` in upper case. Raises ``ValueError``
(``SettingsError`` through ``load``) on a bad value, naming the variable.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import NoDecode

from ..allocation.mps import DEFAULT_ROOT as DEFAULT_MPS_ROOT
from ..allocation.mps import DEFAULT_STATE_DIR as DEFAULT_MPS_STATE_DIR
from ..allocation.mps import MAX_ROOT_BYTES as MAX_MPS_ROOT_BYTES
from .settings_base import CommonSettings

__all__ = ["DEVICE_LIST_STRATEGIES", "DevicePluginSection", "DraSection", "MpsPathsSection"]

#: NVIDIA's device list strategies, the ways ``Allocate`` hands a container its GPUs
DEVICE_LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")


def _absolute_dir(value: Path, example: str) -> Path:
    """``value`` when it is an absolute path without ``..``. Raises ``ValueError`` naming the
    form (``example``) otherwise."""
    if not value.is_absolute() or ".." in value.parts:
        raise ValueError(f"expected an absolute folder path without '..', like '{example}'")
    return value


class DevicePluginSection(CommonSettings):
    """The kubelet device plugin (``deviceplugin.config.plugin_config`` reads it)."""

    device_plugin: bool = Field(
        default=False, description="Also serve the GPUs to the kubelet as a device plugin."
    )
    device_plugin_dir: Path = Field(
        default=Path("/var/lib/kubelet/device-plugins"),
        description="The kubelet's device-plugins folder (kubelet.sock and the plugin socket).",
    )
    device_list_strategy: Annotated[tuple[str, ...], NoDecode] = Field(
        default=("envvar", "volume-mounts"),
        description=(
            "How Allocate hands a container its GPUs, any of: envvar, volume-mounts, "
            "cdi-annotations, cdi-cri (comma-separated)."
        ),
    )

    @field_validator("device_list_strategy", mode="before")
    @classmethod
    def _parse_strategy(cls, value: Any) -> tuple[str, ...]:
        parts = re.split(r"[,\s]+", value.strip()) if isinstance(value, str) else list(value)
        parts = [p for p in parts if p]
        if not parts or any(p not in DEVICE_LIST_STRATEGIES for p in parts):
            raise ValueError(
                "expected one or more of " + ", ".join(DEVICE_LIST_STRATEGIES)
                + " separated by commas, like 'envvar,volume-mounts'"
            )
        return tuple(dict.fromkeys(parts))

    @field_validator("device_plugin_dir")
    @classmethod
    def _check_plugin_dir(cls, value: Path) -> Path:
        if not value.is_absolute():
            raise ValueError("expected an absolute folder path, like '/var/lib/kubelet/device-plugins'")
        return value


class DraSection(CommonSettings):
    """The DRA driver gpu.omaticaya.io (``omaticaya_py.dra``, ``core.publish.dra``)."""

    dra: bool = Field(
        default=False,
        description="Serve the GPUs through Dynamic Resource Allocation as the driver "
        "gpu.omaticaya.io (Kubernetes 1.34+): publish this Node's ResourceSlice and run the "
        "kubelet DRA plugin. Instead of OMATICAYA_DEVICE_PLUGIN on a node, not with it.",
    )
    dra_plugin_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins/gpu.omaticaya.io"),
        description="The DRA plugin's own folder: its gRPC socket dra.sock, its health socket "
        "and its checkpoint of prepared claims (under the kubelet's plugins folder).",
    )
    dra_registry_dir: Path = Field(
        default=Path("/var/lib/kubelet/plugins_registry"),
        description="The kubelet's plugin registration folder (the registration socket "
        "gpu.omaticaya.io-reg.sock goes there).",
    )
    dra_cdi_dir: Path = Field(
        default=Path("/var/run/cdi"),
        description="Where the DRA plugin writes a prepared claim's CDI spec (a folder "
        "containerd 2 or CRI-O reads CDI specs from).",
    )
    dra_dev_root: Path = Field(
        default=Path("/dev"),
        description="The host's /dev as the DRA plugin sees it: a CDI spec names the device "
        "nodes (/dev/nvidia<minor>, nvidiactl, nvidia-uvm, nvidia-uvm-tools) found there.",
    )
    dra_taint_effect: Literal["NoSchedule", "NoExecute"] = Field(
        default="NoSchedule",
        description="The effect of the taint on an unhealthy GPU's device in the ResourceSlice: "
        "NoSchedule (no new claim gets it) or NoExecute (also evicts the pods of claims that "
        "have it, unless they tolerate it).",
    )

    dra_driver_files: bool = Field(
        default=True,
        description="Mount the NVIDIA driver's files read-only in every prepared claim's "
        "containers (its libraries of the running version under their SONAME names too, "
        "nvidia-smi and its other binaries, IPC sockets, GSP firmware), as the NVIDIA container "
        "toolkit's CDI generation finds them under OMATICAYA_DRA_DRIVER_ROOT (the program "
        "omaticaya-driver-files, run at start): a container gets its driver from containerd's or "
        "CRI-O's own CDI, with no nvidia runtime or hook. None found: a warning, the gauge "
        "omaticaya_dra_driver_files at 0, and claims get their device nodes and "
        "NVIDIA_VISIBLE_DEVICES only.",
    )
    dra_driver_root: Path = Field(
        default=Path("/"),
        description="The NVIDIA driver's root folder as the DRA plugin sees it (the chart mounts "
        "the host's driverRoot at /host/driver-root): where omaticaya-driver-files looks for the "
        "driver's files.",
    )
    dra_driver_host_root: Path = Field(
        default=Path("/"),
        description="The same folder on the host (/ for a driver installed on the host, "
        "/run/nvidia/driver for the GPU Operator's driver container): the CDI specs' host paths "
        "of the driver's files start with it.",
    )

    @field_validator("dra_plugin_dir", "dra_registry_dir", "dra_cdi_dir", "dra_dev_root")
    @classmethod
    def _check_dra_dir(cls, value: Path) -> Path:
        return _absolute_dir(value, "/var/run/cdi")

    @field_validator("dra_driver_root", "dra_driver_host_root")
    @classmethod
    def _check_driver_root(cls, value: Path) -> Path:
        return _absolute_dir(value, "/run/nvidia/driver")


class MpsPathsSection(CommonSettings):
    """The MPS folders and slice options the plugins and ``omaticaya mps`` share
    (``core.allocation.mps``)."""

    mps_root: Path = Field(
        default=DEFAULT_MPS_ROOT,
        description="Host folder of the MPS daemons: <root>/slices/<slice id>/pipe, /log and "
        "/shm (a slice's daemon and its tmpfs) and <root>/<GPU UUID>/pipe and /log (a GPU's "
        "probe daemon); a slice's pipe folder and tmpfs are mounted in its container.",
    )
    mps_state_dir: Path = Field(
        default=DEFAULT_MPS_STATE_DIR,
        description="Folder where `omaticaya mps` writes each daemon's state and holds its lock, "
        "and the plugins write their slice requests (a host folder the agent and the "
        "supervisor share).",
    )
    mps_thread_share: bool = Field(
        default=False,
        description="Also give each slice container a compute share proportional to its slice "
        "(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = units / GPU units, rounded up).",
    )
    mps_stale_s: float = Field(
        default=15,
        gt=0,
        le=3600,
        description="A daemon's state older than this counts as down (the supervisor writes it "
        "every check).",
    )

    @field_validator("mps_root", "mps_state_dir")
    @classmethod
    def _check_mps_dir(cls, value: Path, info: ValidationInfo) -> Path:
        _absolute_dir(value, "/run/omaticaya/mps")
        if info.field_name == "mps_root" and len(str(value).encode()) > MAX_MPS_ROOT_BYTES:
            raise ValueError(
                f"expected at most {MAX_MPS_ROOT_BYTES} bytes (the daemons' unix sockets are "
                "<root>/<GPU UUID>/pipe/..., and a socket's path is at most 107 bytes), like "
                "'/run/omaticaya/mps'"
            )
        return value

"""What the device plugins of a node are configured with: one ``PluginConfig``, made from the
settings once (``plugin_config``), and the small parts it groups.

``PluginConfig`` holds every plugin's resource names, folder and device list strategies, the
sharing by memory (``SharingConfig``), the timing (``Timing``) and the devices known before the
first reading (a trace's); ``Scope`` says which of the node's devices one plugin serves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..core.allocation.mps import Layout
from ..core.allocation.placement import DEFAULT_POLICY
from ..core.config.settings import Settings, stuck_after_s
from ..core.model.sharing import DEFAULT_SHARED_RESOURCE, DEFAULT_UNIT_MIB, SharedGpus
from .allocation import DEFAULT_PLUGIN_DIR, trace_slices, trace_units
from .strategies import DEFAULT_STRATEGIES

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULT_SETTLE_S",
    "DEFAULT_TIMING",
    "INDICES_FILE",
    "MpsConfig",
    "PluginConfig",
    "Scope",
    "SharingConfig",
    "Timing",
    "plugin_config",
]

#: the whole-GPU resource by default (``OMATICAYA_DEVICE_PLUGIN_RESOURCE``)
DEFAULT_RESOURCE = "nvidia.com/gpu"
#: each GPU's NVML index -> UUID at the plugins' last start, in ``PluginConfig.plugin_dir``
#: (the kubelet's device-plugins folder: a kubelet that restarts removes only its sockets)
INDICES_FILE = "omaticaya-gpu-indices.json"
#: how long a slice counts against its GPU's live free memory when the reading never shows it
DEFAULT_SETTLE_S = 60.0


@dataclass(frozen=True, slots=True)
class Timing:
    """How a plugin keeps time, seconds: ``poll_s``, how often ``ListAndWatch`` streams look at
    the cache besides each tick's wake-up; ``resync_s``, how often the registration is checked
    besides the folder's events; ``first_read_timeout_s``, how long serving waits for the agent's
    first reading; ``stale_after_s``, every device is Unhealthy (``stale-reading``) while the
    reading served is older than this (``None``: off; ``plugin_config``:
    ``core.config.settings.stuck_after_s``), on ``clock`` (monotonic seconds; slices are timed on it
    too)."""

    poll_s: float = 0.2
    resync_s: float = 5.0
    first_read_timeout_s: float = 30.0
    stale_after_s: float | None = None
    clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True, slots=True)
class MpsConfig:
    """Slices enforced by CUDA MPS (``OMATICAYA_SHARE_ENFORCEMENT=mps``): the daemons' ``layout``
    (``core.allocation.mps.Layout``: ``OMATICAYA_MPS_ROOT``, ``OMATICAYA_MPS_STATE_DIR``); a daemon whose
    state is older than ``stale_s`` seconds counts as down (``OMATICAYA_MPS_STALE_S``); with
    ``thread_share`` a slice also gets a compute share (``OMATICAYA_MPS_THREAD_SHARE``);
    ``slice_wait_s``: how long ``Allocate`` (and DRA's prepare) waits for a slice's daemon to
    come up before refusing the slice (the supervisor's start timeout, 10 s, and a margin)."""

    layout: Layout = Layout()
    stale_s: float = 15.0
    thread_share: bool = False
    slice_wait_s: float = 15.0


@dataclass(frozen=True, slots=True)
class SharingConfig:
    """GPU sharing by memory: the ``shared`` GPUs (``OMATICAYA_SHARED_GPUS``; none by default)
    are served as ``resource_name`` (``OMATICAYA_SHARED_RESOURCE``), one unit device per
    ``unit_mib`` MiB (``OMATICAYA_SHARE_UNIT_MIB``); a slice's GPU is chosen by ``policy``
    (``OMATICAYA_PLACEMENT_POLICY``: ``binpack`` or ``spread``, ``core.allocation.placement``), and a slice
    counts unseen for at most ``settle_s`` seconds (``OMATICAYA_SHARE_SETTLE_S``). ``mps``: what
    enforces a slice (``MpsConfig``; ``None``: nothing, the limit is only in the container's
    environment)."""

    shared: SharedGpus = SharedGpus()
    resource_name: str = DEFAULT_SHARED_RESOURCE
    unit_mib: int = DEFAULT_UNIT_MIB
    policy: str = DEFAULT_POLICY
    settle_s: float = DEFAULT_SETTLE_S
    mps: MpsConfig | None = None


@dataclass(frozen=True, slots=True)
class Scope:
    """Which devices one plugin serves: the MIG devices of ``profile`` (``1g.10gb``), else whole
    GPUs; of those, the ``shared`` GPUs' units when ``units`` (the shared resource), else the GPUs
    not shared (MIG devices are never shared)."""

    profile: str | None = None
    shared: SharedGpus = SharedGpus()
    units: bool = False


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """Every device plugin of a node: whole GPUs as ``resource_name`` (``nvidia.com/gpu``), each
    MIG profile beside it (``nvidia.com/mig-<profile>``), the shared GPUs' units
    (``sharing``), all served in ``plugin_dir`` (the kubelet's device-plugins folder) and handed
    to containers by ``strategies`` (NVIDIA's device list strategies, ``strategies.py``).

    ``units``: the devices known before the first reading, by MIG profile (``None``: whole
    GPUs), each ``(GPU index, UUID)``; ``shared_units``: ``(GPU index, unit ID)`` of the shared
    GPUs' units known so (a trace's). A device known so that is gone or unreadable stays
    listed, as Unhealthy."""

    resource_name: str = DEFAULT_RESOURCE
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    sharing: SharingConfig = SharingConfig()
    timing: Timing = Timing()
    units: Mapping[str | None, Sequence[tuple[int, str]]] = field(default_factory=dict)
    shared_units: Sequence[tuple[int, str]] = ()

    @property
    def indices_file(self) -> Path:
        """``<plugin_dir>/omaticaya-gpu-indices.json``: each GPU's NVML index -> UUID at the
        last start (``sources.gpu_indices``), compared at each start to report a shared index
        that names another GPU now."""
        return Path(self.plugin_dir) / INDICES_FILE


def plugin_config(settings: Settings) -> PluginConfig:
    """The plugins' configuration from the settings (their device-plugin section,
    ``core.config.settings.DevicePluginSettings``, and the agent's stuck-tick bound,
    ``core.config.settings.stuck_after_s``, as ``Timing.stale_after_s``); with a trace, its devices
    (whole GPUs not shared, MIG devices by profile, the shared GPUs' units) are known from the
    start."""
    mps = None
    if settings.share_enforcement == "mps":
        mps = MpsConfig(Layout(settings.mps_root, settings.mps_state_dir), settings.mps_stale_s,
                        settings.mps_thread_share)  # fmt: skip
    sharing = SharingConfig(
        settings.shared_gpus, settings.shared_resource, settings.share_unit_mib,
        settings.placement_policy, settings.settle_s, mps,
    )  # fmt: skip
    units: dict[str | None, list[tuple[int, str]]] = {}
    shared_units: list[tuple[int, str]] = []
    if settings.trace is not None:
        units = trace_units(settings.trace)
        units[None] = [d for d in units.get(None, []) if not sharing.shared.shares(d[0], d[1])]
        shared_units = trace_slices(settings.trace, sharing.shared, sharing.unit_mib)
    return PluginConfig(
        resource_name=settings.device_plugin_resource,
        plugin_dir=settings.device_plugin_dir,
        strategies=tuple(settings.device_list_strategy),
        sharing=sharing,
        timing=Timing(stale_after_s=stuck_after_s(settings)),
        units=units,
        shared_units=shared_units,
    )


#: the defaults, as one value each (a default argument is built once)
DEFAULT_TIMING = Timing()
DEFAULT_CONFIG = PluginConfig()

"""One kubelet device plugin (API ``v1beta1``): a resource's devices, served and registered over gRPC."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..core.readings import AgentFeed
from ..core.settings import Settings, stuck_after_s
from ..core.sharing import SharedGpus
from .allocation import DEFAULT_PLUGIN_DIR, socket_name_for, trace_devices
from .registration import KubeletRegistration
from .service import NOT_SHARED, DeviceService
from .slicer import DEFAULT_SETTLE_S
from .strategies import DEFAULT_STRATEGIES


class DevicePlugin(DeviceService, KubeletRegistration):
    """The device plugin servicer (``service.DeviceService``) and its registration with the
    kubelet (``registration.KubeletRegistration``).

    - ``source``: what it reads from the agent (``core.readings.AgentFeed``: an ``Agent``), or
      ``service.CacheFeed`` over a bare cache (``.last`` the latest ``TickResult``) ticked by
      someone else.
    - ``resource_name``: the extended resource (``nvidia.com/gpu``).
    - ``plugin_dir``: the kubelet's device-plugins folder (``kubelet.sock`` is in it, and the
      plugin's socket goes in it); ``socket_name``: the plugin's socket there (by default
      derived from ``resource_name``).
    - ``devices``: ``(index, uuid)`` known before the first reading (a trace's GPUs), so a GPU
      that is gone or unreadable stays listed, as Unhealthy.
    - ``profile``: ``None`` serves whole GPUs (MIG off); a MIG profile (``1g.10gb``) serves the
      MIG devices of that profile (``resource_name`` is then ``nvidia.com/mig-1g.10gb``).
    - ``poll_s``: how often streams look at the cache; ``resync_s``: how often the registration
      is checked besides the folder events; ``first_read_timeout_s``: how long serving waits
      for the agent's first reading.
    - ``stale_after_s``: every device is Unhealthy while the reading is older than this, on
      ``clock`` (``None``: off; ``from_settings`` sets it: ``core.settings.stuck_after_s``).
    - ``strategies``: NVIDIA's device list strategies ``Allocate`` answers by
      (``strategies.container_response``; ``from_settings``: ``OMATICAYA_DEVICE_LIST_STRATEGY``).
    - ``shared``, ``unit_mib``, ``policy``, ``settle_s``: GPU sharing by memory (see
      ``service.DeviceService``): the whole-GPU resource leaves the ``shared`` GPUs out; with
      ``unit_mib`` this plugin serves their units (``DevicePluginSet`` makes that one).

    ``start()`` serves and registers in a background thread; ``stop()`` undoes it.
    """

    def __init__(
        self,
        source: AgentFeed,
        *,
        resource_name: str = "nvidia.com/gpu",
        plugin_dir: Path | str = DEFAULT_PLUGIN_DIR,
        socket_name: str | None = None,
        devices: Iterable[tuple[int, str]] = (),
        profile: str | None = None,
        poll_s: float = 0.2,
        resync_s: float = 5.0,
        first_read_timeout_s: float = 30.0,
        stale_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        strategies: Sequence[str] = DEFAULT_STRATEGIES,
        shared: SharedGpus = NOT_SHARED,
        unit_mib: int | None = None,
        policy: str = "binpack",
        settle_s: float = DEFAULT_SETTLE_S,
    ) -> None:
        DeviceService.__init__(
            self, source, devices=devices, profile=profile, poll_s=poll_s,
            stale_after_s=stale_after_s, clock=clock, strategies=strategies,
            shared=shared, unit_mib=unit_mib, policy=policy, settle_s=settle_s,
        )
        KubeletRegistration.__init__(
            self,
            resource_name=resource_name,
            plugin_dir=Path(plugin_dir),
            socket_name=socket_name or socket_name_for(resource_name),
            resync_s=resync_s,
            first_read_timeout_s=first_read_timeout_s,
        )

    @classmethod
    def from_settings(cls, source: AgentFeed, settings: Settings, **kwargs: Any) -> DevicePlugin:
        """A plugin configured by ``OMATICAYA_DEVICE_PLUGIN_*``; with a trace, its GPUs are the
        devices from the start; devices turn Unhealthy when the reading is older than
        ``core.settings.stuck_after_s(settings)``, the agent's stuck-tick bound."""
        kwargs.setdefault("stale_after_s", stuck_after_s(settings))
        kwargs.setdefault("strategies", settings.device_list_strategy)
        kwargs.setdefault("shared", settings.shared_gpus)
        devices = kwargs.pop("devices", None)
        if devices is None and settings.trace is not None:
            devices = [d for d in trace_devices(settings.trace) if d[0] not in settings.shared_gpus]
        return cls(
            source,
            resource_name=settings.device_plugin_resource,
            plugin_dir=settings.device_plugin_dir,
            devices=devices or (),
            **kwargs,
        )

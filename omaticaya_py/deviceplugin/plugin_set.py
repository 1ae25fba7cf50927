"""Every resource of the node: whole GPUs, each MIG profile (NVIDIA's ``mixed`` strategy) and the memory units of shared GPUs, one plugin each."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from loguru import logger

from ..core.readings import AgentFeed, TickResult
from ..core.settings import Settings, stuck_after_s
from ..core.sharing import DEFAULT_SHARED_RESOURCE
from .allocation import (
    DEFAULT_PLUGIN_DIR,
    mig_resource_name,
    trace_slices,
    trace_units,
)
from .plugin import DevicePlugin
from .slicer import DEFAULT_SETTLE_S


class DevicePluginSet:
    """One ``DevicePlugin`` per resource: whole GPUs (``nvidia.com/gpu``, always served) and
    one per MIG profile seen (``nvidia.com/mig-<profile>``), NVIDIA's ``mixed`` strategy.

    Same lifecycle as one plugin: ``start()``, ``stop()``. Profiles come from the trace (known
    at start) and from every tick's units (a profile new since start gets its plugin then); a
    profile plugin with no device left (its MIG devices left the reading: the layout was
    re-created or MIG turned off) sends the kubelet an empty list, stops and removes its socket.
    ``plugins`` maps the profile (``None`` for whole GPUs, always served) to its plugin.

    Sharing by memory: with ``shared`` GPUs (``OMATICAYA_SHARED_GPUS``) and ``unit_mib``, one
    more plugin, ``shared_plugin``, serves ``shared_resource`` (``omaticaya.io/gpu-memory``):
    the units of every shared GPU (``shared_units``: unit IDs known before the first reading,
    a trace's), placed by ``policy`` with ``settle_s`` (``slicer.Slicer``); the whole-GPU
    plugin leaves those GPUs out, so no GPU is served both whole and in units. MIG-enabled
    GPUs are never shared (their MIG devices are served by profile).
    """

    def __init__(
        self,
        source: AgentFeed,
        *,
        resource_name: str = "nvidia.com/gpu",
        plugin_dir: Path | str = DEFAULT_PLUGIN_DIR,
        units: dict[str | None, list[tuple[int, str]]] | None = None,
        shared_resource: str = DEFAULT_SHARED_RESOURCE,
        unit_mib: int | None = None,
        shared_units: Iterable[tuple[int, str]] = (),
        policy: str = "binpack",
        settle_s: float = DEFAULT_SETTLE_S,
        **kwargs: Any,
    ) -> None:
        self._source = source
        self.resource_name = resource_name
        self.plugin_dir = plugin_dir
        self._kwargs = kwargs
        self._lock = threading.Lock()
        self._started = False
        self.plugins: dict[str | None, DevicePlugin] = {}
        #: profile plugins stopped when their devices left, started again if the profile comes
        #: back (at most one per profile name ever seen)
        self._stopped: dict[str | None, DevicePlugin] = {}
        units = dict(units or {})
        units.setdefault(None, [])
        for profile, devices in units.items():
            self._add(profile, devices)
        self.shared_plugin: DevicePlugin | None = None
        if kwargs.get("shared") and unit_mib:
            self.shared_plugin = DevicePlugin(
                source,
                resource_name=shared_resource,
                plugin_dir=plugin_dir,
                devices=shared_units,
                unit_mib=unit_mib,
                policy=policy,
                settle_s=settle_s,
                **kwargs,
            )

    @classmethod
    def from_settings(cls, source: AgentFeed, settings: Settings, **kwargs: Any) -> DevicePluginSet:
        """Plugins configured by ``OMATICAYA_DEVICE_PLUGIN_*``; with a trace, its devices are
        known from the start; devices turn Unhealthy when the reading is older than
        ``core.settings.stuck_after_s(settings)``, the agent's stuck-tick bound."""
        kwargs.setdefault("stale_after_s", stuck_after_s(settings))
        kwargs.setdefault("strategies", settings.device_list_strategy)
        kwargs.setdefault("shared", settings.shared_gpus)
        kwargs.setdefault("policy", settings.share_policy)
        kwargs.setdefault("settle_s", settings.share_settle_s)
        units, shared_units = None, []
        if settings.trace is not None:
            units = trace_units(settings.trace)
            units[None] = [d for d in units.get(None, []) if d[0] not in kwargs["shared"]]
            shared_units = trace_slices(settings.trace, kwargs["shared"], settings.share_unit_mib)
        return cls(
            source,
            resource_name=settings.device_plugin_resource,
            plugin_dir=settings.device_plugin_dir,
            units=units,
            shared_resource=settings.shared_resource,
            unit_mib=settings.share_unit_mib,
            shared_units=shared_units,
            **kwargs,
        )

    def _add(self, profile: str | None, devices: Iterable[tuple[int, str]] = ()) -> DevicePlugin:
        name = self.resource_name if profile is None else mig_resource_name(self.resource_name, profile)
        plugin = DevicePlugin(
            self._source,
            resource_name=name,
            plugin_dir=self.plugin_dir,
            devices=devices,
            profile=profile,
            **self._kwargs,
        )
        self.plugins[profile] = plugin
        return plugin

    def _on_tick(self, result: TickResult) -> None:
        """Start a plugin for each MIG profile the tick shows for the first time; stop each
        profile plugin that has no device left."""
        profiles = {p for u in result.health.units if u.is_mig and (p := u.profile)}
        with self._lock:
            if not self._started:
                return
            for new in sorted(profiles - set(self.plugins), key=str):
                logger.info("device plugin: MIG profile {} appeared: serving it", new)
                again = self._stopped.pop(new, None)
                if again is not None:
                    self.plugins[new] = again
                (again or self._add(new)).start()
            for profile, plugin in list(self.plugins.items()):
                if profile is None or profile in profiles or plugin.devices():
                    continue
                logger.info("device plugin: MIG profile {} left: no longer served", profile)
                self._stopped[profile] = self.plugins.pop(profile)
                plugin.stop()  # its streams send the empty list first

    def _every(self) -> list[DevicePlugin]:
        """The plugins serving now: whole GPUs, MIG profiles, the shared resource."""
        plugins = list(self.plugins.values())
        return plugins + [self.shared_plugin] if self.shared_plugin is not None else plugins

    def start(self) -> None:
        """Start every plugin; follow the ticks for new MIG profiles."""
        with self._lock:
            self._started = True
            for plugin in self._every():
                plugin.start()
        listeners = self._source.on_tick
        if self._on_tick not in listeners:
            listeners.append(self._on_tick)
        last = self._source.cache.last
        if last is not None:
            self._on_tick(last)

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop every plugin."""
        with self._lock:
            self._started = False
            plugins = self._every()
        for plugin in plugins:
            plugin.stop(grace_s)

    def notify(self) -> None:
        """Wake every plugin's streams."""
        for plugin in self._every():
            plugin.notify()

    def wait_registered(self, timeout_s: float) -> bool:
        """True once every plugin started so far has registered with the kubelet."""
        deadline = time.monotonic() + timeout_s
        return all(
            p.wait_registered(max(deadline - time.monotonic(), 0.0))
            for p in self._every()
        )

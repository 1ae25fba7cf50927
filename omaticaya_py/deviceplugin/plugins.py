"""Every resource of the node: whole GPUs and each MIG profile, one plugin each (NVIDIA's ``mixed`` strategy)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from loguru import logger

from ..core.settings import Settings
from .allocation import DEFAULT_PLUGIN_DIR, mig_resource_name, stale_after_s, trace_units
from .plugin import DevicePlugin


class DevicePluginSet:
    """One ``DevicePlugin`` per resource: whole GPUs (``nvidia.com/gpu``, always served) and
    one per MIG profile seen (``nvidia.com/mig-<profile>``), NVIDIA's ``mixed`` strategy.

    Same lifecycle as one plugin: ``start()``, ``stop()``. Profiles come from the trace (known
    at start) and from every tick's units (a profile new since start gets its plugin then); a
    profile plugin with no device left (its MIG devices left the reading: the layout was
    re-created or MIG turned off) sends the kubelet an empty list, stops and removes its socket.
    ``plugins`` maps the profile (``None`` for whole GPUs, always served) to its plugin.
    """

    def __init__(
        self,
        source: Any,
        *,
        resource_name: str = "nvidia.com/gpu",
        plugin_dir: Path | str = DEFAULT_PLUGIN_DIR,
        units: dict[str | None, list[tuple[int, str]]] | None = None,
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

    @classmethod
    def from_settings(cls, source: Any, settings: Settings, **kwargs: Any) -> DevicePluginSet:
        """Plugins configured by ``OMATICAYA_DEVICE_PLUGIN_*``; with a trace, its devices are
        known from the start; devices turn Unhealthy when the reading is older than
        ``allocation.stale_after_s(settings)``."""
        kwargs.setdefault("stale_after_s", stale_after_s(settings))
        kwargs.setdefault("strategies", settings.device_list_strategy)
        units = trace_units(settings.trace) if settings.trace is not None else None
        return cls(
            source,
            resource_name=settings.device_plugin_resource,
            plugin_dir=settings.device_plugin_dir,
            units=units,
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

    def _on_tick(self, result: Any) -> None:
        """Start a plugin for each MIG profile the tick shows for the first time; stop each
        profile plugin that has no device left."""
        health = getattr(result, "health", None)
        profiles = {u.profile for u in getattr(health, "units", ()) if u.is_mig and u.profile}
        with self._lock:
            if not self._started:
                return
            for profile in sorted(profiles - set(self.plugins), key=str):
                logger.info("device plugin: MIG profile {} appeared: serving it", profile)
                again = self._stopped.pop(profile, None)
                if again is not None:
                    self.plugins[profile] = again
                (again or self._add(profile)).start()
            for profile, plugin in list(self.plugins.items()):
                if profile is None or profile in profiles or plugin.devices():
                    continue
                logger.info("device plugin: MIG profile {} left: no longer served", profile)
                self._stopped[profile] = self.plugins.pop(profile)
                plugin.stop()  # its streams send the empty list first

    def start(self) -> None:
        """Start every plugin; follow the ticks for new MIG profiles."""
        with self._lock:
            self._started = True
            for plugin in self.plugins.values():
                plugin.start()
        listeners = getattr(self._source, "on_tick", None)
        if isinstance(listeners, list) and self._on_tick not in listeners:
            listeners.append(self._on_tick)
        last = getattr(getattr(self._source, "cache", self._source), "last", None)
        if last is not None:
            self._on_tick(last)

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop every plugin."""
        with self._lock:
            self._started = False
            plugins = list(self.plugins.values())
        for plugin in plugins:
            plugin.stop(grace_s)

    def notify(self) -> None:
        """Wake every plugin's streams."""
        for plugin in list(self.plugins.values()):
            plugin.notify()

    def wait_registered(self, timeout_s: float) -> bool:
        """True once every plugin started so far has registered with the kubelet."""
        deadline = time.monotonic() + timeout_s
        return all(
            p.wait_registered(max(deadline - time.monotonic(), 0.0))
            for p in list(self.plugins.values())
        )

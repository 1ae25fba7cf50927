"""Every resource of the node: whole GPUs, each MIG profile (NVIDIA's ``mixed`` strategy) and the memory units of shared GPUs, one plugin each."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from loguru import logger

from ..core.readings import AgentFeed, TickResult
from ..core.settings import Settings
from .config import DEFAULT_CONFIG, PluginConfig, plugin_config
from .plugin import DevicePlugin

__all__ = ["DevicePluginSet"]


class DevicePluginSet:
    """One ``DevicePlugin`` per resource: whole GPUs (``config.resource_name``, always served)
    and one per MIG profile seen (``nvidia.com/mig-<profile>``), NVIDIA's ``mixed`` strategy.

    Same lifecycle as one plugin: ``start()``, ``stop()``. Profiles come from ``config.units``
    (known at start: a trace's) and from every tick's units (a profile new since start gets its
    plugin then); a profile plugin with no device left (its MIG devices left the reading: the
    layout was re-created or MIG turned off) sends the kubelet an empty list, stops and removes
    its socket. ``plugins`` maps the profile (``None`` for whole GPUs) to its plugin.

    Sharing by memory: with shared GPUs (``config.sharing.shared``, ``OMATICAYA_SHARED_GPUS``)
    one more plugin, ``shared_plugin``, serves their units as ``config.sharing.resource_name``
    (``omaticaya.io/gpu-memory``; ``slicer.Slicer``); the whole-GPU plugin leaves those GPUs out,
    so no GPU is served both whole and in units. MIG-enabled GPUs are never shared (their MIG
    devices are served by profile).
    """

    def __init__(self, source: AgentFeed, config: PluginConfig = DEFAULT_CONFIG) -> None:
        self._source = source
        self.config = config
        self.resource_name = config.resource_name
        self.plugin_dir = config.plugin_dir
        self._lock = threading.Lock()
        self._started = False
        self.plugins: dict[str | None, DevicePlugin] = {}
        #: profile plugins stopped when their devices left, started again if the profile comes
        #: back (at most one per profile name ever seen)
        self._stopped: dict[str | None, DevicePlugin] = {}
        for profile in dict.fromkeys([None, *config.units]):
            self._add(profile, None)
        self.shared_plugin: DevicePlugin | None = (
            DevicePlugin(source, config, units=True) if config.sharing.shared else None
        )

    @classmethod
    def from_settings(cls, source: AgentFeed, settings: Settings) -> DevicePluginSet:
        """The plugins the settings configure (``config.plugin_config``: the device-plugin
        section, ``OMATICAYA_DEVICE_PLUGIN_*`` and sharing; with a trace, its devices known
        from the start; devices Unhealthy once the reading is older than
        ``core.settings.stuck_after_s(settings)``, the agent's stuck-tick bound)."""
        return cls(source, plugin_config(settings))

    def _add(self, profile: str | None, devices: Iterable[tuple[int, str]] | None = ()
             ) -> DevicePlugin:  # fmt: skip
        """A plugin for ``profile`` (``None``: whole GPUs) with ``devices`` known (``None``: those
        of ``config``), kept in ``plugins``."""
        plugin = DevicePlugin(self._source, self.config, profile=profile, devices=devices)
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

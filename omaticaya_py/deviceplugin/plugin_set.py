"""Every resource of the node: whole GPUs, each MIG profile (NVIDIA's ``mixed`` strategy) and the memory units of shared GPUs, one plugin each."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable

from loguru import logger

from ..core.config.settings import Settings
from ..core.model.sharing import IndexMoved
from ..core.publish.readings import AgentFeed, TickResult
from ..kube.index_moved import post_index_moved
from ..kube.session import ApiSession
from ..kubeletplugin import IndexCheck
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

    GPU indices across starts: at the first readable reading after ``start()`` (on the tick
    that brings it, before any plugin's listener sees it) each GPU's NVML index -> UUID is
    compared with the last start's (``config.indices_file``,
    ``<plugin_dir>/omaticaya-gpu-indices.json``; ``check_indices``: ``kubeletplugin.IndexCheck``,
    the DRA plugin's step): an
    ``OMATICAYA_SHARED_GPUS`` index that names another GPU now is a warning log line, ``moved``
    (the gauge ``omaticaya_shared_gpu_index_moved``, ``kube.index_moved.MovedGauge``) and, with
    ``report`` (``from_settings``: the Warning Event ``SharedGpuIndexMoved`` on the Node),
    ``report(moved)`` for each, called on a thread of its own (no API request on the tick's
    thread). Sharing follows the index, as configured (the DRA plugin's rule): the GPU now at
    that index is served in units, the one that was there is served whole.
    """

    def __init__(self, source: AgentFeed, config: PluginConfig = DEFAULT_CONFIG, *,
                 report: Callable[[IndexMoved], object] | None = None) -> None:  # fmt: skip
        self._source = source
        self.config = config
        self._report = report
        #: the shared indices that name another GPU than at the last start (``check_indices``)
        self.moved: tuple[IndexMoved, ...] = ()
        self._indices = IndexCheck(config.indices_file, config.sharing.shared, "device plugin")
        self._reporter: threading.Thread | None = None
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
    def from_settings(cls, source: AgentFeed, settings: Settings,
                      session: ApiSession | None = None) -> DevicePluginSet:  # fmt: skip
        """The plugins the settings configure (``config.plugin_config``: the device-plugin
        section, ``OMATICAYA_DEVICE_PLUGIN_*`` and sharing; with a trace, its devices known
        from the start; devices Unhealthy once the reading is older than
        ``core.config.settings.stuck_after_s(settings)``, the agent's stuck-tick bound).

        A moved shared index is posted as the Event ``SharedGpuIndexMoved`` on Node
        ``settings.node_name`` through ``session`` (by default the session of ``source.node``,
        the ``agent.Agent``'s Node client under ``omaticaya run``); with no session or no node
        name (``omaticaya device-plugin``) it is a log line and the gauge only."""
        if session is None:
            session = getattr(getattr(source, "node", None), "session", None)
        report = None
        if session is not None and settings.node_name:
            report = functools.partial(_post, session, settings.node_name)
        return cls(source, plugin_config(settings), report=report)

    @property
    def indices_checked(self) -> bool:
        """Whether this start's first readable reading was compared (``check_indices``)."""
        return self._indices.done

    def check_indices(self) -> tuple[IndexMoved, ...] | None:
        """Once per start, at the first readable reading (``cache.last``, NVML readable):
        compare each GPU's NVML index -> UUID (``core.model.sharing.gpu_indices``:
        ``nvmlDeviceGetIndex``/``nvmlDeviceGetUUID``) with the last start's
        (``config.indices_file``) by ``kubeletplugin.IndexCheck``, the DRA plugin's step (a
        warning log line for each shared index that names another GPU; this start's map
        written), set ``moved`` and hand each to ``report`` on a thread of its own. Returns
        what moved, or ``None`` before a readable reading (and once done). Never raises."""
        return self._indices(self._source.cache.last, self._record_moved)

    def _record_moved(self, moved: tuple[IndexMoved, ...]) -> None:
        """``moved`` kept, and each handed to ``report`` on a thread of its own (no API request
        on the tick's thread)."""
        self.moved = moved
        if moved and self._report is not None:
            report = self._report
            self._reporter = threading.Thread(
                target=lambda: [report(m) for m in moved], name="device-plugin-index-moved",
                daemon=True,
            )  # fmt: skip
            self._reporter.start()

    def _add(self, profile: str | None, devices: Iterable[tuple[int, str]] | None = ()
             ) -> DevicePlugin:  # fmt: skip
        """A plugin for ``profile`` (``None``: whole GPUs) with ``devices`` known (``None``: those
        of ``config``), kept in ``plugins``."""
        plugin = DevicePlugin(self._source, self.config, profile=profile, devices=devices)
        self.plugins[profile] = plugin
        return plugin

    def _on_tick(self, result: TickResult) -> None:
        """Compare the GPU indices (``check_indices``) at the first readable reading; start a
        plugin for each MIG profile the tick shows for the first time; stop each profile plugin
        that has no device left."""
        if not self.indices_checked:
            self.check_indices()
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
        """Compare the GPU indices with the last start's when a reading is there
        (``check_indices``; else on the first readable tick, before the plugins' own listeners),
        start every plugin; follow the ticks for new MIG profiles."""
        listeners = self._source.on_tick
        if self._on_tick not in listeners:
            listeners.append(self._on_tick)  # before the plugins' own: it compares first
        self.check_indices()
        with self._lock:
            self._started = True
            for plugin in self._every():
                plugin.start()
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


def _post(session: ApiSession, node: str, moved: IndexMoved) -> bool:
    """``kube.index_moved.post_index_moved`` for the device plugin."""
    return post_index_moved(session, node, moved, "device plugin")

"""One kubelet device plugin (API ``v1beta1``): a resource's devices, served and registered over gRPC."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from loguru import logger
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from ..core.health import Unit
from ..core.settings import Settings
from .allocation import (
    API_VERSION,
    DEFAULT_PLUGIN_DIR,
    KUBELET_SOCKET,
    VISIBLE_DEVICES_ENV,
    DeviceState,
    preferred,
    socket_name_for,
    trace_devices,
)
from .v1beta1 import api_pb2, api_pb2_grpc


class _FolderHandler(FileSystemEventHandler):
    """Wakes the plugin when ``kubelet.sock`` is (re)created or our socket is removed."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin

    def _name(self, path: Any) -> str:
        return os.path.basename(os.fsdecode(path))

    def on_created(self, event: FileSystemEvent) -> None:
        if self._name(event.src_path) == KUBELET_SOCKET:
            self.plugin._kubelet_changed()

    def on_deleted(self, event: FileSystemEvent) -> None:
        if self._name(event.src_path) in (KUBELET_SOCKET, self.plugin.socket_name):
            self.plugin._kick.set()

    def on_moved(self, event: FileSystemEvent) -> None:
        if self._name(getattr(event, "dest_path", "")) == KUBELET_SOCKET:
            self.plugin._kubelet_changed()


class DevicePlugin(api_pb2_grpc.DevicePluginServicer):
    """The device plugin servicer and its registration with the kubelet.

    - ``source``: an ``Agent`` (its ``.cache`` is used) or a ``SnapshotCache`` (``.last`` is
      the latest ``TickResult``), ticked by someone else.
    - ``resource_name``: the extended resource (``nvidia.com/gpu``).
    - ``plugin_dir``: the kubelet's device-plugins folder (``kubelet.sock`` is in it, and the
      plugin's socket goes in it).
    - ``devices``: ``(index, uuid)`` known before the first reading (a trace's GPUs), so a GPU
      that is gone or unreadable stays listed, as Unhealthy.
    - ``profile``: ``None`` serves whole GPUs (MIG off); a MIG profile (``1g.10gb``) serves the
      MIG devices of that profile (``resource_name`` is then ``nvidia.com/mig-1g.10gb``).
    - ``poll_s``: how often streams look at the cache; ``resync_s``: how often the registration
      is checked besides the folder events.

    ``start()`` serves and registers in a background thread; ``stop()`` undoes it.
    """

    def __init__(
        self,
        source: Any,
        *,
        resource_name: str = "nvidia.com/gpu",
        plugin_dir: Path | str = DEFAULT_PLUGIN_DIR,
        socket_name: str | None = None,
        devices: Iterable[tuple[int, str]] = (),
        profile: str | None = None,
        poll_s: float = 0.2,
        resync_s: float = 5.0,
        first_read_timeout_s: float = 30.0,
    ) -> None:
        self._source = source
        # on real NVML the agent's reader knows the PCIe/NVLink topology between two GPUs
        self._topology = getattr(getattr(source, "reader", None), "topology_level", None)
        self._cache = getattr(source, "cache", source)
        self.resource_name = resource_name
        self.plugin_dir = Path(plugin_dir)
        self.socket_name = socket_name or socket_name_for(resource_name)
        self.socket_path = self.plugin_dir / self.socket_name
        self.kubelet_socket = self.plugin_dir / KUBELET_SOCKET
        self.poll_s = poll_s
        self.resync_s = resync_s
        self.first_read_timeout_s = first_read_timeout_s
        self.profile = profile
        self._known: dict[str, int] = {uuid: index for index, uuid in devices}
        self._lock = threading.Lock()
        self._changed = threading.Condition()
        self._kick = threading.Event()
        self._stopping = threading.Event()
        self._server: grpc.Server | None = None
        self._thread: threading.Thread | None = None
        self._observer: Any = None
        self._registered_to: tuple[int, int] | None = None
        self._logged: dict[str, bool] = {}
        self.registrations = 0
        self.serves = 0
        self.refusals = 0  # Allocate / PreStartContainer calls refused (unknown or unhealthy)

    @classmethod
    def from_settings(cls, source: Any, settings: Settings, **kwargs: Any) -> DevicePlugin:
        """A plugin configured by ``OMATICAYA_DEVICE_PLUGIN_*``; with a trace, its GPUs are the
        devices from the start."""
        devices = kwargs.pop("devices", None)
        if devices is None and settings.trace is not None:
            devices = trace_devices(settings.trace)
        return cls(
            source,
            resource_name=settings.device_plugin_resource,
            plugin_dir=settings.device_plugin_dir,
            devices=devices or (),
            **kwargs,
        )

    # -- the devices, from the agent's cache ----------------------------------------------

    def devices(self) -> list[DeviceState]:
        """Every known GPU with its health from the latest reading, in index order."""
        last = self._cache.last
        with self._lock:
            if last is None:
                states = [
                    DeviceState(uuid, index, False, ("no-reading",))
                    for uuid, index in self._known.items()
                ]
                return sorted(states, key=lambda s: (s.index, s.id))
            snapshot, health = last.snapshot, last.health
            by_index = {index: uuid for uuid, index in self._known.items()}
            units: dict[str, Unit] = {}
            for unit in health.units:
                if unit.profile != self.profile or unit.is_mig != (self.profile is not None):
                    continue  # another plugin's resource
                uuid = unit.uuid or (None if unit.is_mig else by_index.get(unit.gpu_index))
                if uuid is None:
                    continue  # never read its UUID: nothing to advertise
                self._known[uuid] = unit.gpu_index
                units[uuid] = unit
            states = []
            for uuid, index in self._known.items():
                unit = units.get(uuid)
                if snapshot.error is not None:
                    states.append(DeviceState(uuid, index, False, (snapshot.error,)))
                elif unit is None:
                    states.append(DeviceState(uuid, index, False, ("absent",)))
                else:
                    states.append(
                        DeviceState(
                            uuid,
                            unit.gpu_index,
                            unit.healthy,
                            unit.reasons,
                            unit.memory_free_mib,
                            unit.mig_index,
                        )
                    )
        states.sort(key=lambda s: (s.index, s.mig_index or 0, s.id))
        self._log_changes(states)
        return states

    def _log_changes(self, states: list[DeviceState]) -> None:
        with self._lock:
            for s in states:
                before = self._logged.get(s.id)
                if before == s.healthy:
                    continue
                self._logged[s.id] = s.healthy
                if s.healthy and before is not None:
                    logger.info("device plugin: GPU {} {} healthy again", s.index, s.id)
                elif not s.healthy:
                    logger.warning(
                        "device plugin: GPU {} {} unhealthy ({})", s.index, s.id, ",".join(s.reasons)
                    )

    def notify(self) -> None:
        """Wake every ``ListAndWatch`` stream now (call after each tick)."""
        with self._changed:
            self._changed.notify_all()

    # -- the gRPC service ------------------------------------------------------------------

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api_pb2.DevicePluginOptions(
            pre_start_required=True, get_preferred_allocation_available=True
        )

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        sent: tuple[tuple[str, str], ...] | None = None
        while not self._stopping.is_set() and context.is_active():
            states = self.devices()
            now = tuple((s.id, s.health) for s in states)
            if now != sent:
                logger.debug("device plugin: ListAndWatch sends {}", now)
                yield api_pb2.ListAndWatchResponse(
                    devices=[api_pb2.Device(ID=d, health=h) for d, h in now]
                )
                sent = now
            with self._changed:
                self._changed.wait(self.poll_s)

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        states = {s.id: s for s in self.devices()}
        responses = []
        for req in request.container_requests:
            ids = preferred(
                states,
                list(req.available_deviceIDs),
                list(req.must_include_deviceIDs),
                req.allocation_size,
                self._topology,
            )
            logger.info(
                "device plugin: preferred {} of {} (must include {})",
                ids,
                list(req.available_deviceIDs),
                list(req.must_include_deviceIDs),
            )
            responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: Any, context: Any) -> Any:
        states = {s.id: s for s in self.devices()}
        responses = []
        for req in request.container_requests:
            ids = list(dict.fromkeys(req.devicesIDs))  # the kubelet's list, untrusted: once each
            self._refuse(ids, states, context, "allocate")
            logger.info("device plugin: allocate {}", ids)
            envs = {VISIBLE_DEVICES_ENV: ",".join(ids)} if ids else {}
            responses.append(api_pb2.ContainerAllocateResponse(envs=envs))
        return api_pb2.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        ids = list(request.devicesIDs)
        self._refuse(ids, {s.id: s for s in self.devices()}, context, "start a container on")
        return api_pb2.PreStartContainerResponse()

    def _refuse(
        self, ids: list[str], states: dict[str, DeviceState], context: Any, what: str
    ) -> None:
        unknown = [d for d in ids if d not in states]
        if unknown:
            # name a few: a request of 10,000 made-up IDs gets a short answer and a short log
            shown = ", ".join(d[:64] for d in unknown[:5])
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            self.refusals += 1
            logger.warning("device plugin: refused to {} unknown devices {}{}", what, shown, more)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices: {shown}{more}")
        bad = [states[d] for d in ids if not states[d].healthy]
        if bad:
            detail = "; ".join(f"GPU {s.index} {s.id}: {','.join(s.reasons)}" for s in bad)
            self.refusals += 1
            logger.warning("device plugin: refused to {} unhealthy GPUs: {}", what, detail)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"unhealthy: {detail}")

    # -- serving and registration ----------------------------------------------------------

    def start(self) -> None:
        """Serve and register in a background thread; watch the folder for kubelet restarts."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._stopping.clear()
        listeners = getattr(self._source, "on_tick", None)
        if isinstance(listeners, list) and self._on_tick not in listeners:
            listeners.append(self._on_tick)  # wake the streams as soon as a tick is cached
        observer = Observer()
        observer.schedule(_FolderHandler(self), str(self.plugin_dir), recursive=False)
        observer.daemon = True
        observer.start()
        self._observer = observer
        self._thread = threading.Thread(target=self._manage, name="device-plugin", daemon=True)
        self._thread.start()

    def _on_tick(self, _result: object) -> None:
        self.notify()

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving: end the streams, close the server, remove the socket."""
        self._stopping.set()
        self._kick.set()
        self.notify()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._stop_server(grace_s)
        logger.info("device plugin stopped")

    def wait_registered(self, timeout_s: float) -> bool:
        """True once registered with the kubelet (for tests and start-up checks)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.registrations:
                return True
            time.sleep(0.05)
        return bool(self.registrations)

    def _kubelet_changed(self) -> None:
        self._registered_to = None
        self._kick.set()

    def _stop_server(self, grace_s: float) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace_s).wait(grace_s + 1)
        try:
            if self.socket_path.is_socket():
                self.socket_path.unlink()
        except OSError:
            pass

    def _serve(self) -> None:
        """(Re)start the gRPC server on our socket."""
        self._stop_server(0)
        try:
            self.socket_path.unlink()
        except FileNotFoundError:
            pass
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="device-plugin-rpc")
        )
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, server)
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server = server
        self.serves += 1
        self._registered_to = None  # a new server must be registered again
        logger.info("device plugin serving {} on {}", self.resource_name, self.socket_path)

    def _kubelet_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.kubelet_socket)
        except OSError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    def _register(self) -> None:
        request = api_pb2.RegisterRequest(
            version=API_VERSION,
            endpoint=self.socket_name,
            resource_name=self.resource_name,
            options=api_pb2.DevicePluginOptions(
                pre_start_required=True, get_preferred_allocation_available=True
            ),
        )
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=5)

    def _manage(self) -> None:
        deadline = time.monotonic() + self.first_read_timeout_s
        while self._cache.last is None and time.monotonic() < deadline:
            if self._stopping.wait(0.05):
                return
        backoff_s = 0.0
        while not self._stopping.is_set():
            try:
                if self._server is None or not self.socket_path.exists():
                    if self._server is not None:
                        logger.warning("device plugin socket {} removed: serving again",
                                       self.socket_path)
                    self._serve()
                ident = self._kubelet_identity()
                if ident is not None and ident != self._registered_to:
                    self._register()
                    self._registered_to = ident
                    self.registrations += 1
                    logger.info(
                        "device plugin registered {} with the kubelet ({})",
                        self.resource_name,
                        self.kubelet_socket,
                    )
                backoff_s = 0.0
            except (grpc.RpcError, OSError) as exc:
                backoff_s = min(max(backoff_s * 2, 0.5), 10.0)
                detail = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)  # type: ignore[attr-defined]
                logger.warning(
                    "device plugin: registration with {} failed ({}); retrying in {:.1f}s",
                    self.kubelet_socket,
                    detail,
                    backoff_s,
                )
            self._kick.wait(backoff_s or self.resync_s)
            self._kick.clear()

"""Serving one device plugin's socket and registering it with the kubelet, again after a kubelet restart."""

from __future__ import annotations

import os
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
import tenacity
from loguru import logger
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from ..core.publish.readings import AgentFeed, TickResult
from ..serving import listen_unix
from .allocation import API_VERSION, KUBELET_SOCKET, plugin_options, socket_name_for
from .config import DEFAULT_TIMING, Timing
from .v1beta1 import api_pb2, api_pb2_grpc

__all__ = ["Endpoint", "KubeletRegistration", "Served"]


class Served(Protocol):
    """The servicer a registration serves (``service.DeviceService``): a
    ``DevicePluginServicer`` whose streams end once ``stopping`` is set and wake on
    ``notify()``."""

    stopping: threading.Event

    def notify(self) -> None:
        """Wake every ``ListAndWatch`` stream now."""
        ...

#: a failed registration is tried again after 0.5 s, then 1, 2, 4, 8 and 10 s at most
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 10.0
#: how often the registration thread looks for the agent's first reading
FIRST_READ_POLL_S = 0.05


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where one plugin is served and registered: ``resource_name`` (``nvidia.com/gpu``) on
    ``<plugin_dir>/<socket_name>`` (by default ``allocation.socket_name_for(resource_name)``),
    registered on ``<plugin_dir>/kubelet.sock``."""

    resource_name: str
    plugin_dir: Path
    socket_name: str | None = None

    @property
    def socket(self) -> str:
        """The plugin's socket file name in ``plugin_dir``."""
        return self.socket_name or socket_name_for(self.resource_name)


class _FolderHandler(FileSystemEventHandler):
    """Wakes the plugin when ``kubelet.sock`` is (re)created or our socket is removed."""

    def __init__(self, plugin: KubeletRegistration) -> None:
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


class KubeletRegistration:
    """Serving one plugin's ``service`` (``service.DeviceService``) and registering it with the
    kubelet: the serving half of ``DevicePlugin``.

    It serves ``<plugin_dir>/<socket_name>`` and registers ``resource_name`` on
    ``<plugin_dir>/kubelet.sock`` (``endpoint``), in a background thread that first waits up to
    ``timing.first_read_timeout_s`` for the agent's first reading (``source.cache``). Each tick of
    ``source`` wakes the service's streams. A kubelet that restarts deletes
    every socket in the folder and creates a new ``kubelet.sock``: the folder is watched
    (``watchdog``) and the plugin serves and registers again at once; every ``resync_s`` it
    checks anyway. A failed registration is retried (tenacity) after 0.5 s, doubling to 10 s
    (a folder event retries at once), with one warning per failure; ``timing.resync_s``: how often
    it checks besides the folder's events. ``serves`` and ``registrations`` count the servers
    started and the registrations accepted.
    """

    def __init__(self, service: Served, endpoint: Endpoint, source: AgentFeed,
                 timing: Timing = DEFAULT_TIMING) -> None:  # fmt: skip
        self.service = service
        self._source = source
        self._stopping = service.stopping
        self.resource_name = endpoint.resource_name
        self.plugin_dir = Path(endpoint.plugin_dir)
        self.socket_name = endpoint.socket
        self.socket_path = self.plugin_dir / self.socket_name
        self.kubelet_socket = self.plugin_dir / KUBELET_SOCKET
        self.resync_s = timing.resync_s
        self.first_read_timeout_s = timing.first_read_timeout_s
        self._kick = threading.Event()
        self._registered = threading.Event()
        self._server: grpc.Server | None = None
        self._thread: threading.Thread | None = None
        self._observer: Any = None
        self._registered_to: tuple[int, int] | None = None
        self.registrations = 0
        self.serves = 0

    def start(self) -> None:
        """Serve and register in a background thread; watch the folder for kubelet restarts."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._stopping.clear()
        self._registered.clear()  # (started again after a stop: registered anew)
        listeners = self._source.on_tick
        if self._on_tick not in listeners:
            listeners.append(self._on_tick)  # wake the streams as soon as a tick is cached
        observer = Observer()
        observer.schedule(_FolderHandler(self), str(self.plugin_dir), recursive=False)
        observer.daemon = True
        observer.start()
        self._observer = observer
        self._thread = threading.Thread(target=self._manage, name="device-plugin", daemon=True)
        self._thread.start()

    def _on_tick(self, _result: TickResult) -> None:
        self.service.notify()

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving: end the streams (each sends its last list first), close the server,
        remove the socket. ``start()`` serves again (it stays among the agent's tick listeners,
        which are not changed while the agent calls them)."""
        self._stopping.set()
        self._kick.set()
        self.service.notify()
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
        """True once registered with the kubelet, waiting up to ``timeout_s`` seconds for it
        (for tests and start-up checks)."""
        return self._registered.wait(timeout_s)

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
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server)
        try:
            listen_unix(server, self.socket_path)
        except OSError:
            server.stop(0)
            raise
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
            options=plugin_options(),
        )
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=5)

    # -- the registration thread -----------------------------------------------------------

    def _manage(self) -> None:
        if not self._await_first_reading():
            return
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type((grpc.RpcError, OSError)),
            stop=tenacity.stop_when_event_set(self._stopping),
            wait=tenacity.wait_exponential(multiplier=RETRY_FIRST_S, max=RETRY_MAX_S),
            sleep=self._pause,  # a folder event (or stop) ends the delay
            before_sleep=self._log_failure,
            retry_error_callback=lambda state: None,  # stopped while failing
        )
        # one tenacity call per check: a check that succeeds resets the delay
        while True:
            retrying(self._sync)
            if self._stopping.is_set():  # (a retry's pause may have used up stop's kick)
                return
            self._pause(self.resync_s)

    def _await_first_reading(self) -> bool:
        """Wait up to ``first_read_timeout_s`` for the agent's first reading (serving without
        one after that); False when stopped meanwhile."""
        tenacity.Retrying(
            retry=tenacity.retry_if_result(lambda last: last is None),
            stop=tenacity.stop_after_delay(self.first_read_timeout_s)
            | tenacity.stop_when_event_set(self._stopping),
            wait=tenacity.wait_fixed(FIRST_READ_POLL_S),
            sleep=self._stopping.wait,  # type: ignore[arg-type]  # tenacity drops wait()'s bool
            retry_error_callback=lambda state: None,
        )(lambda: self._source.cache.last)
        return not self._stopping.is_set()

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` or until the folder changes (or stop); the kick is used up."""
        self._kick.wait(seconds)
        self._kick.clear()

    def _sync(self) -> None:
        """Serve (again when our socket went) and register (again with a new kubelet).
        Raises ``grpc.RpcError`` or ``OSError`` when either fails."""
        if self._stopping.is_set():
            return
        if self._server is None or not self.socket_path.exists():
            if self._server is not None:
                logger.warning("device plugin socket {} removed: serving again", self.socket_path)
            self._serve()
        ident = self._kubelet_identity()
        if ident is not None and ident != self._registered_to:
            self._register()
            self._registered_to = ident
            self.registrations += 1
            self._registered.set()
            logger.info(
                "device plugin registered {} with the kubelet ({})",
                self.resource_name,
                self.kubelet_socket,
            )

    def _log_failure(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        detail = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
        delay_s = state.next_action.sleep if state.next_action else 0.0
        logger.warning(
            "device plugin: registration with {} failed ({}); retrying in {:.1f}s",
            self.kubelet_socket,
            detail,
            delay_s,
        )

"""Serving one device plugin's socket and registering it with the kubelet, again after a kubelet restart."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
import tenacity
from loguru import logger

from ..core.publish.readings import AgentFeed, TickResult
from ..kubeletplugin import Backoff, KubeletPluginHost, PluginSteps, ServedSocket
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


class KubeletRegistration:
    """Serving one plugin's ``service`` (``service.DeviceService``) and registering it with the
    kubelet: the serving half of ``DevicePlugin``, on the host both kubelet plugins share
    (``kubeletplugin.KubeletPluginHost``, ``host``).

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
        self._socket = ServedSocket(
            self.socket_path,
            lambda server: api_pb2_grpc.add_DevicePluginServicer_to_server(self.service, server),
            rpc_threads="device-plugin-rpc", max_workers=16,
        )  # fmt: skip
        steps = PluginSteps(sync=self._sync, failed=self._log_failure, wake=service.notify,
                            kubelet_restarted=self._kubelet_changed,
                            ready=self._await_first_reading)  # fmt: skip
        self.host = KubeletPluginHost(
            "device plugin", [self._socket], steps, kubelet_socket=self.kubelet_socket,
            backoff=Backoff(timing.resync_s, RETRY_FIRST_S, RETRY_MAX_S), stopping=service.stopping,
        )  # fmt: skip
        self._registered_to: tuple[int, int] | None = None

    @property
    def registrations(self) -> int:
        """Registrations the kubelet accepted."""
        return self.host.registrations

    @property
    def serves(self) -> int:
        """gRPC servers started on the socket."""
        return self._socket.serves

    def start(self) -> None:
        """Serve and register in a background thread; watch the folder for kubelet restarts."""
        listeners = self._source.on_tick
        if self._on_tick not in listeners:
            listeners.append(self._on_tick)  # wake the streams as soon as a tick is cached
        self.host.registered.clear()  # (started again after a stop: registered anew)
        self.host.start()

    def _on_tick(self, _result: TickResult) -> None:
        self.service.notify()

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop serving: end the streams (each sends its last list first), close the server,
        remove the socket. ``start()`` serves again (it stays among the agent's tick listeners,
        which are not changed while the agent calls them)."""
        self.host.stop(grace_s)

    def wait_registered(self, timeout_s: float) -> bool:
        """True once registered with the kubelet, waiting up to ``timeout_s`` seconds for it
        (for tests and start-up checks)."""
        return self.host.wait_registered(timeout_s)

    def _kubelet_changed(self) -> None:
        self._registered_to = None

    def _serve(self) -> None:
        """(Re)start the gRPC server on our socket."""
        self._socket.serve()
        self._registered_to = None  # a new server must be registered again
        logger.info("device plugin serving {} on {}", self.resource_name, self.socket_path)

    def _stop_server(self, grace_s: float) -> None:
        """Stop the gRPC server and remove our socket, no more (``bench/sharing.py`` serves with
        ``_serve`` alone, no kubelet to register with)."""
        self._socket.stop(grace_s)

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

    # -- the host's steps ------------------------------------------------------------------

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

    def _sync(self) -> None:
        """Serve (again when our socket went) and register (again with a new kubelet).
        Raises ``grpc.RpcError`` or ``OSError`` when either fails."""
        if self._socket.server is None or not self.socket_path.exists():
            if self._socket.server is not None:
                logger.warning("device plugin socket {} removed: serving again", self.socket_path)
            self._serve()
        ident = self._kubelet_identity()
        if ident is not None and ident != self._registered_to:
            self._register()
            self._registered_to = ident
            self.host.note_registered()
            logger.info(
                "device plugin registered {} with the kubelet ({})",
                self.resource_name,
                self.kubelet_socket,
            )

    def _log_failure(self, detail: str, delay_s: float) -> None:
        logger.warning(
            "device plugin: registration with {} failed ({}); retrying in {:.1f}s",
            self.kubelet_socket,
            detail,
            delay_s,
        )

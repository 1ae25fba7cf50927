"""The host of a kubelet plugin: what the device plugin (``deviceplugin``) and the DRA plugin
(``dra``) share around their own gRPC services (the name is the Kubernetes helper library's,
``k8s.io/dynamic-resource-allocation/kubeletplugin``).

- ``ServedSocket``: one gRPC server on one unix socket: a stale socket file removed, listened
  on by ``serving.listen_unix``, served again (a new server) after it went, removed at stop.
- ``KubeletPluginHost``: the lifecycle around a plugin's sockets: a watch of their folders
  (``watchdog``, inotify) that wakes the plugin's managing thread when one of its sockets (or
  the kubelet's own registration socket) is removed, or when the kubelet's socket is created
  again (a kubelet restart); that thread, which runs the plugin's ``sync`` step at once, then
  after each wake-up and every ``resync_s``, a failure (``grpc.RpcError``, ``OSError``) retried
  by tenacity; ``stop()``; the registration's state (``registered``, ``registrations``).
- ``IndexCheck``: the step both plugins take at the first readable reading after each start:
  each GPU's NVML index -> UUID compared with the last start's (``sources.gpu_indices``).

The two registration protocols stay each plugin's own (its ``PluginSteps.sync``): the device
plugin calls the kubelet's ``Registration`` service on ``<device-plugins dir>/kubelet.sock``
(again when that socket is a new one); the DRA plugin serves a registration socket in the
kubelet's ``plugins_registry`` folder, which the kubelet's plugin watcher finds by itself (again
when the socket is served anew).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import tenacity
from loguru import logger
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from .core.model.sharing import IndexMoved, SharedGpus, gpu_indices
from .core.publish.readings import TickResult
from .serving import listen_unix
from .sources.gpu_indices import check_indices

__all__ = ["Backoff", "IndexCheck", "KubeletPluginHost", "PluginSteps", "ServedSocket"]


class ServedSocket:
    """One gRPC server on the unix socket ``path``: ``add(server)`` adds the plugin's servicers
    to each new server, whose RPCs run on at most ``max_workers`` threads named
    ``<rpc_threads>_<n>``. ``serves`` counts the servers started; ``server`` is the one serving
    (``None`` when stopped)."""

    def __init__(self, path: Path, add: Callable[[grpc.Server], None], *, rpc_threads: str,
                 max_workers: int = 8) -> None:  # fmt: skip
        self.path = Path(path)
        self._add = add
        self._rpc_threads = rpc_threads
        self._max_workers = max_workers
        self.server: grpc.Server | None = None
        self.serves = 0

    @property
    def served(self) -> bool:
        """Whether a server is running and its socket file is there."""
        return self.server is not None and self.path.is_socket()

    def serve(self) -> None:
        """(Re)start the server: the running one stopped, a file left at ``path`` removed, a
        new server listening on it. Raises ``OSError`` when it cannot listen
        (``serving.listen_unix``: path too long, folder missing, ...)."""
        self.stop(0)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._max_workers,
                                                        thread_name_prefix=self._rpc_threads))  # fmt: skip
        self._add(server)
        try:
            listen_unix(server, self.path)
        except OSError:
            server.stop(0)
            raise
        server.start()
        self.server = server
        self.serves += 1

    def stop(self, grace_s: float) -> None:
        """Stop the server (calls in flight get ``grace_s`` seconds) and remove the socket file
        (a file there that is not a socket stays). Never raises."""
        server, self.server = self.server, None
        if server is not None:
            server.stop(grace_s).wait(grace_s + 1)
        try:
            if self.path.is_socket():
                self.path.unlink()
        except OSError:
            pass


@dataclass(frozen=True, slots=True)
class Backoff:
    """How the host's thread keeps time, seconds: ``resync_s``, how often ``sync`` runs besides
    the folders' events; a failed ``sync`` is retried after ``retry_first_s``, doubling up to
    ``retry_max_s`` (a folder event retries at once)."""

    resync_s: float = 5.0
    retry_first_s: float = 0.5
    retry_max_s: float = 10.0


def _nothing() -> None:
    return None


def _ready() -> bool:
    return True


@dataclass(frozen=True, slots=True)
class PluginSteps:
    """What one plugin supplies to its host.

    - ``sync``: one check, run by the host's thread: serve each socket that went, register
      (again) as the plugin's protocol says. Raises ``grpc.RpcError`` or ``OSError`` to be
      retried (``Backoff``).
    - ``failed(detail, delay_s)``: the log line of a failed ``sync`` (the error's text, the
      seconds until the retry).
    - ``wake``: at stop, wake the plugin's streams so that they see it and end.
    - ``kubelet_restarted``: the kubelet's registration socket was created (again).
    - ``ready``: waited for on the host's thread before the first ``sync`` (the device plugin's
      wait for the agent's first reading); False: stopped meanwhile, the thread ends.
    """

    sync: Callable[[], None]
    failed: Callable[[str, float], None]
    wake: Callable[[], None] = _nothing
    kubelet_restarted: Callable[[], None] = _nothing
    ready: Callable[[], bool] = _ready


class _FolderWatch(FileSystemEventHandler):
    """Wakes the host when one of ``gone`` (file names) is removed or moved away, and tells it
    when ``kubelet`` (a file name) is created or moved there."""

    def __init__(self, host: KubeletPluginHost, gone: set[str], kubelet: str | None) -> None:
        self.host = host
        self.gone = gone
        self.kubelet = kubelet

    @staticmethod
    def _name(path: Any) -> str:
        return os.path.basename(os.fsdecode(path)) if path else ""

    def on_created(self, event: FileSystemEvent) -> None:
        if self.kubelet is not None and self._name(event.src_path) == self.kubelet:
            self.host.kubelet_restarted()

    def on_deleted(self, event: FileSystemEvent) -> None:
        if self._name(event.src_path) in self.gone:
            self.host.kick()

    def on_moved(self, event: FileSystemEvent) -> None:
        if self._name(event.src_path) in self.gone:
            self.host.kick()
        if self.kubelet is not None and self._name(getattr(event, "dest_path", "")) == self.kubelet:
            self.host.kubelet_restarted()


class KubeletPluginHost:
    """The lifecycle of one kubelet plugin: its ``sockets`` (``ServedSocket``, stopped in that
    order), watched in their folders, and a managing thread named ``name`` that runs
    ``steps.sync`` (``PluginSteps``) at start, at each wake-up and every ``backoff.resync_s``.

    ``kubelet_socket``: the kubelet's own registration socket (the device plugin's
    ``kubelet.sock``), watched too: removed, it wakes the thread; created again (the kubelet
    restarted), ``steps.kubelet_restarted`` then a wake-up. ``None`` (the DRA plugin: the
    kubelet's plugin watcher finds the plugin's socket by itself): not watched.

    ``stopping`` (set by ``stop()``, cleared by ``start()``) is the plugin's too: its streams
    end once it is set. ``registered`` is set by ``note_registered`` (each counted in
    ``registrations``); the plugin clears it when its registration starts over.
    """

    def __init__(self, name: str, sockets: Sequence[ServedSocket], steps: PluginSteps, *,
                 kubelet_socket: Path | None = None, backoff: Backoff = Backoff(),
                 stopping: threading.Event | None = None) -> None:  # fmt: skip
        self.name = name
        self.sockets = tuple(sockets)
        self.steps = steps
        self.kubelet_socket = kubelet_socket
        self.backoff = backoff
        self.stopping = stopping if stopping is not None else threading.Event()
        self.registered = threading.Event()
        #: registrations the kubelet accepted
        self.registrations = 0
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        self._observer: Any = None

    def folders(self) -> list[Path]:
        """The folders watched: each socket's, and the kubelet socket's."""
        paths = [s.path for s in self.sockets]
        if self.kubelet_socket is not None:
            paths.append(self.kubelet_socket)
        return list(dict.fromkeys(p.parent for p in paths))

    def start(self) -> None:
        """Create the folders, watch them and start the managing thread (which runs
        ``steps.ready`` then ``steps.sync``)."""
        for folder in self.folders():
            folder.mkdir(parents=True, exist_ok=True)
        self.stopping.clear()
        gone = {s.path.name for s in self.sockets}
        kubelet = self.kubelet_socket.name if self.kubelet_socket is not None else None
        if kubelet is not None:
            gone.add(kubelet)
        handler = _FolderWatch(self, gone, kubelet)
        observer = Observer()
        for folder in self.folders():
            observer.schedule(handler, str(folder), recursive=False)
        observer.daemon = True
        observer.start()
        self._observer = observer
        self._thread = threading.Thread(target=self._manage, name=self.name.lower().replace(" ", "-"),
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def stop(self, grace_s: float = 1.0) -> None:
        """Set ``stopping``, wake the streams (``steps.wake``), end the watch and the thread,
        stop each socket's server (calls in flight get ``grace_s`` seconds) and remove the
        socket files. ``start()`` serves again."""
        self.stopping.set()
        self._kick.set()
        self.steps.wake()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        for socket in self.sockets:
            socket.stop(grace_s)
        logger.info("{} stopped", self.name)

    def kick(self) -> None:
        """Wake the managing thread: it runs ``steps.sync`` now (a pending retry too)."""
        self._kick.set()

    def kubelet_restarted(self) -> None:
        """The kubelet's socket was created again: ``steps.kubelet_restarted``, then a wake-up."""
        self.steps.kubelet_restarted()
        self._kick.set()

    def note_registered(self) -> None:
        """The kubelet accepted a registration: counted, ``registered`` set."""
        self.registrations += 1
        self.registered.set()

    def wait_registered(self, timeout_s: float) -> bool:
        """True once registered with the kubelet, waiting up to ``timeout_s`` seconds."""
        return self.registered.wait(timeout_s)

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` or until a wake-up (a folder event, ``kick``, stop); the wake-up is
        used up."""
        self._kick.wait(seconds)
        self._kick.clear()

    def _manage(self) -> None:
        if not self.steps.ready():
            return
        backoff = self.backoff
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type((grpc.RpcError, OSError)),
            stop=tenacity.stop_when_event_set(self.stopping),
            wait=tenacity.wait_exponential(multiplier=backoff.retry_first_s, max=backoff.retry_max_s),
            sleep=self.pause,  # a folder event (or stop) ends the delay
            before_sleep=self._log_failure,
            retry_error_callback=lambda state: None,  # stopped while failing
        )
        # one tenacity call per check: a check that succeeds resets the delay
        while not self.stopping.is_set():
            retrying(self._sync)
            if self.stopping.is_set():  # (a retry's pause may have used up stop's kick)
                return
            self.pause(backoff.resync_s)

    def _sync(self) -> None:
        if not self.stopping.is_set():
            self.steps.sync()

    def _log_failure(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        detail = exc.details() if isinstance(exc, grpc.RpcError) else str(exc)
        self.steps.failed(str(detail), state.next_action.sleep if state.next_action else 0.0)


class IndexCheck:
    """Once per plugin start, at the first readable reading: each GPU's NVML index -> UUID
    (``core.model.sharing.gpu_indices``: ``nvmlDeviceGetIndex``/``nvmlDeviceGetUUID``) compared
    with the last start's map at ``path`` by ``sources.gpu_indices.check_indices`` (a warning
    log line prefixed ``who`` for each index of ``shared`` that names another GPU now; this
    start's map written). ``done``: whether this start's reading was compared."""

    def __init__(self, path: Path, shared: SharedGpus, who: str) -> None:
        self.path = Path(path)
        self.shared = shared
        self.who = who
        self.done = False
        self._lock = threading.Lock()

    def __call__(self, last: TickResult | None,
                 record: Callable[[tuple[IndexMoved, ...]], object]) -> tuple[IndexMoved, ...] | None:  # fmt: skip
        """Compare ``last`` (the agent's latest reading, ``cache.last``) and hand what moved to
        ``record`` (before ``done`` is set: whoever sees ``done`` sees what it recorded).
        Returns what moved, or ``None`` before a readable reading (none, or NVML unreadable)
        and once done. Never raises on the files (``check_indices`` logs their errors);
        ``record``'s own errors propagate."""
        with self._lock:
            if self.done or last is None or last.snapshot.error is not None:
                return None
            moved = check_indices(self.path, self.shared, gpu_indices(last.snapshot.gpus), self.who)
            record(moved)
            self.done = True
            return moved

"""The kubelet DRA plugin of ``gpu.omaticaya.io``: registration, ``DRAPlugin`` v1 and device
health, served over unix sockets with grpcio.

Sockets (what the kubelet v1.37 expects, from its ``pluginmanager`` and ``cm/dra``):

- ``<OMATICAYA_DRA_REGISTRY_DIR>/gpu.omaticaya.io-reg.sock``: ``pluginregistration.Registration``.
  The kubelet's plugin watcher finds it (inotify, and a walk of the folder at its own start, so
  a restarted kubelet registers the plugin again by itself), calls ``GetInfo`` (type
  ``DRAPlugin``, name ``gpu.omaticaya.io``, endpoint the DRA socket's path, supported versions
  ``v1.DRAPlugin``, ``v1.DRAResourceHealth``, ``v1alpha1.DRAResourceHealth``: the kubelet picks
  the newest of each it knows) and ``NotifyRegistrationStatus``. A socket that disappears is
  served again (the folder is watched, and checked every ``resync_s``); a failed registration
  is logged and the socket re-created after ``resync_s``, which makes the watcher try again.
- ``<OMATICAYA_DRA_PLUGIN_DIR>/dra.sock``: ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``
  (``NodePrepareResources``, ``NodeUnprepareResources``) and ``DRAResourceHealth`` v1 and
  v1alpha1 (``NodeWatchResources``) on the same socket: the kubelet calls the health service on
  the DRA endpoint. The endpoint is given to the kubelet as a path: the plugin folder must be the
  same path on the host and in the plugin's container.

Prepared claims: one CDI spec file per claim in ``OMATICAYA_DRA_CDI_DIR``
(``prepare.cdi_file_name``), recorded in ``<plugin dir>/checkpoint.json`` (``host.Checkpoint``).
The slices of shared GPUs prepared are also kept in memory per GPU (``prepare.PendingSlice``)
until the reading shows them, ``OMATICAYA_SHARE_SETTLE_S`` passes, or their claim is
unprepared: prepare refuses a slice they leave no room for (``prepare.live_room``). After a
restart, slices prepared before it count only once the reading shows them, as the device
plugin's do.
``stop()`` removes both sockets (registration first) and keeps the checkpoint and CDI specs:
running containers keep their devices, and a restarted plugin unprepares what it prepared.

Device identity: devices are named by their GPU's UUID (``core.publish.dra.device_name``), every
checkpointed device records the UUID it was prepared on and is checked against the reading at
each prepare (``prepare.check_checkpointed``). At the first reading after each start the plugin
compares each GPU's NVML index -> UUID with the last start's (``<plugin dir>/gpu-indices.json``,
``sources.gpu_indices``): an ``OMATICAYA_SHARED_GPUS`` index that now names another GPU is
reported by a log line, a Warning Event ``SharedGpuIndexMoved`` on the Node and the gauge
``omaticaya_shared_gpu_index_moved`` (``check_indices``).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent import futures
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
from loguru import logger
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from ..core.allocation.memory_limit import driver_major
from ..core.allocation.mps import Layout
from ..core.config.settings import Settings, stuck_after_s
from ..core.model.sharing import IndexMoved, Sharing, gpu_indices
from ..core.publish.dra import DRIVER, DraDevice, inventory
from ..core.publish.readings import AgentFeed, ReadingAge, TickResult
from ..kube.errors import KubeError, KubeNotFound
from ..kube.index_moved import post_index_moved
from ..kube.session import ApiSession
from ..serving import listen_unix
from ..sources.gpu_indices import check_indices
from ..sources.mps import MpsWatch, SliceDaemons, SliceUnavailable
from . import healthreport as dra_health
from .health.v1 import api_pb2 as health_v1_pb2
from .health.v1 import api_pb2_grpc as health_v1_grpc
from .health.v1alpha1 import api_pb2 as health_v1alpha1_pb2
from .health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from .host import (
    INDICES_FILE,
    Checkpoint,
    Entry,
    device_nodes,
    gpu_minors,
    remove,
    write_atomic,
)
from .metrics import DraCounts
from .pluginregistration import api_pb2 as reg_pb2
from .pluginregistration import api_pb2_grpc as reg_grpc
from .prepare import (
    CONTROL_NODES,
    OWNER,
    ClaimRef,
    NodeFacts,
    PendingSlice,
    PreparedClaim,
    Refused,
    cdi_file_name,
    cdi_spec,
    check_checkpointed,
    claim_slice_id,
    decide,
    slices_pending,
    spec_bytes,
)
from .v1 import api_pb2 as dra_pb2
from .v1 import api_pb2_grpc as dra_grpc

__all__ = [
    "DRA_SOCKET",
    "PLUGIN_TYPE",
    "SUPPORTED_VERSIONS",
    "DraPlugin",
    "registration_socket_name",
]

#: the kubelet's plugin type for DRA drivers (pluginregistration v1 ``DRAPlugin``)
PLUGIN_TYPE = "DRAPlugin"
#: the gRPC services advertised as "supported versions" (the kubelet's constants
#: ``DRAPluginService``, ``DRAResourceHealthService``: registration names, not gRPC paths)
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
DRA_SOCKET = "dra.sock"
_CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


def registration_socket_name(driver: str = DRIVER) -> str:
    """``<driver>-reg.sock``: the registration socket's name in the registry folder."""
    return f"{driver}-reg.sock"


class _Watch(FileSystemEventHandler):
    """Kicks the plugin when one of its sockets is removed or moved away."""

    def __init__(self, names: Sequence[str], kick: threading.Event) -> None:
        self.names = set(names)
        self.kick = kick

    def _check(self, path: Any) -> None:
        if Path(str(path)).name in self.names:
            self.kick.set()

    def on_deleted(self, event: FileSystemEvent) -> None:
        self._check(event.src_path)

    def on_moved(self, event: FileSystemEvent) -> None:
        self._check(event.src_path)


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: DraPlugin) -> None:
        self.plugin = plugin

    def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=DRIVER, endpoint=str(self.plugin.dra_socket),
            supported_versions=list(SUPPORTED_VERSIONS),
        )  # fmt: skip

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.plugin._registration_status(bool(request.plugin_registered), str(request.error))
        return reg_pb2.RegistrationStatusResponse()


class _Node(dra_grpc.DRAPluginServicer):
    def __init__(self, plugin: DraPlugin) -> None:
        self.plugin = plugin

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        response = dra_pb2.NodePrepareResourcesResponse()
        for claim in request.claims:
            ref = ClaimRef(claim.namespace, claim.name, claim.uid)
            devices, error = self.plugin.prepare(ref)
            answer = response.claims[claim.uid]
            if error:
                answer.error = error
                continue
            for d in devices:
                device = answer.devices.add(
                    request_names=list(d.get("request_names", ())), pool_name=d["pool_name"],
                    device_name=d["device_name"], cdi_device_ids=list(d.get("cdi_device_ids", ())),
                )  # fmt: skip
                if d.get("share_id"):
                    device.share_id = d["share_id"]
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        response = dra_pb2.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            error = self.plugin.unprepare(ClaimRef(claim.namespace, claim.name, claim.uid))
            answer = response.claims[claim.uid]
            if error:
                answer.error = error
        return response


def _health_servicer(base: type, pb2: Any, plugin: DraPlugin) -> Any:
    """A ``DRAResourceHealth`` servicer of one API version (``pb2``: its messages)."""

    class Servicer(base):
        def NodeWatchResources(self, request: Any, context: Any) -> Iterator[Any]:
            for report in plugin.health_reports(context.is_active):
                yield pb2.NodeWatchResourcesResponse(devices=[
                    pb2.DeviceHealth(
                        device=pb2.DeviceIdentifier(pool_name=plugin.pool, device_name=h.device),
                        health=h.status, last_updated_time=int(time.time()),
                        health_check_timeout_seconds=plugin.health_timeout_s, message=h.message,
                    )
                    for h in report
                ])  # fmt: skip

    return Servicer()


class DraPlugin:
    """The kubelet DRA plugin of ``gpu.omaticaya.io`` over the agent's reading.

    - ``feed``: the agent (``core.publish.readings.AgentFeed``): its latest reading (``cache.last``),
      tick listeners (``on_tick``: each tick wakes the health streams) and clock.
    - ``settings``: ``dra_plugin_dir``, ``dra_registry_dir``, ``dra_cdi_dir``, ``dra_dev_root``,
      ``node_name`` (the pool; required), ``shared_gpus``, ``share_unit_mib``,
      ``share_enforcement``, ``mps_root``, ``mps_state_dir``, ``mps_stale_s``,
      ``mps_thread_share``, ``share_settle_s``, ``memory_step_mib``, ``hysteresis_pct``,
      ``proc_root`` and the stuck-reading bound (``stuck_after_s``).
    - ``session``: the API session that GETs ResourceClaims (``kube.session.ApiSession``; the
      agent's ``node.session``); ``None``: every claim of ours is refused.
    - ``mps``: the agent's watch of the MPS daemons (``agent.mps``); ``None`` while shared GPUs
      are enforced by MPS: the plugin reads the daemons' states itself.
    - ``counts``: the prepare/unprepare counters (``metrics.DraCounts``) shown on /metrics.

    ``prepare(ref)`` and ``unprepare(ref)`` are the per-claim halves of the two RPCs;
    ``health_reports`` the health stream. Raises ``ValueError`` without a node name.
    """

    def __init__(self, feed: AgentFeed, settings: Settings, session: ApiSession | None,
                 mps: MpsWatch | None = None, *, counts: DraCounts | None = None,
                 resync_s: float = 5.0, poll_s: float = 1.0) -> None:  # fmt: skip
        if not settings.node_name:
            raise ValueError("the DRA plugin needs the Node's name (NODE_NAME): it is the pool")
        self.feed = feed
        self.settings = settings
        self.session = session
        self.pool = settings.node_name
        self.plugin_dir = Path(settings.dra_plugin_dir)
        self.registry_dir = Path(settings.dra_registry_dir)
        self.cdi_dir = Path(settings.dra_cdi_dir)
        self.dev_root = Path(settings.dra_dev_root)
        self.dra_socket = self.plugin_dir / DRA_SOCKET
        self.registration_socket = self.registry_dir / registration_socket_name()
        self.sharing = Sharing.of(settings)
        enforced = bool(settings.shared_gpus) and settings.share_enforcement == "mps"
        self.layout = Layout(settings.mps_root, settings.mps_state_dir) if enforced else None
        if enforced and mps is None:
            assert self.layout is not None
            mps = MpsWatch(self.layout, settings.mps_stale_s)
        self.mps = mps if enforced else None
        #: the slices' own MPS daemons, asked for at prepare and let go at unprepare
        self.daemons = (SliceDaemons(self.layout, OWNER, settings.mps_stale_s)
                        if self.layout is not None else None)  # fmt: skip
        self.counts = counts if counts is not None else DraCounts()
        self.stale_after_s = stuck_after_s(settings)
        #: the kubelet shows a device Unknown this long after its last report
        self.health_timeout_s = max(1, math.ceil(self.stale_after_s))
        self.resync_s = resync_s
        self.poll_s = poll_s
        self.checkpoint = Checkpoint(self.plugin_dir)
        self.registered = threading.Event()
        #: registrations the kubelet confirmed, its refusals, and registration sockets served
        self.registrations = 0
        self.registration_errors: list[str] = []
        self.registration_serves = 0
        self._lock = threading.Lock()  # the checkpoint and the CDI files
        #: GPU UUID -> the slices prepared there the reading does not show yet (oldest first);
        #: under ``_slices_lock``, held from the look at them to the booking of a new one
        self.slices: dict[str, tuple[PendingSlice, ...]] = {}
        self._slices_lock = threading.Lock()
        self._wake = threading.Condition()
        self._ticks = 0
        self._stopping = threading.Event()
        self._kick = threading.Event()
        self._age = ReadingAge()  # the reading served, on ``feed.clock``
        self._reg_server: grpc.Server | None = None
        self._dra_server: grpc.Server | None = None
        self._thread: threading.Thread | None = None
        self._observer: Any = None
        self._reregister_at: float | None = None
        #: whether this start's first reading was compared with the last start's GPU indices
        #: (set once done, under ``_indices_lock``)
        self.indices_checked = False
        self._indices_lock = threading.Lock()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Load the checkpoint, serve the DRA socket, then the registration socket; watch both
        folders and re-serve a socket that disappears. Raises ``OSError`` when a socket cannot
        be served."""
        for folder in (self.plugin_dir, self.registry_dir, self.cdi_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._stopping.clear()
        with self._lock:
            self.checkpoint.load()
            self._sweep_daemons()
        if self._on_tick not in self.feed.on_tick:
            self.feed.on_tick.append(self._on_tick)
        self._serve_dra()
        self._serve_registration()
        observer = Observer()
        handler = _Watch([DRA_SOCKET, self.registration_socket.name], self._kick)
        for folder in {self.plugin_dir, self.registry_dir}:
            observer.schedule(handler, str(folder), recursive=False)
        observer.daemon = True
        observer.start()
        self._observer = observer
        self._thread = threading.Thread(target=self._manage, name="dra-plugin", daemon=True)
        self._thread.start()
        logger.info("DRA plugin {} serving {} (registration {}); {} prepared claim(s) in the "
                    "checkpoint", DRIVER, self.dra_socket, self.registration_socket,
                    len(self.checkpoint.claims))  # fmt: skip

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop: the registration socket first (the kubelet deregisters the plugin), then the
        DRA socket; the health streams end. The checkpoint and CDI specs stay."""
        self._stopping.set()
        self._kick.set()
        self._notify()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._reg_server = self._stop_server(self._reg_server, self.registration_socket, grace_s)
        self._dra_server = self._stop_server(self._dra_server, self.dra_socket, grace_s)
        self.registered.clear()
        logger.info("DRA plugin stopped")

    def wait_registered(self, timeout_s: float) -> bool:
        """True once the kubelet said it registered the plugin (within ``timeout_s``)."""
        return self.registered.wait(timeout_s)

    @staticmethod
    def _stop_server(server: grpc.Server | None, socket: Path, grace_s: float) -> None:
        if server is not None:
            server.stop(grace_s).wait(grace_s + 1)
        try:
            if socket.is_socket():
                socket.unlink()
        except OSError:
            pass
        return None

    def _listen(self, socket: Path, add: Callable[[grpc.Server], None], name: str) -> grpc.Server:
        try:
            socket.unlink()
        except FileNotFoundError:
            pass
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix=name))
        add(server)
        try:
            listen_unix(server, socket)
        except OSError:
            server.stop(0)
            raise
        server.start()
        return server

    def _serve_dra(self) -> None:
        self._dra_server = self._stop_server(self._dra_server, self.dra_socket, 0)

        def add(server: grpc.Server) -> None:
            dra_grpc.add_DRAPluginServicer_to_server(_Node(self), server)
            health_v1_grpc.add_DRAResourceHealthServicer_to_server(
                _health_servicer(health_v1_grpc.DRAResourceHealthServicer, health_v1_pb2, self), server)
            health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
                _health_servicer(health_v1alpha1_grpc.DRAResourceHealthServicer,
                                 health_v1alpha1_pb2, self), server)  # fmt: skip

        self._dra_server = self._listen(self.dra_socket, add, "dra-rpc")

    def _serve_registration(self) -> None:
        self._reg_server = self._stop_server(self._reg_server, self.registration_socket, 0)
        self.registered.clear()
        self._reregister_at = None
        self._reg_server = self._listen(
            self.registration_socket,
            lambda server: reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server),
            "dra-registration",
        )
        self.registration_serves += 1

    def _registration_status(self, registered: bool, error: str) -> None:
        if registered:
            self.registrations += 1
            self.registered.set()
            logger.info("DRA plugin {} registered with the kubelet", DRIVER)
            return
        self.registration_errors.append(error)
        self._reregister_at = time.monotonic() + self.resync_s
        logger.error("DRA plugin {}: the kubelet refused the registration ({}); the "
                     "registration socket is served again in {:.0f}s", DRIVER, error,
                     self.resync_s)  # fmt: skip
        self._kick.set()

    def _manage(self) -> None:
        """Serve again a socket that went, and a refused registration after ``resync_s``."""
        while not self._stopping.is_set():
            self._kick.wait(self.resync_s)
            self._kick.clear()
            if self._stopping.is_set():
                return
            self.check_indices()
            try:
                if not self.dra_socket.is_socket():
                    logger.warning("DRA plugin socket {} removed: serving again", self.dra_socket)
                    self._serve_dra()
                again = self._reregister_at is not None and time.monotonic() >= self._reregister_at
                if again or not self.registration_socket.is_socket():
                    if not again:
                        logger.warning("DRA registration socket {} removed: serving again",
                                       self.registration_socket)  # fmt: skip
                    self._serve_registration()
            except OSError as exc:
                logger.warning("DRA plugin: cannot serve again ({}); retrying in {:.0f}s",
                               exc, self.resync_s)  # fmt: skip

    # -- the reading ------------------------------------------------------------------------

    def _on_tick(self, _result: TickResult) -> None:
        with self._wake:
            self._ticks += 1
            self._wake.notify_all()
        if not self.indices_checked:
            self._kick.set()  # the managing thread compares the GPU indices (API work: not here)

    def check_indices(self) -> tuple[IndexMoved, ...] | None:
        """Once per start, at the first readable reading: compare each GPU's NVML index -> UUID
        (``nvmlDeviceGetIndex``/``nvmlDeviceGetUUID`` of ``feed.cache.last``) with the last
        start's (``<plugin dir>/gpu-indices.json``), report each ``OMATICAYA_SHARED_GPUS``
        index that names another GPU now (``core.model.sharing.moved_indices``: a warning log line, a
        Warning Event ``SharedGpuIndexMoved`` on the Node, ``counts.moved`` for the gauge
        ``omaticaya_shared_gpu_index_moved``), then write this start's map. Returns what moved,
        or ``None`` before a readable reading (and once done). Never raises: a file or API
        error is logged."""
        with self._indices_lock:
            if self.indices_checked:
                return None
            last = self.feed.cache.last
            if last is None or last.snapshot.error is not None:
                return None
            now = gpu_indices(last.snapshot.gpus)
            moved = check_indices(self.plugin_dir / INDICES_FILE, self.settings.shared_gpus, now,
                                  "DRA plugin")  # fmt: skip
            self.counts.moved = moved
            for m in moved:
                self._post_moved(m)
            self.indices_checked = True
            return moved

    def _post_moved(self, moved: IndexMoved) -> None:
        """The Warning Event ``SharedGpuIndexMoved`` on the Node
        (``kube.index_moved.post_index_moved``); a failure is logged."""
        if self.session is not None:
            post_index_moved(self.session, self.pool, moved, "DRA plugin")

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def devices(self) -> tuple[list[DraDevice] | None, str]:
        """The node's devices in the latest reading (``core.publish.dra.inventory``, the publisher's
        rule), or ``(None, why)``: no reading yet, NVML unreadable, or the reading older than
        the stuck bound on the plugin's clock (``stale-reading``)."""
        last = self.feed.cache.last
        if last is None:
            return None, "no reading of the GPUs yet (the agent has not finished its first tick)"
        age_s = self._age.age_s(last.snapshot, float(self.feed.clock()))
        if age_s > self.stale_after_s:
            return None, (f"stale-reading: the agent's reading is {age_s:.0f}s old (over "
                          f"{self.stale_after_s:.0f}s)")  # fmt: skip
        if last.snapshot.error is not None:
            return None, f"NVML cannot be read: {last.snapshot.error}"
        s = self.settings
        return inventory(last.snapshot, last.health, self.sharing, s.memory_step_mib,
                         s.hysteresis_pct), ""  # fmt: skip

    def _facts(self, devices: Sequence[DraDevice]) -> NodeFacts:
        """What prepare reads from the node: device nodes, minors, MPS daemons."""
        minors = gpu_minors(self.settings.proc_root)
        names = {f"nvidia{minors.get(d.gpu_uuid or '', d.gpu_index)}" for d in devices}
        mps_up = {}
        if self.mps is not None:
            for d in devices:
                if d.shared and d.gpu_uuid:
                    e = self.mps.enforcement(d.gpu_uuid)
                    mps_up[d.gpu_uuid] = (e.up, e.reason)
        last = self.feed.cache.last
        return NodeFacts(
            pool=self.pool, dev_root=self.dev_root,
            nodes=device_nodes(self.dev_root, sorted(names) + list(CONTROL_NODES)),
            minors=minors, mps=self.layout, mps_up=mps_up,
            thread_share=self.settings.mps_thread_share,
            driver_major=driver_major(last.snapshot.driver_version) if last is not None else None,
        )  # fmt: skip

    # -- prepare / unprepare -----------------------------------------------------------------

    def _get_claim(self, ref: ClaimRef) -> dict[str, Any]:
        """GET the ResourceClaim. Raises ``Refused`` (not found, no session) or ``KubeError``."""
        if self.session is None:
            raise Refused("the DRA plugin has no Kubernetes API session to read the claim")
        session = self.session
        try:
            response = session.call(
                "get", f"resourceclaim {ref.namespace}/{ref.name}",
                lambda: session.http("GET", _CLAIM_PATH,
                                     path_params={"namespace": ref.namespace, "name": ref.name}),
                rbac="the DRA plugin needs get on resourceclaims.resource.k8s.io",
            )  # fmt: skip
        except KubeNotFound:
            raise Refused(f"ResourceClaim {ref.namespace}/{ref.name} not found") from None
        doc = json.loads(response.data)
        if not isinstance(doc, dict):
            raise Refused(f"ResourceClaim {ref.namespace}/{ref.name}: not an object")
        return doc

    def prepare(self, ref: ClaimRef) -> tuple[list[dict[str, Any]], str]:
        """Prepare one claim: ``(devices, "")`` (the kubelet's ``Device`` fields each, and the
        ``uuid`` prepared) or ``([], error)``. A claim in the checkpoint is answered from it
        once its devices are checked to be the same GPUs now (``prepare.check_checkpointed``:
        a GPU gone or another one under the name fails the claim with that reason and rewrites
        no CDI spec; its CDI file is written again if it went); else the claim is read, decided
        (``prepare.decide``), its CDI spec written and the checkpoint saved. A failure leaves no
        file and no entry. Never raises: an unexpected error fails this claim alone (counted
        ``failed``, logged with its traceback), never the kubelet's whole call."""
        try:
            return self._prepare(ref)
        except Exception as exc:  # one claim's surprise must not fail the others of the call
            self.counts.prepare["failed"] += 1
            logger.exception("DRA: claim {}/{} ({}) failed", ref.namespace, ref.name, ref.uid)
            return [], f"internal error preparing claim {ref.namespace}/{ref.name}: {exc!r:.200}"

    def _prepare(self, ref: ClaimRef) -> tuple[list[dict[str, Any]], str]:
        with self._lock:
            entry = self.checkpoint.claims.get(ref.uid)
            if entry is not None:
                if entry.devices:
                    now, why = self.devices()
                    try:
                        check_checkpointed(entry.devices, now, why)
                    except Refused as exc:
                        self.counts.prepare["refused"] += 1
                        logger.warning("DRA: prepared claim {}/{} ({}) refused: {}", ref.namespace,
                                       ref.name, ref.uid, exc)  # fmt: skip
                        return [], str(exc)
                try:
                    self._ensure_file(entry)
                except OSError as exc:
                    self.counts.prepare["failed"] += 1
                    return [], f"cannot write the CDI spec of claim {ref.uid}: {exc}"
                self.counts.prepare["repeated"] += 1
                return [dict(d) for d in entry.devices], ""
        try:
            claim = self._get_claim(ref)
            devices, why = self.devices()
            facts = self._facts(devices or ())
            with self._slices_lock:
                facts = replace(facts, pending=self._pending(devices or ()))
                prepared = decide(claim, ref, devices, facts, no_reading=why)
                self._book(prepared, devices or ())
        except Refused as exc:
            self.counts.prepare["refused"] += 1
            logger.warning("DRA: claim {}/{} ({}) refused: {}", ref.namespace, ref.name, ref.uid, exc)
            return [], str(exc)
        except KubeError as exc:
            self.counts.prepare["failed"] += 1
            logger.warning("DRA: claim {}/{} cannot be read: {}", ref.namespace, ref.name, exc)
            return [], f"cannot read ResourceClaim {ref.namespace}/{ref.name}: {exc}"
        why = self._ask_daemons(prepared)
        if why:
            self._unbook(ref.uid)
            self.counts.prepare["refused"] += 1
            logger.warning("DRA: claim {}/{} ({}) refused: {}", ref.namespace, ref.name, ref.uid, why)
            return [], why
        with self._lock:
            entry = self.checkpoint.claims.get(ref.uid)
            if entry is None:
                try:
                    entry = self._record(prepared)
                except OSError as exc:
                    self._unbook(ref.uid)
                    self._let_go(ref.uid, [d.device for d in prepared.devices])
                    self.counts.prepare["failed"] += 1
                    logger.error("DRA: claim {} not prepared: {}", ref.uid, exc)
                    return [], f"cannot record claim {ref.uid}: {exc}"
                self.counts.prepare["prepared"] += 1
                logger.info("DRA: prepared claim {}/{} ({}): {}", ref.namespace, ref.name,
                            ref.uid, ", ".join(d.device for d in prepared.devices) or "no device")  # fmt: skip
            else:
                self.counts.prepare["repeated"] += 1
            return [dict(d) for d in entry.devices], ""

    def _ask_daemons(self, prepared: PreparedClaim) -> str:
        """Ask for the MPS daemon of each slice of ``prepared`` and wait until it is up
        (``sources.mps.SliceDaemons.ask``): ``""``, or why one did not come up (those asked
        are let go again: fail closed, the container never starts without its daemon)."""
        if self.daemons is None:
            return ""
        asked: list[str] = []
        for d in prepared.devices:
            if d.daemon is None:
                continue
            try:
                self.daemons.ask(replace(d.daemon, at_s=time.time()))
            except (SliceUnavailable, OSError) as exc:
                for sid in asked:
                    self.daemons.release(sid)
                return (f"device {d.device}: the MPS daemon of its {d.mib} MiB slice did not "
                        f"come up: {exc}: the slice cannot be enforced")  # fmt: skip
            asked.append(d.daemon.sid)
        return ""

    def _let_go(self, claim_uid: str, names: Iterable[object]) -> None:
        """Let go of the MPS daemons of ``claim_uid``'s slices (``names``: its devices' names;
        a device that is no slice has no request: nothing to do)."""
        if self.daemons is None:
            return
        for name in names:
            if isinstance(name, str):
                self.daemons.release(claim_slice_id(claim_uid, name))

    def _sweep_daemons(self) -> None:
        """Let go of the daemons asked for by claims this plugin no longer holds (unprepared
        while it was down). Called under ``_lock`` at start."""
        if self.daemons is None:
            return
        for sid, req in self.daemons.requests().items():
            uid = req.holder.split(":")[1] if req.holder.startswith("claim:") else ""
            if uid not in self.checkpoint.claims:
                self.daemons.release(sid)
                logger.info("DRA: the MPS daemon of slice {} ({}) let go: its claim is not "
                            "prepared here", sid, req.holder[:80])  # fmt: skip

    def _pending(self, devices: Sequence[DraDevice]) -> dict[str, tuple[PendingSlice, ...]]:
        """GPU UUID -> the slices prepared there that still count against its free memory
        (``prepare.slices_pending`` at each shared device's ``free_memory_mib``, on the agent's
        clock); the book keeps only those. A GPU not in ``devices`` keeps its slices. Called
        under ``_slices_lock``."""
        now_s = float(self.feed.clock())
        for d in devices:
            gpu = d.gpu_uuid or d.uuid
            if not d.shared or gpu is None or gpu not in self.slices:
                continue
            kept = slices_pending(self.slices[gpu], d.free_memory_mib, now_s,
                                  self.settings.share_settle_s)  # fmt: skip
            if kept:
                self.slices[gpu] = kept
            else:
                del self.slices[gpu]
        return dict(self.slices)

    def _book(self, prepared: PreparedClaim, devices: Sequence[DraDevice]) -> None:
        """Book the slices of ``prepared`` on their GPUs (at the free memory they were judged
        by), in place of any of the same claim's. Called under ``_slices_lock``."""
        known = {d.name: d for d in devices}
        now_s = float(self.feed.clock())
        for p in prepared.devices:
            dev = known.get(p.device)
            gpu = (dev.gpu_uuid or dev.uuid) if dev is not None else None
            if p.mib is None or dev is None or gpu is None:
                continue
            kept = [s for s in self.slices.get(gpu, ()) if s.claim_uid != prepared.ref.uid]
            self.slices[gpu] = (*kept, PendingSlice(prepared.ref.uid, p.mib, now_s, dev.free_memory_mib))

    def _unbook(self, claim_uid: str) -> None:
        """Take the claim's slices out of the book (unprepared, or never recorded)."""
        with self._slices_lock:
            for gpu in list(self.slices):
                kept = tuple(s for s in self.slices[gpu] if s.claim_uid != claim_uid)
                if kept:
                    self.slices[gpu] = kept
                else:
                    del self.slices[gpu]

    def _record(self, prepared: PreparedClaim) -> Entry:
        """Write the claim's CDI file and its checkpoint entry; undo both on failure. Raises
        ``OSError``."""
        ref = prepared.ref
        devices = tuple(
            {"request_names": list(d.request_names), "pool_name": d.pool, "device_name": d.device,
             "cdi_device_ids": [d.cdi_id], "uuid": d.uuid,
             **({"share_id": d.share_id} if d.share_id else {})}
            for d in prepared.devices
        )  # fmt: skip
        spec = cdi_spec(prepared) if prepared.devices else None
        entry = Entry(ref.namespace, ref.name, devices, spec,
                      cdi_file_name(ref.uid) if spec is not None else None)  # fmt: skip
        path = self.cdi_dir / entry.cdi_file if entry.cdi_file else None
        try:
            if path is not None and spec is not None:
                write_atomic(path, spec_bytes(spec))
            self.checkpoint.claims[ref.uid] = entry
            self.checkpoint.save()
        except OSError:
            self.checkpoint.claims.pop(ref.uid, None)
            if path is not None:
                try:
                    remove(path)
                except OSError:
                    pass
            raise
        return entry

    def _ensure_file(self, entry: Entry) -> None:
        if entry.cdi_file and entry.spec is not None:
            path = self.cdi_dir / entry.cdi_file
            if not path.exists():
                logger.warning("DRA: CDI spec {} went missing: written again", path)
                write_atomic(path, spec_bytes(entry.spec))

    def unprepare(self, ref: ClaimRef) -> str:
        """Unprepare one claim: remove its CDI file and checkpoint entry, and its slices from the
        book of those pending; ``""`` on success (a claim not prepared here too: its CDI file is
        removed if one was left), else the error. Never raises (as ``prepare``)."""
        try:
            return self._unprepare(ref)
        except Exception as exc:
            self.counts.unprepare["failed"] += 1
            logger.exception("DRA: claim {}/{} ({}) not unprepared", ref.namespace, ref.name, ref.uid)
            return f"internal error unpreparing claim {ref.namespace}/{ref.name}: {exc!r:.200}"

    def _unprepare(self, ref: ClaimRef) -> str:
        with self._lock:
            entry = self.checkpoint.claims.get(ref.uid)
            try:
                remove(self.cdi_dir / cdi_file_name(ref.uid))
                if entry is not None and entry.cdi_file:
                    remove(self.cdi_dir / entry.cdi_file)
            except OSError as exc:
                self.counts.unprepare["failed"] += 1
                return f"cannot remove the CDI spec of claim {ref.uid}: {exc}"
            if entry is None:
                self._unbook(ref.uid)
                self.counts.unprepare["unknown"] += 1
                return ""
            self._let_go(ref.uid, [d.get("device_name") for d in entry.devices])
            del self.checkpoint.claims[ref.uid]
            try:
                self.checkpoint.save()
            except OSError as exc:
                self.checkpoint.claims[ref.uid] = entry
                self.counts.unprepare["failed"] += 1
                return f"cannot update the checkpoint: {exc}"
            self._unbook(ref.uid)
            self.counts.unprepare["unprepared"] += 1
            logger.info("DRA: unprepared claim {}/{} ({})", ref.namespace, ref.name, ref.uid)
            return ""

    # -- health ----------------------------------------------------------------------------

    def health_now(self) -> tuple[dra_health.DeviceHealth, ...]:
        """Every device's health now (``health.report``), the prepared ones included."""
        devices, why = self.devices()
        with self._lock:
            known = {str(d["device_name"]) for e in self.checkpoint.claims.values()
                     for d in e.devices}  # fmt: skip
        return dra_health.report(devices, known, why or "no reading of the GPUs yet")

    def health_reports(self, active: Callable[[], bool]) -> Iterator[tuple[dra_health.DeviceHealth, ...]]:
        """The health stream: the report now, then one at each tick of the agent (a refresh
        the kubelet needs within ``health_timeout_s``, and every change), until the plugin
        stops or ``active()`` turns false."""
        with self._wake:
            seen = self._ticks
        yield self.health_now()
        while not self._stopping.is_set() and active():
            with self._wake:
                if self._ticks == seen:
                    self._wake.wait(self.poll_s)
                if self._ticks == seen:
                    continue
                seen = self._ticks
            if self._stopping.is_set():
                return
            yield self.health_now()

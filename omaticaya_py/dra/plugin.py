"""The kubelet DRA plugin of ``gpu.omaticaya.io``: registration, ``DRAPlugin`` v1 and device
health, served over unix sockets with grpcio.

Sockets (what the kubelet v1.37 expects, from its ``pluginmanager`` and ``cm/dra``):

- ``<OMATICAYA_DRA_REGISTRY_DIR>/gpu.omaticaya.io-reg.sock``: ``pluginregistration.Registration``.
  The kubelet's plugin watcher finds it (inotify, and a walk of the folder at its own start, so
  a restarted kubelet registers the plugin again by itself), calls ``GetInfo`` (type
  ``DRAPlugin``, name ``gpu.omaticaya.io``, endpoint the DRA socket's path, supported versions
  ``v1.DRAPlugin``, ``v1.DRAResourceHealth``, ``v1alpha1.DRAResourceHealth``: the kubelet picks
  the newest of each it knows) and ``NotifyRegistrationStatus``. A socket that disappears is
  served again (the folder is watched, and checked every ``resync_s``: the lifecycle is
  ``kubeletplugin.KubeletPluginHost``'s, the device plugin's too); a failed registration is
  logged and the socket re-created after ``resync_s``, which makes the watcher try again
  (``registration``).
- ``<OMATICAYA_DRA_PLUGIN_DIR>/dra.sock``: ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``
  (``NodePrepareResources``, ``NodeUnprepareResources``) and ``DRAResourceHealth`` v1 and
  v1alpha1 (``NodeWatchResources``) on the same socket (``services``): the kubelet calls the health service on
  the DRA endpoint. The endpoint is given to the kubelet as a path: the plugin folder must be the
  same path on the host and in the plugin's container.

Prepared claims: one CDI spec file per claim in ``OMATICAYA_DRA_CDI_DIR``
(``prepare.cdi_file_name``), recorded in ``<plugin dir>/checkpoint.json`` (``host.Checkpoint``;
``claims.ClaimState``).
The slices of shared GPUs prepared are also kept in memory per GPU (``sharing.SliceBook``)
until the reading shows them, ``OMATICAYA_SHARE_SETTLE_S`` passes, or their claim is
unprepared: prepare refuses a slice they leave no room for (``prepare.live_room``). After a
restart, slices prepared before it count only once the reading shows them, as the device
plugin's do.
``stop()`` removes both sockets (registration first) and keeps the checkpoint and CDI specs:
running containers keep their devices, and a restarted plugin unprepares what it prepared.

Device identity: devices are named by their GPU's UUID (``core.publish.dra.device_name``), every
checkpointed device records the UUID it was prepared on and is checked against the reading at
each prepare (``host.check_checkpointed``). At the first reading after each start the plugin
compares each GPU's NVML index -> UUID with the last start's (``<plugin dir>/gpu-indices.json``,
``sources.gpu_indices``): an ``OMATICAYA_SHARED_GPUS`` index that now names another GPU is
reported by a log line, a Warning Event ``SharedGpuIndexMoved`` on the Node and the gauge
``omaticaya_shared_gpu_index_moved`` (``check_indices``: ``kubeletplugin.IndexCheck``, the
device plugin's step).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loguru import logger

from ..core.config.settings import Settings
from ..core.model.sharing import IndexMoved
from ..core.publish.dra import DRIVER, DraDevice
from ..core.publish.readings import AgentFeed, TickResult
from ..kube.errors import KubeError, KubeNotFound
from ..kube.index_moved import post_index_moved
from ..kube.session import ApiSession
from ..kubeletplugin import Backoff, IndexCheck, KubeletPluginHost, PluginSteps, ServedSocket
from ..sources.mps import MpsWatch, SliceDaemons
from . import healthreport as dra_health
from .claims import ClaimState
from .deviceinfo import NodeDevices
from .host import INDICES_FILE
from .metrics import DraCounts
from .pluginregistration import api_pb2_grpc as reg_grpc
from .prepare import OWNER, ClaimRef, Refused, decide
from .registration import (
    DRA_SOCKET,
    PLUGIN_TYPE,
    SUPPORTED_VERSIONS,
    RegistrationService,
    registration_socket_name,
)
from .services import add_dra_services
from .sharing import SliceBook, SliceDaemonRequests

__all__ = ["DRA_SOCKET", "PLUGIN_TYPE", "SUPPORTED_VERSIONS", "DraPlugin", "PluginTiming",
           "registration_socket_name"]  # fmt: skip

_CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"


@dataclass(frozen=True, slots=True)
class PluginTiming:
    """How the DRA plugin keeps time, seconds: ``resync_s``, how often its sockets are checked
    besides the folders' events, and how long after a refused registration (or a socket that
    cannot be served) it serves again; ``poll_s``, how often a health stream looks for a tick
    besides the tick's own wake-up."""

    resync_s: float = 5.0
    poll_s: float = 1.0


class DraPlugin:
    """The kubelet DRA plugin of ``gpu.omaticaya.io`` over the agent's reading.

    - ``feed``: the agent (``core.publish.readings.AgentFeed``): its latest reading (``cache.last``),
      tick listeners (``on_tick``: each tick wakes the health streams) and clock.
    - ``settings``: ``dra_plugin_dir``, ``dra_registry_dir``, ``dra_cdi_dir``, ``dra_dev_root``,
      ``node_name`` (the pool; required), ``shared_gpus``, ``share_unit_mib``,
      ``share_enforcement``, ``mps_root``, ``mps_state_dir``, ``mps_stale_s``,
      ``mps_thread_share``, ``settle_s``, ``memory_step_mib``, ``hysteresis_pct``,
      ``proc_root`` and the stuck-reading bound (``stuck_after_s``).
    - ``session``: the API session that GETs ResourceClaims (``kube.session.ApiSession``; the
      agent's ``node.session``); ``None``: every claim of ours is refused.
    - ``mps``: the agent's watch of the MPS daemons (``agent.mps``); ``None`` while shared GPUs
      are enforced by MPS: the plugin reads the daemons' states itself.
    - ``counts``: the prepare/unprepare counters (``metrics.DraCounts``) shown on /metrics.
    - ``timing``: ``PluginTiming`` (resync and health-stream poll, seconds).

    ``prepare(ref)`` and ``unprepare(ref)`` are the per-claim halves of the two RPCs
    (``services``); ``health_reports`` the health stream. The sockets' lifecycle is ``host``'s
    (``kubeletplugin.KubeletPluginHost``). Raises ``ValueError`` without a node name.
    """

    def __init__(self, feed: AgentFeed, settings: Settings, session: ApiSession | None,
                 mps: MpsWatch | None = None, *, counts: DraCounts | None = None,
                 timing: PluginTiming = PluginTiming()) -> None:  # fmt: skip
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
        #: the devices and what prepare reads from the node (``deviceinfo.NodeDevices``)
        self.counts = counts if counts is not None else DraCounts()
        self.node = NodeDevices(feed, settings, mps, self.counts)
        self.layout, self.mps = self.node.layout, self.node.mps
        #: the kubelet shows a device Unknown this long after its last report
        self.health_timeout_s = max(1, math.ceil(self.node.stale_after_s))
        self.resync_s = timing.resync_s
        self.poll_s = timing.poll_s
        #: the slices of shared GPUs prepared and not yet shown by the reading, and their MPS
        #: daemons (asked for at prepare, let go at unprepare)
        self.book = SliceBook(feed.clock, settings.settle_s)
        self.daemons = SliceDaemonRequests(
            SliceDaemons(self.layout, OWNER, settings.mps_stale_s) if self.layout is not None else None)
        self.claims = ClaimState(self.plugin_dir, self.cdi_dir, self.counts, self.book, self.daemons)
        self.checkpoint = self.claims.checkpoint
        self._lock = self.claims.lock  # the checkpoint and the CDI files
        #: the kubelet's refusals of the registration
        self.registration_errors: list[str] = []
        self._wake = threading.Condition()
        self._ticks = 0
        self._reregister_at: float | None = None
        self._indices = IndexCheck(self.plugin_dir / INDICES_FILE, settings.shared_gpus, "DRA plugin")
        self._dra = ServedSocket(self.dra_socket, lambda server: add_dra_services(server, self),
                                 rpc_threads="dra-rpc")  # fmt: skip
        self._registration = ServedSocket(
            self.registration_socket,
            lambda server: reg_grpc.add_RegistrationServicer_to_server(
                RegistrationService(self.dra_socket, self._registration_status), server),
            rpc_threads="dra-registration",
        )  # fmt: skip
        steps = PluginSteps(sync=self._sync, failed=self._log_failure, wake=self._notify)
        self.host = KubeletPluginHost(
            "DRA plugin", [self._registration, self._dra], steps,
            backoff=Backoff(timing.resync_s, timing.resync_s, timing.resync_s),
        )  # fmt: skip
        self._stopping = self.host.stopping

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def slices(self) -> dict[str, tuple[Any, ...]]:
        """GPU UUID -> the slices prepared there the reading does not show yet
        (``sharing.SliceBook.slices``)."""
        return self.book.slices

    @property
    def registered(self) -> threading.Event:
        """Set once the kubelet said it registered the plugin."""
        return self.host.registered

    @property
    def registrations(self) -> int:
        """Registrations the kubelet confirmed."""
        return self.host.registrations

    @property
    def registration_serves(self) -> int:
        """Registration sockets served."""
        return self._registration.serves

    @property
    def indices_checked(self) -> bool:
        """Whether this start's first reading was compared with the last start's GPU indices."""
        return self._indices.done

    def start(self) -> None:
        """Load the checkpoint, find the driver's files (``deviceinfo.NodeDevices.start``),
        serve the DRA socket, then the registration socket; watch both folders and re-serve a
        socket that disappears. Raises ``OSError`` when a socket cannot be served."""
        for folder in (self.plugin_dir, self.registry_dir, self.cdi_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._stopping.clear()
        self.claims.load()
        self.node.start()
        if self._on_tick not in self.feed.on_tick:
            self.feed.on_tick.append(self._on_tick)
        self._dra.serve()
        self._serve_registration()
        self.host.start()
        logger.info("DRA plugin {} serving {} (registration {}); {} prepared claim(s) in the "
                    "checkpoint", DRIVER, self.dra_socket, self.registration_socket,
                    len(self.checkpoint.claims))  # fmt: skip

    def stop(self, grace_s: float = 1.0) -> None:
        """Stop: the registration socket first (the kubelet deregisters the plugin), then the
        DRA socket; the health streams end. The checkpoint and CDI specs stay."""
        self.host.stop(grace_s)
        self.registered.clear()

    def wait_registered(self, timeout_s: float) -> bool:
        """True once the kubelet said it registered the plugin (within ``timeout_s``)."""
        return self.host.wait_registered(timeout_s)

    def _serve_registration(self) -> None:
        self.registered.clear()
        self._reregister_at = None
        self._registration.serve()

    def _registration_status(self, registered: bool, error: str) -> None:
        if registered:
            self.host.note_registered()
            logger.info("DRA plugin {} registered with the kubelet", DRIVER)
            return
        self.registration_errors.append(error)
        self._reregister_at = time.monotonic() + self.resync_s
        logger.error("DRA plugin {}: the kubelet refused the registration ({}); the "
                     "registration socket is served again in {:.0f}s", DRIVER, error,
                     self.resync_s)  # fmt: skip
        self.host.kick()

    def _sync(self) -> None:
        """The host's step: compare the GPU indices once; serve again a socket that went, and
        the registration socket ``resync_s`` after a refusal. Raises ``OSError``."""
        self.check_indices()
        if not self.dra_socket.is_socket():
            logger.warning("DRA plugin socket {} removed: serving again", self.dra_socket)
            self._dra.serve()
        again = self._reregister_at is not None and time.monotonic() >= self._reregister_at
        if again or not self.registration_socket.is_socket():
            if not again:
                logger.warning("DRA registration socket {} removed: serving again",
                               self.registration_socket)  # fmt: skip
            self._serve_registration()

    def _log_failure(self, detail: str, delay_s: float) -> None:
        logger.warning("DRA plugin: cannot serve again ({}); retrying in {:.0f}s", detail, delay_s)

    # -- the reading ------------------------------------------------------------------------

    def _on_tick(self, _result: TickResult) -> None:
        with self._wake:
            self._ticks += 1
            self._wake.notify_all()
        if not self.indices_checked:
            self.host.kick()  # the managing thread compares the GPU indices (API work: not here)

    def check_indices(self) -> tuple[IndexMoved, ...] | None:
        """Once per start, at the first readable reading: compare each GPU's NVML index -> UUID
        (``nvmlDeviceGetIndex``/``nvmlDeviceGetUUID`` of ``feed.cache.last``) with the last
        start's (``<plugin dir>/gpu-indices.json``), report each ``OMATICAYA_SHARED_GPUS``
        index that names another GPU now (``core.model.sharing.moved_indices``: a warning log line, a
        Warning Event ``SharedGpuIndexMoved`` on the Node, ``counts.moved`` for the gauge
        ``omaticaya_shared_gpu_index_moved``), then write this start's map
        (``kubeletplugin.IndexCheck``). Returns what moved, or ``None`` before a readable
        reading (and once done). Never raises: a file or API error is logged."""
        return self._indices(self.feed.cache.last, self._record_moved)

    def _record_moved(self, moved: tuple[IndexMoved, ...]) -> None:
        """``counts.moved`` for the gauge, and the Warning Event ``SharedGpuIndexMoved`` on the
        Node for each (``kube.index_moved.post_index_moved``; a failure is logged)."""
        self.counts.moved = moved
        if self.session is not None:
            for m in moved:
                post_index_moved(self.session, self.pool, m, "DRA plugin")

    def _notify(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def devices(self) -> tuple[list[DraDevice] | None, str]:
        """The node's devices in the latest reading, or ``(None, why)``
        (``deviceinfo.NodeDevices.devices``)."""
        return self.node.devices()

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
        once its devices are checked to be the same GPUs now (``claims.ClaimState.repeat``);
        else the claim is read, decided (``prepare.decide``), its slices booked and their MPS
        daemons asked for, its CDI spec written and the checkpoint saved
        (``claims.ClaimState.record``). A failure leaves no file and no entry. Never raises: an
        unexpected error fails this claim alone (counted ``failed``, logged with its
        traceback), never the kubelet's whole call."""
        try:
            return self._prepare(ref)
        except Exception as exc:  # one claim's surprise must not fail the others of the call
            self.counts.prepare["failed"] += 1
            logger.exception("DRA: claim {}/{} ({}) failed", ref.namespace, ref.name, ref.uid)
            return [], f"internal error preparing claim {ref.namespace}/{ref.name}: {exc!r:.200}"

    def _prepare(self, ref: ClaimRef) -> tuple[list[dict[str, Any]], str]:
        answer = self.claims.repeat(ref, self.devices)
        if answer is not None:
            return answer
        try:
            claim = self._get_claim(ref)
            devices, why = self.devices()
            facts = self.node.facts(devices or ())
            with self.book.lock:
                facts = replace(facts, pending=self.book.pending(devices or ()))
                prepared = decide(claim, ref, devices, facts, no_reading=why)
                self.book.book(prepared, devices or ())
        except Refused as exc:
            self.counts.prepare["refused"] += 1
            logger.warning("DRA: claim {}/{} ({}) refused: {}", ref.namespace, ref.name, ref.uid, exc)
            return [], str(exc)
        except KubeError as exc:
            self.counts.prepare["failed"] += 1
            logger.warning("DRA: claim {}/{} cannot be read: {}", ref.namespace, ref.name, exc)
            return [], f"cannot read ResourceClaim {ref.namespace}/{ref.name}: {exc}"
        why = self.daemons.ask(prepared)
        if why:
            self.book.unbook(ref.uid)
            self.counts.prepare["refused"] += 1
            logger.warning("DRA: claim {}/{} ({}) refused: {}", ref.namespace, ref.name, ref.uid, why)
            return [], why
        return self.claims.record(prepared)

    def unprepare(self, ref: ClaimRef) -> str:
        """Unprepare one claim: remove its CDI file and checkpoint entry, and its slices from the
        book of those pending (``claims.ClaimState.unprepare``); ``""`` on success (a claim not
        prepared here too: its CDI file is removed if one was left), else the error. Never
        raises (as ``prepare``)."""
        try:
            return self.claims.unprepare(ref)
        except Exception as exc:
            self.counts.unprepare["failed"] += 1
            logger.exception("DRA: claim {}/{} ({}) not unprepared", ref.namespace, ref.name, ref.uid)
            return f"internal error unpreparing claim {ref.namespace}/{ref.name}: {exc!r:.200}"

    # -- health ----------------------------------------------------------------------------

    def health_now(self) -> tuple[dra_health.DeviceHealth, ...]:
        """Every device's health now (``health.report``), the prepared ones included."""
        devices, why = self.devices()
        return dra_health.report(devices, self.claims.device_names(), why or "no reading of the GPUs yet")

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

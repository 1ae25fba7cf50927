"""The agent's Events. On the Node: GPU health changes (``GpuUnhealthy``, ``GpuRecovered``, by
GPU UUID) and out-of-band memory (``GpuOutOfBandMemory``, once per episode). On a pod holding a
slice of a shared GPU (``SliceWatch``), once per episode (``core.model.sharing.episodes``) when its
container's processes together hold more than its slice (``core.allocation.slice_enforcement``):
``GpuMemoryOverLimit`` where nothing enforces it, ``SliceOverLimitProcesses`` when its GPU's MPS
daemon is up and it runs several processes each within the slice (MPS's limit is per process),
``MpsLimitNotEnforced`` (on the pod and on the Node) when one process escaped the daemon; with
``OMATICAYA_SLICE_OVER_LIMIT_ACTION=evict`` the pod is then evicted (``policy/v1`` Eviction).
``MpsDaemonRestarted`` on the pods holding slices of a GPU whose MPS daemon was restarted (once
per restart per pod). ``SliceWatch`` also reads the holders' pods from the API first
(``attribution.PodNames``), so that the next tick's attribution tells each slice's own use
(``core.allocation.slice_use.gpu_slices``). Runs in the API round (``agent.api_thread``), never on the read
path; a failure is logged once per kind and counted (``errors``), and the next round tries
again."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from loguru import logger

from ..core.allocation.mps import slice_id
from ..core.allocation.slice_enforcement import (
    DAEMON_RESTARTED,
    NOT_ENFORCED,
    OVER_LIMIT,
    OVER_LIMIT_PROCESSES,
    DaemonGeneration,
    OverLimit,
    daemon_generation,
    daemon_restarted,
    judge,
    over_counts,
)
from ..core.allocation.slice_use import SliceUse, gpu_slices, over_limit
from ..core.config.settings import Settings
from ..core.model.sayonce import SayOnce
from ..core.model.sharing import Sharing, episodes, is_shared
from ..core.model.snapshot import NodeSnapshot
from ..core.rules.attribution import GpuAttribution, PodIdentity
from ..core.rules.health import NodeHealth
from ..core.schema.events import GPU_OUT_OF_BAND_MEMORY, GPU_RECOVERED, GPU_UNHEALTHY
from ..kube import KubeError, KubeForbidden, KubeNotFound, NodeClient
from ..kube.errors import KubeConflict, KubeTooManyRequests
from ..kube.pod_client import PodClient
from ..sources.mps import MpsWatch, read_slice_state
from .attribution_reader import PodNames

__all__ = [
    "DAEMON_RESTARTED",
    "NOT_ENFORCED",
    "OVER_LIMIT",
    "OVER_LIMIT_PROCESSES",
    "HealthEvents",
    "SliceWatch",
    "mps_enforcement",
]

#: posts a Warning Event on the agent's Node: ``(reason, message)``; raises ``KubeError``
NodeEvent = Callable[[str, str], None]


def mps_enforcement(watch: MpsWatch | None, uuids: Iterable[str]) -> dict[str, str] | None:
    """Each of ``uuids`` (shared GPUs) -> ``"up"`` while its MPS daemon is up
    (``watch.enforcement``), else the reason it is not; ``None`` without a watch (enforcement
    off): the shape ``core.allocation.slice_enforcement.judge`` and the telemetry's ``mps`` fields take."""
    if watch is None:
        return None
    return {u: "up" if e.up else e.reason for u, e in watch.all(uuids).items()}


class HealthEvents:
    """Posts an Event for each GPU whose health differs from the last one reported.

    GPUs are keyed by UUID (their index when NVML gave none): indices shift when a GPU is gone
    after a re-init, UUIDs do not. A GPU whose Event could not be posted (API down) is compared
    again next time, so no change is lost. A GPU starts as healthy: one unhealthy at the first
    reading gets its Event too. ``posted`` counts Events by reason (for ``/metrics``)."""

    def __init__(self) -> None:
        self.posted: Counter[str] = Counter()
        #: said once posted: GPUs reported unhealthy; devices in an out-of-band episode
        self._unhealthy: SayOnce[str | int, bool] = SayOnce()
        self._out_of_band: SayOnce[str, bool] = SayOnce()

    def post(self, node: NodeClient, node_uid: str, after: NodeHealth, snapshot: NodeSnapshot):
        """Post the Events due for ``after`` on the Node ``node_uid`` (``events.k8s.io``
        through ``NodeClient.create_node_event``); failures are logged, never raised."""
        uuids = {g.index: g.uuid for g in snapshot.gpus}
        for index, gpu in after.gpus.items():
            key: str | int = uuids.get(index) or index
            if (key not in self._unhealthy) == gpu.healthy:
                continue
            reason = GPU_RECOVERED if gpu.healthy else GPU_UNHEALTHY
            detail = "healthy again" if gpu.healthy else "unhealthy: " + ",".join(gpu.reasons)
            try:
                node.create_node_event(
                    node_uid=node_uid,
                    reason=reason,
                    message=f"GPU {index} {detail}",
                    warning=not gpu.healthy,
                )
            except KubeError as exc:
                logger.warning("could not post Event {} for GPU {}: {}", reason, index, exc)
                continue
            self.posted[reason] += 1
            if gpu.healthy:
                self._unhealthy.end(key)
            else:
                self._unhealthy.start(key, True)

    def post_out_of_band(
        self,
        node: NodeClient,
        node_uid: str,
        attribution: Mapping[str, GpuAttribution],
        snapshot: NodeSnapshot,
        threshold_mib: int,
    ) -> None:
        """A ``GpuOutOfBandMemory`` Warning once per episode: when the memory of processes in
        no pod on one GPU or MIG device reaches ``threshold_mib``; the episode ends when it
        falls below (then a later rise is a new Event). A failed post is tried next tick."""
        names = _device_names(snapshot)
        for device_id, att in attribution.items():
            over = att.out_of_band_memory_mib >= threshold_mib
            if not over:
                self._out_of_band.end(device_id)
                continue
            if device_id in self._out_of_band:
                continue
            pids = ",".join(map(str, att.out_of_band_pids[:10]))
            try:
                node.create_node_event(
                    node_uid=node_uid,
                    reason=GPU_OUT_OF_BAND_MEMORY,
                    message=f"{names.get(device_id, device_id)}: {att.out_of_band_memory_mib} MiB "
                    f"held by processes in no pod (PIDs {pids}), over {threshold_mib} MiB",
                    warning=True,
                )
            except KubeError as exc:
                logger.warning("could not post Event {} for {}: {}", GPU_OUT_OF_BAND_MEMORY,
                               device_id, exc)  # fmt: skip
                continue
            self.posted[GPU_OUT_OF_BAND_MEMORY] += 1
            self._out_of_band.start(device_id, True)


def _device_names(snapshot: NodeSnapshot) -> dict[str, str]:
    """UUID -> ``GPU <index>`` or ``GPU <index> MIG <slot>``, for Event messages."""
    out: dict[str, str] = {}
    for g in snapshot.gpus:
        if g.uuid:
            out[g.uuid] = f"GPU {g.index}"
        for m in g.mig_devices:
            if m.uuid:
                out[m.uuid] = f"GPU {g.index} MIG {m.index}"
    return out


class SliceWatch:
    """The API side of slices for one agent: ``names`` (``PodNames``), over-use Events,
    evictions and MPS daemon restarts.

    ``mps``: the MPS daemons' states (``sources.mps.MpsWatch``; ``None``: enforcement off), so
    that a container over its slice on a GPU whose daemon is up is told apart
    (``core.allocation.slice_enforcement``), and a daemon restarted is said to its GPU's pods.
    ``action``: ``settings.slice_over_limit_action`` (``evict``: a pod over its slice is
    evicted once its Event is posted). ``posted`` counts Events by reason (the agent's Event
    counter, shared); ``errors`` counts failed requests by kind (``get-forbidden``,
    ``get-failed``, ``event-failed``); ``over_now``: the containers over their slice at the
    last round, by ``(GPU index, UUID, enforced "true"|"false", reason)``
    (``core.allocation.slice_enforcement.over_counts``); ``episodes``: over-use episodes started, by
    ``(enforced, reason)``; ``evictions``: eviction attempts by result (``evicted``,
    ``blocked``: a PodDisruptionBudget refused it now (429), ``gone``: the pod, or the pod of
    that UID, no longer exists (404, 409), ``failed``: any other failure, ``skipped``: the pod
    as read from the API has no UID, counted once per pod). ``blocked`` and ``failed`` are
    tried again next round while the container is still over. The last four feed
    ``agent.collectors.SliceApiErrors`` and ``SliceOverLimit``."""

    def __init__(
        self, settings: Settings, posted: Counter[str] | None = None, mps: MpsWatch | None = None
    ) -> None:
        self.sharing = Sharing.of(settings)
        self.resource = settings.shared_resource
        self.action = settings.slice_over_limit_action
        self.mps = mps
        self.names = PodNames()
        self.posted: Counter[str] = posted if posted is not None else Counter()
        self.errors: Counter[str] = Counter()
        self.over_now: dict[tuple[str, str, str, str], int] = {}
        self.episodes: Counter[tuple[str, str]] = Counter()
        self.evictions: Counter[str] = Counter()
        self._reported: frozenset[tuple[str, str, str, str]] = frozenset()
        self._said: SayOnce[str, bool] = SayOnce()  # failures, by kind
        #: pods evicted (or gone) while over, by ``(namespace, name, UID)``: not asked again
        self._evicted: set[tuple[str, str, str]] = set()
        #: pods whose eviction failed, by ``(namespace, name)``: the kind said last (logged once)
        self._evict_said: SayOnce[tuple[str, str], str] = SayOnce(max_keys=256)
        #: each shared GPU's daemon as last read (``daemon_generation``), by UUID
        self._daemons: dict[str, DaemonGeneration] = {}
        #: restarts not yet said to every pod: UUID -> (the restart, the pods still to tell)
        self._restarts: dict[str, tuple[DaemonGeneration, set[tuple[str, str]]]] = {}

    def round(
        self,
        client: PodClient,
        snapshot: NodeSnapshot,
        attribution: Mapping[str, GpuAttribution],
        now_s: float,
        *,
        post: bool = True,
        node_event: NodeEvent | None = None,
    ) -> None:
        """Read the pods the names lack, then (``post``) the over-use Events due (an
        ``MpsLimitNotEnforced`` also through ``node_event``, on the Node), the evictions due
        (``action`` ``evict``) and the ``MpsDaemonRestarted`` Events due. Never raises
        ``KubeError``."""
        by_gpu = {
            g.uuid: (att, gpu_slices(att, g.uuid, self.sharing.unit_mib))
            for g in snapshot.gpus
            if is_shared(g, self.sharing) and g.uuid and (att := attribution.get(g.uuid))
        }
        for namespace, name in self.names.wanted(by_gpu, now_s):
            try:
                found: PodIdentity | None = client.get_pod(namespace, name)
            except KubeNotFound:
                found = None
            except KubeError as exc:
                self._fail("get-forbidden" if isinstance(exc, KubeForbidden) else "get-failed", exc)
                self.names.tried((namespace, name), now_s)  # again after refetch_s, not each tick
                continue
            self.names.asked((namespace, name), now_s, found)
        if post:
            self._post(client, snapshot, attribution, node_event)
            self._post_restarts(client, snapshot, {u: s for u, (_, s) in by_gpu.items()})

    def judged(
        self, snapshot: NodeSnapshot, attribution: Mapping[str, GpuAttribution]
    ) -> list[OverLimit]:
        """The slices over their limit now, each judged by its GPU's MPS enforcement (asked
        only for the GPUs with a slice over)."""
        over = over_limit(snapshot, attribution, self.sharing)
        uuids = dict.fromkeys(g.uuid for g, _ in over if g.uuid)
        return judge(over, mps_enforcement(self.mps, uuids))

    def _post(
        self, client: PodClient, snapshot: NodeSnapshot, attribution: Mapping[str, GpuAttribution],
        node_event: NodeEvent | None = None,
    ) -> None:  # fmt: skip
        judged = self.judged(snapshot, attribution)
        self.over_now = over_counts(judged)
        over = {o.key: o for o in judged}
        start, kept = episodes(self._reported, over)
        reported = set(kept)
        for key in start:
            o = over[key]
            s = o.slice
            pod = self.names.known.get((s.namespace, s.pod))
            message = o.message(self.resource)
            if self.action == "evict":
                message += (
                    "; the pod is evicted (OMATICAYA_SLICE_OVER_LIMIT_ACTION=evict; a "
                    "PodDisruptionBudget may put it off)"
                )
            try:
                client.create_pod_event(
                    namespace=s.namespace, name=s.pod, uid=pod.uid if pod else "",
                    reason=o.reason, warning=True, message=message,
                )
            except KubeError as exc:
                self._fail("event-failed", exc)
                continue
            self.posted[o.reason] += 1
            self.episodes[("true" if o.escaped else "false", o.reason)] += 1
            reported.add(key)
            if o.escaped and node_event is not None:  # the node's MPS failed: say it there too
                try:
                    node_event(o.reason, f"pod {s.namespace}/{s.pod}: {message}")
                except KubeError as exc:
                    self._fail("event-failed", exc)  # not retried: the pod has its Event
                else:
                    self.posted[o.reason] += 1
        self._reported = frozenset(reported)
        if self.action == "evict":
            self._evict(client, [over[k].slice for k in over if k in reported])

    def _evict(self, client: PodClient, said: list[SliceUse]) -> None:
        """Evict each pod of ``said`` (slices over whose Event is posted), once per pod (by
        UID) while it stays over; see the class for the results counted."""
        pods = dict.fromkeys((s.namespace, s.pod) for s in said)
        self._evicted = {e for e in self._evicted if (e[0], e[1]) in pods}
        for key in list(self._evict_said.current):
            if key not in pods:
                self._evict_said.end(key)
        for namespace, name in pods:
            pod = self.names.known.get((namespace, name))
            uid = pod.uid if pod is not None else ""
            if (namespace, name, uid) in self._evicted:
                continue
            if not uid:  # the pod as read has no UID: no precondition can be made (untrusted)
                if self._evict_said.start((namespace, name), "skipped"):
                    self.evictions["skipped"] += 1
                    logger.warning("not evicting pod {}/{}: its API object has no UID; skipped",
                                   namespace, name)  # fmt: skip
                continue
            try:
                client.evict_pod(namespace, name, uid)
            except (KubeNotFound, KubeConflict):  # gone, or another pod by that name now
                self.evictions["gone"] += 1
                self._evicted.add((namespace, name, uid))
                continue
            except KubeError as exc:
                result = "blocked" if isinstance(exc, KubeTooManyRequests) else "failed"
                self.evictions[result] += 1
                if self._evict_said.start((namespace, name), result):
                    logger.warning(
                        "could not evict pod {}/{} over its GPU slice ({}: {}); retrying next "
                        "round", namespace, name, result, exc,
                    )  # fmt: skip
                continue
            self.evictions["evicted"] += 1
            self._evicted.add((namespace, name, uid))
            self._evict_said.end((namespace, name))
            logger.warning("evicted pod {}/{}: over its slice of a shared GPU", namespace, name)

    def _post_restarts(
        self, client: PodClient, snapshot: NodeSnapshot, slices: Mapping[str, tuple[SliceUse, ...]]
    ) -> None:
        """``MpsDaemonRestarted`` on each pod holding a slice whose own MPS daemon (one per
        slice: ``core.allocation.mps``; its state ``sources.mps.read_slice_state``, named by the slice's
        unit IDs) was restarted since the last round (``core.allocation.slice_enforcement.daemon_restarted``),
        once per restart per pod; a pod whose Event fails is tried again next round while it
        holds that slice. A slice no longer held is forgotten."""
        if self.mps is None:
            return
        held: dict[str, tuple[str, set[tuple[str, str]]]] = {}  # slice ID -> GPU, its pods
        for uuid, on_gpu in slices.items():
            for s in on_gpu:
                if s.unit_ids:
                    sid = slice_id(",".join(sorted(s.unit_ids)))
                    held.setdefault(sid, (uuid, set()))[1].add((s.namespace, s.pod))
        for sid, (_, pods) in held.items():
            now = daemon_generation(read_slice_state(self.mps.layout, sid)[0])
            if now is None:
                continue  # not read, or not started: compare the next read with the last one
            if daemon_restarted(self._daemons.get(sid), now):
                self._restarts[sid] = (now, set(pods))
            self._daemons[sid] = now
        for sid in [sid for sid in self._daemons if sid not in held]:
            del self._daemons[sid]
        for sid, (gen, pods) in list(self._restarts.items()):
            uuid, holding = held.get(sid, ("", set()))
            for namespace, name in sorted(pods):
                if (namespace, name) not in holding:
                    pods.discard((namespace, name))
                    continue
                known = self.names.known.get((namespace, name))
                try:
                    client.create_pod_event(
                        namespace=namespace, name=name, uid=known.uid if known else "",
                        reason=DAEMON_RESTARTED, warning=True,
                        message=f"the MPS control daemon of the pod's slice {sid} of GPU "
                        f"{_index_of(snapshot, uuid)} ({uuid}) was restarted (pid {gen[0]}, start "
                        f"{gen[1]}): the pod's CUDA processes running on that slice lost their MPS "
                        f"server and must be restarted; new processes reach the restarted daemon",
                    )  # fmt: skip
                except KubeError as exc:
                    self._fail("event-failed", exc)
                    continue
                self.posted[DAEMON_RESTARTED] += 1
                pods.discard((namespace, name))
            if not pods:
                del self._restarts[sid]

    def _fail(self, kind: str, exc: KubeError) -> None:
        self.errors[kind] += 1
        if self._said.start(kind, True):  # once per kind: RBAC does not change tick to tick
            logger.warning("shared GPU slices: {} ({}); retrying next round", kind, exc)


def _index_of(snapshot: NodeSnapshot, uuid: str) -> str:
    """The NVML index of GPU ``uuid`` in ``snapshot`` (``?`` when it is not there)."""
    return next((str(g.index) for g in snapshot.gpus if g.uuid == uuid), "?")

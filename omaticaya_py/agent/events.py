"""The agent's Events. On the Node: GPU health changes (``GpuUnhealthy``, ``GpuRecovered``, by
GPU UUID) and out-of-band memory (``GpuOutOfBandMemory``, once per episode). On a pod holding a
slice of a shared GPU (``SliceWatch``): ``GpuMemoryOverLimit`` when its container holds more than
its slice where nothing enforces it, once per episode (``core.sharing.episodes``), or
``MpsLimitNotEnforced`` (on the pod and on the Node) when it does so although its GPU's MPS
control daemon is up (``core.slice_enforcement``: the enforcement failed, not the workload);
``SliceWatch`` also reads the holders' pods from the API first (``attribution.PodNames``), so that the next tick's attribution tells
each slice's own use (``core.slice_use.gpu_slices``). Runs in the API round
(``agent.api_thread``), never on the read path; a failure is logged once per kind and counted
(``errors``), and the next round tries again."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from loguru import logger

from ..core.attribution import GpuAttribution, PodIdentity
from ..core.health import NodeHealth
from ..core.sayonce import SayOnce
from ..core.settings import Settings
from ..core.sharing import Sharing, episodes, is_shared
from ..core.slice_enforcement import NOT_ENFORCED, OVER_LIMIT, OverLimit, judge, over_counts
from ..core.slice_use import gpu_slices, over_limit
from ..core.snapshot import NodeSnapshot
from ..kube import KubeError, KubeForbidden, KubeNotFound, NodeClient
from ..kube.pod_client import PodClient
from ..sources.mps import MpsWatch
from .attribution import PodNames

__all__ = ["NOT_ENFORCED", "OVER_LIMIT", "HealthEvents", "SliceWatch", "mps_enforcement"]

#: posts a Warning Event on the agent's Node: ``(reason, message)``; raises ``KubeError``
NodeEvent = Callable[[str, str], None]


def mps_enforcement(watch: MpsWatch | None, uuids: Iterable[str]) -> dict[str, str] | None:
    """Each of ``uuids`` (shared GPUs) -> ``"up"`` while its MPS daemon is up
    (``watch.enforcement``), else the reason it is not; ``None`` without a watch (enforcement
    off): the shape ``core.slice_enforcement.judge`` and the telemetry's ``mps`` fields take."""
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
            reason = "GpuRecovered" if gpu.healthy else "GpuUnhealthy"
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
                    reason="GpuOutOfBandMemory",
                    message=f"{names.get(device_id, device_id)}: {att.out_of_band_memory_mib} MiB "
                    f"held by processes in no pod (PIDs {pids}), over {threshold_mib} MiB",
                    warning=True,
                )
            except KubeError as exc:
                logger.warning("could not post Event GpuOutOfBandMemory for {}: {}", device_id, exc)
                continue
            self.posted["GpuOutOfBandMemory"] += 1
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
    """The API side of slices for one agent: ``names`` (``PodNames``), over-use Events.

    ``mps``: the MPS daemons' states (``sources.mps.MpsWatch``; ``None``: enforcement off), so
    that a container over its slice on a GPU whose daemon is up is told apart
    (``core.slice_enforcement``). ``posted`` counts Events by reason (the agent's Event
    counter, shared); ``errors`` counts failed requests by kind (``get-forbidden``,
    ``get-failed``, ``event-failed``); ``over_now``: the containers over their slice at the
    last round, by ``(GPU index, UUID, enforced "true"|"false")``; ``episodes``: over-use
    episodes started, by enforced (``"true"|"false"``). The last three feed
    ``agent.collectors.SliceApiErrors`` and ``SliceOverLimit``."""

    def __init__(
        self, settings: Settings, posted: Counter[str] | None = None, mps: MpsWatch | None = None
    ) -> None:
        self.sharing = Sharing.of(settings)
        self.resource = settings.shared_resource
        self.mps = mps
        self.names = PodNames()
        self.posted: Counter[str] = posted if posted is not None else Counter()
        self.errors: Counter[str] = Counter()
        self.over_now: dict[tuple[str, str, str], int] = {}
        self.episodes: Counter[str] = Counter()
        self._reported: frozenset[tuple[str, str, str, str]] = frozenset()
        self._said: SayOnce[str, bool] = SayOnce()  # failures, by kind

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
        ``MpsLimitNotEnforced`` also through ``node_event``, on the Node). Never raises
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
            try:
                client.create_pod_event(
                    namespace=s.namespace, name=s.pod, uid=pod.uid if pod else "",
                    reason=o.reason, warning=True, message=message,
                )
            except KubeError as exc:
                self._fail("event-failed", exc)
                continue
            self.posted[o.reason] += 1
            self.episodes["true" if o.enforced else "false"] += 1
            reported.add(key)
            if o.enforced and node_event is not None:  # the node's MPS failed: say it there too
                try:
                    node_event(o.reason, f"pod {s.namespace}/{s.pod}: {message}")
                except KubeError as exc:
                    self._fail("event-failed", exc)  # not retried: the pod has its Event
                else:
                    self.posted[o.reason] += 1
        self._reported = frozenset(reported)

    def _fail(self, kind: str, exc: KubeError) -> None:
        self.errors[kind] += 1
        if self._said.start(kind, True):  # once per kind: RBAC does not change tick to tick
            logger.warning("shared GPU slices: {} ({}); retrying next round", kind, exc)

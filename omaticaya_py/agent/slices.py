"""Slices of shared GPUs, the API side: name the pods that hold them, say their over-use.

A process's cgroup gives its pod's UID and its container's ID; the kubelet's PodResources gives
each slice's pod by namespace and name. ``PodNames`` joins the two by reading the holders'
pods from the API (one GET per pod, when a holder appears or a process on its GPU is not
named, at most once per ``refetch_s``), so that the next tick's attribution tells each slice's
own use (``core.attribution.gpu_slices``). ``SliceWatch`` posts a ``GpuMemoryOverLimit`` Warning Event on a pod
whose container holds more than its slice, once per episode (``core.sharing.episodes``).

Runs in the API round (``agent.api_thread``), never on the read path. A failure is logged once
per kind and counted (``errors``); the next round tries again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping

from loguru import logger
from prometheus_client.core import GaugeMetricFamily, Metric

from ..core.attribution import GpuAttribution, PodIdentity, gpu_slices, over_limit
from ..core.sayonce import SayOnce
from ..core.settings import Settings
from ..core.sharing import Sharing, episodes, is_shared
from ..core.snapshot import NodeSnapshot
from ..kube import KubeError, KubeForbidden, KubeNotFound
from ..kube.pod_client import PodClient

__all__ = ["OVER_LIMIT", "PodNames", "SliceWatch", "slice_families"]

#: the Event's reason
OVER_LIMIT = "GpuMemoryOverLimit"
_MIB = 1024 * 1024
#: the labels of ``omaticaya_gpu_memory_used_bytes`` (``agent.metrics``)
_LABELS = ["gpu", "uuid", "pod", "namespace", "container"]
#: the most pods read in one API round (a node holds few slices; a burst waits a round)
_MAX_GETS = 32


class PodNames:
    """Pods holding slices of shared GPUs, as the API names them (``PodIdentity``), by
    ``(namespace, name)``. ``maps()`` gives the attribution its name lookups."""

    def __init__(self, refetch_s: float = 30.0, stranger_refetch_s: float = 300.0) -> None:
        self.refetch_s = refetch_s
        self.stranger_refetch_s = stranger_refetch_s
        self.known: dict[tuple[str, str], PodIdentity] = {}
        self._asked_s: dict[tuple[str, str], float] = {}

    def maps(self) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
        """``(pod UID -> (namespace, name), container ID -> container name)``."""
        pods = {p.uid: (p.namespace, p.name) for p in self.known.values() if p.uid}
        containers = {cid: n for p in self.known.values() for cid, n in p.containers.items()}
        return pods, containers

    def wanted(
        self, slices_by_gpu: Mapping[str, tuple[GpuAttribution, tuple]], now_s: float
    ) -> list[tuple[str, str]]:
        """Holders to read now: one not read yet; one not known (its read failed, or it was
        gone) ``refetch_s`` after the last read; a known one ``refetch_s`` after the last read
        while a process of it runs in a container the names lack (restarted), or
        ``stranger_refetch_s`` after while a process on its GPU is in a pod no name covers (a
        pod re-created under the same name, or a pod holding no slice: the latter costs one
        read per holder per ``stranger_refetch_s``). Forgets pods no longer holding a slice."""
        holding: set[tuple[str, str]] = set()
        out: list[tuple[str, str]] = []
        for att, slices in slices_by_gpu.values():
            strangers = any(p.pod is None for p in att.pods)
            restarted = {
                (p.namespace, p.pod) for p in att.pods
                if p.pod is not None and p.container is None and p.container_id
            }
            for s in slices:
                key = (s.namespace, s.pod)
                holding.add(key)
                asked = self._asked_s.get(key)
                if asked is None:
                    due = True
                elif key not in self.known or key in restarted:
                    due = now_s - asked >= self.refetch_s
                else:
                    due = strangers and now_s - asked >= self.stranger_refetch_s
                if due and key not in out:
                    out.append(key)
        for key in set(self.known) | set(self._asked_s):
            if key not in holding:
                self.known.pop(key, None)
                self._asked_s.pop(key, None)
        return out[:_MAX_GETS]

    def tried(self, key: tuple[str, str], now_s: float) -> None:
        """Note a read of ``key`` at ``now_s`` that got no answer (what is known stays)."""
        self._asked_s[key] = now_s

    def asked(self, key: tuple[str, str], now_s: float, found: PodIdentity | None) -> None:
        """Note a read of ``key`` at ``now_s``: its answer, or ``None`` (gone)."""
        self._asked_s[key] = now_s
        if found is None:
            self.known.pop(key, None)
        else:
            self.known[key] = found


class SliceWatch:
    """The API side of slices for one agent: ``names`` (``PodNames``), over-use Events.

    ``posted`` counts Events by reason (the agent's Event counter, shared); ``errors`` counts
    failed requests by kind (``get-forbidden``, ``get-failed``, ``event-failed``)."""

    def __init__(self, settings: Settings, posted: Counter[str] | None = None) -> None:
        self.sharing = Sharing.of(settings)
        self.resource = settings.shared_resource
        self.names = PodNames()
        self.posted: Counter[str] = posted if posted is not None else Counter()
        self.errors: Counter[str] = Counter()
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
    ) -> None:
        """Read the pods the names lack, then (``post``) the over-use Events due. Never raises
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
            self._post(client, snapshot, attribution)

    def _post(
        self, client: PodClient, snapshot: NodeSnapshot, attribution: Mapping[str, GpuAttribution]
    ) -> None:
        over = {(s.namespace, s.pod, s.container, g.uuid or ""): (g, s) for g, s in
                over_limit(snapshot, attribution, self.sharing)}
        start, kept = episodes(self._reported, over)
        reported = set(kept)
        for key in start:
            g, s = over[key]
            pod = self.names.known.get((s.namespace, s.pod))
            try:
                client.create_pod_event(
                    namespace=s.namespace, name=s.pod, uid=pod.uid if pod else "",
                    reason=OVER_LIMIT, warning=True,
                    message=f"container {s.container} holds {s.used_mib} MiB on GPU {g.index} "
                    f"({g.uuid}), over its slice of {s.limit_mib} MiB ({s.units} units of "
                    f"{self.resource}); nothing enforces the slice without an MPS control "
                    f"daemon for that GPU",
                )
            except KubeError as exc:
                self._fail("event-failed", exc)
                continue
            self.posted[OVER_LIMIT] += 1
            reported.add(key)
        self._reported = frozenset(reported)

    def _fail(self, kind: str, exc: KubeError) -> None:
        self.errors[kind] += 1
        if self._said.start(kind, True):  # once per kind: RBAC does not change tick to tick
            logger.warning("shared GPU slices: {} ({}); retrying next round", kind, exc)


def slice_families(
    snapshot: NodeSnapshot | None, attribution: Mapping[str, GpuAttribution], sharing: Sharing
) -> Iterator[Metric]:
    """Per slice of a shared GPU, with the labels of ``omaticaya_gpu_memory_used_bytes``: its
    limit (units x the unit, bytes) and the memory its own processes hold (where known)."""
    labels = _LABELS
    limit = GaugeMetricFamily(
        "omaticaya_pod_gpu_memory_limit_bytes",
        "A container's slice of a shared GPU (its memory units x the unit; kubelet "
        "PodResources).", labels=labels,
    )
    used = GaugeMetricFamily(
        "omaticaya_pod_gpu_memory_used_bytes",
        "GPU memory held by a container's own processes on a shared GPU (where its processes "
        "are placed and named).", labels=labels,
    )
    for g in snapshot.gpus if snapshot is not None else ():
        if not is_shared(g, sharing):
            continue
        for s in gpu_slices(attribution.get(g.uuid or ""), g.uuid, sharing.unit_mib):
            key = [str(g.index), g.uuid or "", s.pod, s.namespace, s.container]
            limit.add_metric(key, s.limit_mib * _MIB)
            if s.used_mib is not None:
                used.add_metric(key, s.used_mib * _MIB)
    yield limit
    yield used

"""The agent's Prometheus collectors: one small collector per source, as client_python's own.

Each is a ``Collector`` whose ``collect()`` yields metric families from values already held
(a scrape costs no NVML call and no API request), and each is given only what it reads: the
last tick's result, a counter of the NVML reader, of the PodResources client, of the API
session, the ``SnapshotCache``'s counters. None of them sees the ``Agent``; ``metrics.agent_registry``
wires them. Names follow Prometheus conventions: base units (bytes, seconds, watts, celsius,
ratio), ``_total`` for counters (prometheus-client adds it to a counter family's name).
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..core.allocation.slice_use import gpu_slices
from ..core.model.sharing import Sharing, is_shared
from ..core.model.snapshot import GpuReading, NodeSnapshot
from ..core.rules.attribution import GpuAttribution, gpu_out_of_band_mib

if TYPE_CHECKING:
    from ..core.publish.readings import TickResult
    from ..core.rules.health import XidLedger
    from .state import SnapshotCache

__all__ = [
    "AgentCounters",
    "ApiRequests",
    "BuildInfo",
    "GpuReadings",
    "NvmlErrors",
    "PodResourcesErrors",
    "MpsStateErrors",
    "SliceApiErrors",
    "SliceOverLimit",
    "holders",
]

MIB = 1024 * 1024
#: dcgm-exporter's label names for the pod holding a GPU, so that its dashboards work
POD_LABELS = ("pod", "namespace", "container")


def holders(
    g: GpuReading, attribution: Mapping[str, GpuAttribution]
) -> list[tuple[str, str, str]]:
    """(pod, namespace, container) of each container holding whole GPU ``g`` (PodResources);
    ``[("", "", "")]`` when none does, or for a GPU with MIG on (its MIG devices are held)."""
    att = attribution.get(g.uuid or "") if not g.mig_enabled else None
    found = [(h.pod, h.namespace, h.container) for h in att.holders] if att else []
    return found or [("", "", "")]


def _counter(
    name: str, doc: str, labels: list[str], counts: Mapping[Any, int]  # key: str or tuple of str
) -> CounterMetricFamily:
    """A counter family with one sample per key of ``counts`` (a key: one label value, or a
    tuple of them), in key order."""
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, n in sorted(counts.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], n)
    return family


class BuildInfo(Collector):
    """``omaticaya_build_info{version,python}`` = 1."""

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "omaticaya_build_info", "Agent version.", labels=["version", "python"]
        )
        info.add_metric([__version__, platform.python_version()], 1)
        yield info


class GpuReadings(Collector):
    """The last tick's reading of each GPU (``last()``: the ``TickResult``, ``None`` before the
    first tick: no series), with the pod holding it (PodResources), its slices (``sharing``),
    its health and the node's: ``omaticaya_gpu_*{gpu,uuid}`` (the GPM ``_sm_active_pct``,
    ``_tensor_active_pct``, ``_dram_bw_pct`` only where GPM gave them), ``omaticaya_gpu_memory_used_bytes``
    and ``_utilization_ratio`` by holder, the slice families, ``omaticaya_node_health{state}``,
    ``omaticaya_gpu_unhealthy_reason{gpu,uuid,reason}``."""

    def __init__(self, last: Callable[[], TickResult | None], sharing: Sharing) -> None:
        self._last = last
        self._sharing = sharing

    def collect(self) -> Iterator[Metric]:
        last = self._last()
        gauges = {
            name: GaugeMetricFamily(f"omaticaya_gpu_{name}", doc, labels=["gpu", "uuid"])
            for name, doc in (
                ("memory_free_bytes", "Free GPU memory (nvmlDeviceGetMemoryInfo)."),
                ("memory_total_bytes", "Total GPU memory."),
                ("temperature_celsius", "GPU temperature."),
                ("power_watts", "GPU power draw."),
                ("sm_active_pct", "GPM SM activity, % over the last interval (Hopper and newer; "
                 "no series without GPM)."),
                ("tensor_active_pct", "GPM tensor-core activity, % over the last interval (no "
                 "series without GPM)."),
                ("dram_bw_pct", "GPM DRAM bandwidth used, % of peak over the last interval (no "
                 "series without GPM)."),
                ("healthy", "1 when the GPU is healthy by the agent's rules, else 0."),
                (
                    "out_of_band_memory_bytes",
                    "GPU memory of processes in no pod (out-of-band); only where processes are "
                    "placed (OMATICAYA_PROC_ROOT).",
                ),
            )
        }
        # by the pod holding the GPU, with dcgm-exporter's label names (empty: no holder)
        by_pod = {
            name: GaugeMetricFamily(
                f"omaticaya_gpu_{name}", doc, labels=["gpu", "uuid", *POD_LABELS]
            )
            for name, doc in (
                ("memory_used_bytes", "Used GPU memory, driver reservation included; labelled "
                 "with the container holding the GPU (kubelet PodResources), if any."),
                ("utilization_ratio", "GPU utilisation, mean over the last interval (0-1); "
                 "labelled with the container holding the GPU, if any."),
            )
        }
        node_health = GaugeMetricFamily(
            "omaticaya_node_health", "1 for the node's current gpu.health state.", labels=["state"]
        )
        unhealthy_reason = GaugeMetricFamily(
            "omaticaya_gpu_unhealthy_reason",
            "1 for each reason an unhealthy GPU has (lost, read-error, remap-pending, "
            "remap-failure, ecc-dbe, xid-<N>); no series for a healthy GPU.",
            labels=["gpu", "uuid", "reason"],
        )
        if last is not None:
            attribution = last.attribution
            scale: float  # MIB (int) or a ratio
            for g in last.snapshot.gpus:
                key = [str(g.index), g.uuid or ""]
                for name, value, scale in (
                    ("memory_free_bytes", g.memory_free_mib, MIB),
                    ("memory_total_bytes", g.memory_total_mib, MIB),
                    ("temperature_celsius", g.temperature_c, 1),
                    ("power_watts", g.power_w, 1),
                    ("sm_active_pct", g.sm_active_pct, 1),
                    ("tensor_active_pct", g.tensor_active_pct, 1),
                    ("dram_bw_pct", g.dram_bw_pct, 1),
                    ("out_of_band_memory_bytes", gpu_out_of_band_mib(g, attribution), MIB),
                ):
                    if value is not None:
                        gauges[name].add_metric(key, value * scale)
                for pod in holders(g, attribution):
                    for name, value, scale in (
                        ("memory_used_bytes", g.memory_used_mib, MIB),
                        ("utilization_ratio", g.utilization_pct, 0.01),
                    ):
                        if value is not None:
                            by_pod[name].add_metric([*key, *pod], value * scale)
                gauges["healthy"].add_metric(key, 1 if last.health.gpus[g.index].healthy else 0)
            for state in ("Healthy", "Degraded", "Unhealthy", "Unknown"):
                node_health.add_metric([state], 1 if str(last.health.state) == state else 0)
            for g in last.snapshot.gpus:
                for reason in last.health.gpus[g.index].reasons:
                    unhealthy_reason.add_metric([str(g.index), g.uuid or "", reason], 1)
        yield from gauges.values()
        yield from by_pod.values()
        yield from slice_families(
            last.snapshot if last is not None else None,
            last.attribution if last is not None else {},
            self._sharing,
        )
        yield node_health
        yield unhealthy_reason


class NvmlErrors(Collector):
    """The NVML reader's counts: ``omaticaya_nvml_errors_total{call,error}`` (``errors``, by
    ``(call, error name)``: the reader's live counter; empty for a trace replay) and
    ``omaticaya_xid_events_dropped_total`` (``dropped()``: events dropped from the event
    thread's bounded buffer)."""

    def __init__(
        self, errors: Mapping[tuple[str, str], int], dropped: Callable[[], int] = lambda: 0
    ) -> None:
        self._errors = errors
        self._dropped = dropped

    def collect(self) -> Iterator[Metric]:
        yield _counter(
            "omaticaya_nvml_errors", "NVML calls that failed, by call and error.",
            ["call", "error"], self._errors,
        )  # fmt: skip
        yield CounterMetricFamily(
            "omaticaya_xid_events_dropped",
            "Xid events dropped from the event thread's bounded buffer (the latest per GPU and "
            "Xid is kept).",
            value=self._dropped(),
        )


class PodResourcesErrors(Collector):
    """The kubelet PodResources client's counts (``agent.attribution``'s live counters; empty
    without one): ``omaticaya_pod_resources_errors_total{code}`` (failed List calls by gRPC
    code) and ``omaticaya_pod_resources_skipped_total{reason}`` (device IDs skipped)."""

    def __init__(self, errors: Mapping[str, int], skipped: Mapping[str, int]) -> None:
        self._errors = errors
        self._skipped = skipped

    def collect(self) -> Iterator[Metric]:
        yield _counter(
            "omaticaya_pod_resources_errors",
            "kubelet PodResources List calls that failed, by gRPC code (absent: no socket).",
            ["code"], self._errors,
        )  # fmt: skip
        yield _counter(
            "omaticaya_pod_resources_skipped",
            "Device IDs from kubelet PodResources skipped, by reason (unknown-gpu: a memory "
            "unit naming no GPU of this node).",
            ["reason"], self._skipped,
        )  # fmt: skip


class SliceApiErrors(Collector):
    """``omaticaya_slice_api_errors_total{kind}``: the shared-GPU slices' failed API requests
    (``errors``: ``agent.events.SliceWatch``'s live counter; empty without sharing)."""

    def __init__(self, errors: Mapping[str, int]) -> None:
        self._errors = errors

    def collect(self) -> Iterator[Metric]:
        yield _counter(
            "omaticaya_slice_api_errors",
            "API requests for shared GPU slices that failed (get-forbidden, get-failed: reading "
            "a slice's pod; event-failed: its over-use Event).",
            ["kind"], self._errors,
        )  # fmt: skip


class MpsStateErrors(Collector):
    """``omaticaya_mps_state_errors_total``: MPS daemon state files that could not be read or
    were not a state of their GPU (``errors()``: ``sources.mps.MpsWatch.errors``, the watch the
    agent and its device plugin share; no series without MPS enforcement). Each such read
    counts the GPU as not enforced."""

    def __init__(self, errors: Callable[[], int] | None) -> None:
        self._errors = errors

    def collect(self) -> Iterator[Metric]:
        if self._errors is None:
            return
        family = CounterMetricFamily(
            "omaticaya_mps_state_errors",
            "MPS daemon state files (omaticaya mps) that could not be read or were another "
            "GPU's: the GPU counts as not enforced (its units Unhealthy) until one reads.",
        )
        family.add_metric([], self._errors())
        yield family


class SliceOverLimit(Collector):
    """Containers over their slice of a shared GPU (``agent.events.SliceWatch``'s live values;
    empty without sharing), told apart by the Event reason (``core.allocation.slice_enforcement``):
    ``omaticaya_slice_over_limit{gpu,uuid,enforced,reason}`` (``over_now()``: how many are over
    at the last API round, by ``(GPU index, UUID, enforced, reason)``; ``enforced="true"``
    only for ``MpsLimitNotEnforced``, the limit should have held; no series for a GPU none is
    over), ``omaticaya_slice_over_limit_episodes_total{enforced,reason}`` (``episodes``:
    episodes said by an Event) and ``omaticaya_slice_evictions_total{result}``
    (``evictions``: eviction attempts, ``OMATICAYA_SLICE_OVER_LIMIT_ACTION=evict``)."""

    def __init__(
        self,
        over_now: Callable[[], Mapping[tuple[str, str, str, str], int]],
        episodes: Mapping[tuple[str, str], int],
        evictions: Mapping[str, int] | None = None,
    ) -> None:
        self._over_now = over_now
        self._episodes = episodes
        self._evictions = evictions if evictions is not None else {}

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "omaticaya_slice_over_limit",
            "Containers whose processes together hold more GPU memory than their slice of a "
            "shared GPU, at the last API round, by Event reason: GpuMemoryOverLimit (nothing "
            "enforced it), SliceOverLimitProcesses (the GPU's MPS daemon up, several processes "
            "each within the slice), MpsLimitNotEnforced (a process escaped the daemon: "
            "enforced=\"true\", the limit should have held).",
            labels=["gpu", "uuid", "enforced", "reason"],
        )
        for key, n in sorted(self._over_now().items()):
            gauge.add_metric(list(key), n)
        yield gauge
        yield _counter(
            "omaticaya_slice_over_limit_episodes",
            "Episodes of a container over its slice of a shared GPU, said by an Event; by "
            "enforced (\"true\": MpsLimitNotEnforced) and the Event reason.",
            ["enforced", "reason"], self._episodes,
        )  # fmt: skip
        yield _counter(
            "omaticaya_slice_evictions",
            "Evictions of pods over their slice of a shared GPU (OMATICAYA_SLICE_OVER_LIMIT_ACTION"
            "=evict), by result: evicted, blocked (a PodDisruptionBudget refused it; retried), "
            "gone, failed (retried), skipped (the pod's API object had no UID).",
            ["result"], self._evictions,
        )  # fmt: skip


class ApiRequests(Collector):
    """``omaticaya_api_requests_total{verb,result}``: the API session's request counts
    (``ApiSession.requests``, by ``(verb, HTTP status or "error")``; empty without one)."""

    def __init__(self, requests: Mapping[tuple[str, str], int]) -> None:
        self._requests = requests

    def collect(self) -> Iterator[Metric]:
        yield _counter(
            "omaticaya_api_requests", "Kubernetes API requests, by verb and result.",
            ["verb", "result"], self._requests,
        )  # fmt: skip


class AgentCounters(Collector):
    """What the agent counts of its own work: the ``SnapshotCache``'s counters (ticks,
    patches, Lease renewals, ...), its tick age and duration histogram and last patch time;
    the Xid ledger's seeding counts (``ledger``); ``events_posted`` by reason;
    ``clock_steps()`` (the watchdog's wall-clock steps) and ``on_lease()`` (liveness on a
    Lease rather than the telemetry annotation)."""

    def __init__(
        self,
        cache: SnapshotCache,
        ledger: XidLedger,
        events_posted: Mapping[str, int],
        clock_steps: Callable[[], int],
        on_lease: Callable[[], bool],
    ) -> None:
        self._cache = cache
        self._ledger = ledger
        self._events = events_posted
        self._clock_steps = clock_steps
        self._on_lease = on_lease

    def collect(self) -> Iterator[Metric]:
        cache, ledger = self._cache, self._ledger
        for name, doc, value in (
            ("omaticaya_ticks", "Ticks run.", cache.ticks),
            ("omaticaya_tick_errors", "Ticks that failed on an unexpected error.", cache.tick_errors),
            ("omaticaya_patches", "Merge patches sent to the Node.", cache.patches_sent),
            ("omaticaya_labels_changed", "Label keys set or removed by patches.", cache.labels_changed),
            ("omaticaya_patches_held", "Patches the write budget held back for a later tick.", cache.patches_held),
            ("omaticaya_resourceslice_writes", "Server-side applies of the Node's DRA ResourceSlice (OMATICAYA_DRA).", cache.slice_writes),
            ("omaticaya_resourceslice_held", "Ticks whose ResourceSlice changes for the better the write budget held back.", cache.slice_held),
            ("omaticaya_resourceslice_errors", "ResourceSlice requests that failed (retried next tick).", cache.slice_errors),
            ("omaticaya_lease_renewals", "Renewals of the liveness Lease.", cache.lease_renewals),
            ("omaticaya_lease_failures", "Lease renewals that failed (other than a 403).", cache.lease_failures),
            ("omaticaya_lease_fallbacks", "403s on the Lease: heartbeat back on the Node annotation.", cache.lease_fallbacks),
            ("omaticaya_writes_superseded", "API rounds replaced by a newer reading before they started (a slow API server).", cache.writes_superseded),
            ("omaticaya_clock_steps", "Steps of the wall clock seen by the watchdog (ticks rescheduled).", self._clock_steps()),
            ("omaticaya_xid_events_seeded", "Fatal Xid events carried over from the Node's telemetry at start (NVML does not replay old events).", ledger.seeded),
            ("omaticaya_xid_seed_refused", "GPU entries of the Node's telemetry refused when seeding the Xid ledger at start (forged or malformed).", ledger.seed_refused),
        ):  # fmt: skip
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily(
            "omaticaya_last_tick_age_seconds",
            "Seconds since the last tick's read path finished (since start before the first).",
            value=cache.tick_age_s(),
        )
        yield _counter(
            "omaticaya_events", "Kubernetes Events posted, by reason.", ["reason"], self._events
        )
        if cache.last_patch_wall_s is not None:
            yield GaugeMetricFamily(
                "omaticaya_last_patch_timestamp_seconds",
                "Unix time of the last successful patch.",
                value=cache.last_patch_wall_s,
            )
        yield GaugeMetricFamily(
            "omaticaya_heartbeat_on_lease",
            "1 while liveness goes on a Lease, 0 while on the Node's telemetry annotation.",
            value=1 if self._on_lease() else 0,
        )
        yield from cache.tick_seconds.collect()


#: the labels of a slice's series, those of ``omaticaya_gpu_memory_used_bytes``
_SLICE_LABELS = ["gpu", "uuid", "pod", "namespace", "container"]


def slice_families(
    snapshot: NodeSnapshot | None, attribution: Mapping[str, GpuAttribution], sharing: Sharing
) -> Iterator[Metric]:
    """Per slice of a shared GPU, with the labels of ``omaticaya_gpu_memory_used_bytes``: its
    limit (units x the unit, bytes) and the memory its own processes hold (where known)."""
    labels = _SLICE_LABELS
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
            limit.add_metric(key, s.limit_mib * MIB)
            if s.used_mib is not None:
                used.add_metric(key, s.used_mib * MIB)
    yield limit
    yield used

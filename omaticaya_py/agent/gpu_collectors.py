"""The agent's Prometheus collector of its readings: each GPU's last reading, who holds it,
its slices, and the node's health (``GpuReadings``).

Like ``agent.collectors``' counters, it yields metric families from values already held (the
last tick's result: a scrape costs no NVML call and no API request) and never sees the
``Agent``; ``metrics.agent_registry`` wires it. Base units (bytes, watts, celsius, ratio); the
series of a GPU's holder carry dcgm-exporter's label names (``POD_LABELS``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core.allocation.slice_use import gpu_slices
from ..core.model.sharing import Sharing, is_shared
from ..core.model.snapshot import GpuReading, NodeSnapshot
from ..core.rules.attribution import GpuAttribution, gpu_out_of_band_mib

if TYPE_CHECKING:
    from ..core.publish.readings import TickResult

__all__ = ["MIB", "POD_LABELS", "GpuReadings", "holders", "slice_families"]

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


#: ``omaticaya_gpu_<name>{gpu,uuid}``: (name, help) of each gauge of a GPU's reading
_GPU_GAUGES = (
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

#: ``omaticaya_gpu_<name>{gpu,uuid,pod,namespace,container}``: (name, help) of each gauge by
#: the pod holding the GPU, with dcgm-exporter's label names (empty: no holder)
_HOLDER_GAUGES = (
    ("memory_used_bytes", "Used GPU memory, driver reservation included; labelled "
     "with the container holding the GPU (kubelet PodResources), if any."),
    ("utilization_ratio", "GPU utilisation, mean over the last interval (0-1); "
     "labelled with the container holding the GPU, if any."),
)

#: the states of ``omaticaya_node_health{state}``, one series each
_NODE_STATES = ("Healthy", "Degraded", "Unhealthy", "Unknown")


def _gauges(table: tuple[tuple[str, str], ...], labels: list[str]) -> dict[str, GaugeMetricFamily]:
    """One ``omaticaya_gpu_<name>`` gauge family per ``(name, help)`` of ``table``, by name."""
    return {
        name: GaugeMetricFamily(f"omaticaya_gpu_{name}", doc, labels=labels)
        for name, doc in table
    }


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
        gauges = _gauges(_GPU_GAUGES, ["gpu", "uuid"])
        by_pod = _gauges(_HOLDER_GAUGES, ["gpu", "uuid", *POD_LABELS])
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
            for g in last.snapshot.gpus:
                _add_reading(gauges, by_pod, g, last)
            _add_health(node_health, unhealthy_reason, last)
        yield from gauges.values()
        yield from by_pod.values()
        yield from slice_families(
            last.snapshot if last is not None else None,
            last.attribution if last is not None else {},
            self._sharing,
        )
        yield node_health
        yield unhealthy_reason


def _add_reading(
    gauges: Mapping[str, GaugeMetricFamily],
    by_pod: Mapping[str, GaugeMetricFamily],
    g: GpuReading,
    last: TickResult,
) -> None:
    """GPU ``g``'s samples of ``last``: its reading (bytes from MiB, a ratio from %; a value not
    read gives no sample), by holder (``holders``), and whether it is healthy."""
    key = [str(g.index), g.uuid or ""]
    attribution = last.attribution
    scale: float  # MIB (int) or a ratio
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


def _add_health(
    node_health: GaugeMetricFamily, unhealthy_reason: GaugeMetricFamily, last: TickResult
) -> None:
    """The node's health state of ``last`` (1 for its state, 0 for the others) and each reason
    each GPU is unhealthy for."""
    for state in _NODE_STATES:
        node_health.add_metric([state], 1 if str(last.health.state) == state else 0)
    for g in last.snapshot.gpus:
        for reason in last.health.gpus[g.index].reasons:
            unhealthy_reason.add_metric([str(g.index), g.uuid or "", reason], 1)


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

"""The agent's Prometheus collectors of counts: one small collector per source, as
client_python's own.

Each is a ``Collector`` whose ``collect()`` yields metric families from values already held
(a scrape costs no NVML call and no API request), and each is given only what it reads: a
counter of the NVML reader, of the PodResources client, of the API session, of the slices'
API work, the ``SnapshotCache``'s counters. The readings themselves (per GPU, per slice) are
``agent.gpu_collectors``'. None of them sees the ``Agent``; ``metrics.agent_registry`` wires
them. Names follow Prometheus conventions: base units (bytes, seconds, watts, celsius, ratio),
``_total`` for counters (prometheus-client adds it to a counter family's name).
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__

if TYPE_CHECKING:
    from ..core.rules.health import XidLedger
    from .state import SnapshotCache

__all__ = [
    "AgentCounters",
    "ApiRequests",
    "BuildInfo",
    "MpsStateErrors",
    "NvmlErrors",
    "PodResourcesErrors",
    "SliceApiErrors",
    "SliceOverLimit",
]


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

"""The extender's Prometheus metrics: one small collector per source (the node cache and the
problems found in Nodes, the API requests, the pod cache of in-flight placements, the Lease
cache, the reservation ledger, the decisions), each given only what it reads and read at scrape
time (no I/O); ``metrics_registry`` registers them. prometheus-client is imported when a
registry is made or scraped, not with this module."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import countOf, itemgetter
from typing import Any

from loguru import logger as log

from .fit import ReasonText

__all__ = [
    "ExtenderApiRequests",
    "DecisionMetrics",
    "Decisions",
    "LeaseCacheMetrics",
    "LedgerMetrics",
    "MetricSources",
    "NodeCacheMetrics",
    "PodCacheMetrics",
    "metrics_registry",
]


_score = itemgetter("Score")


def _counter(name: str, doc: str, labels: list[str], counts: Mapping[Any, int]) -> Any:
    """A counter family with one sample per key of ``counts`` (a key: one label value, or a
    tuple of them), in key order."""
    from prometheus_client.core import CounterMetricFamily

    family = CounterMetricFamily(name, doc, labels=labels)
    for key, n in sorted(counts.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], n)
    return family


class NodeCacheMetrics:
    """The node cache (``kube.NodeCache``: ``len``, ``synced``, ``health()``, ``lists``,
    ``events``, ``skipped``) and ``problems`` (``app.NodeProblems``: ``counts`` by problem):
    ``omaticaya_extender_cache_nodes``, ``_cache_synced``, ``_cache_ready``,
    ``_cache_lists_total``, ``_cache_events_total``, ``_nodes_skipped_total`` (Nodes whose
    parsing raised) and ``_node_problems_total{problem}`` (Nodes whose telemetry turned
    unusable)."""

    def __init__(self, cache: Any, problems: Any) -> None:
        self._cache = cache
        self._problems = problems

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        cache = self._cache
        yield GaugeMetricFamily(
            "omaticaya_extender_cache_nodes", "Nodes in the cache.", value=len(cache)
        )
        yield GaugeMetricFamily(
            "omaticaya_extender_cache_synced", "1 once the first LIST is stored.",
            value=1 if cache.synced else 0,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "omaticaya_extender_cache_ready", "1 while the list+watch is alive and current.",
            value=1 if cache.health()[0] else 0,
        )  # fmt: skip
        for name, doc, value in (
            ("omaticaya_extender_cache_lists", "LISTs of every Node.", cache.lists),
            ("omaticaya_extender_cache_events", "WATCH events received.", cache.events),
            ("omaticaya_extender_nodes_skipped", "Nodes whose parsing raised (dropped).",
             cache.skipped),
        ):  # fmt: skip
            yield CounterMetricFamily(name, doc, value=value)
        yield _counter(
            "omaticaya_extender_node_problems",
            "Times a Node's GPU telemetry turned unusable, by problem.",
            ["problem"], self._problems.counts,
        )  # fmt: skip


class ExtenderApiRequests:
    """``omaticaya_extender_api_requests_total{verb,result}``: the node cache's requests
    (``requests``: ``Informer.requests``, by ``(verb, HTTP status or "error")``)."""

    def __init__(self, requests: Mapping[tuple[str, str], int]) -> None:
        self._requests = requests

    def collect(self) -> Iterator[Any]:
        yield _counter(
            "omaticaya_extender_api_requests", "Kubernetes API requests, by verb and result.",
            ["verb", "result"], self._requests,
        )  # fmt: skip


class PodCacheMetrics:
    """The pod cache of in-flight placements (``kube.PodCache``: ``len``, ``synced``,
    ``events``) and ``pod_problems`` (``counts`` by problem; ``None``: none):
    ``omaticaya_extender_inflight_pods`` (pods placed and not yet settled or gone),
    ``_pod_cache_synced``, ``_pod_cache_events_total`` and ``_pods_skipped_total{problem}``."""

    def __init__(self, pods: Any, pod_problems: Any = None) -> None:
        self._pods = pods
        self._counts: Mapping[str, int] = pod_problems.counts if pod_problems is not None else {}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        pods = self._pods
        yield GaugeMetricFamily(
            "omaticaya_extender_inflight_pods",
            "Pods placed through the extender that hold a placement (bound, not finished).",
            value=len(pods),
        )
        yield GaugeMetricFamily(
            "omaticaya_extender_pod_cache_synced", "1 once the first LIST of pods is stored.",
            value=1 if pods.synced else 0,
        )  # fmt: skip
        yield CounterMetricFamily(
            "omaticaya_extender_pod_cache_events", "Pod WATCH events received.", value=pods.events
        )
        yield _counter(
            "omaticaya_extender_pods_skipped", "Pods that could not be read (not counted in "
            "flight).", ["problem"], self._counts,
        )  # fmt: skip


class LeaseCacheMetrics:
    """The Lease cache (``kube.LeaseCache``: ``len``, ``synced``, ``skipped``):
    ``omaticaya_extender_cache_leases``, ``_lease_cache_synced`` and ``_leases_skipped_total``
    (Lease events that could not be read)."""

    def __init__(self, leases: Any) -> None:
        self._leases = leases

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        leases = self._leases
        yield GaugeMetricFamily(
            "omaticaya_extender_cache_leases", "Leases in the cache.", value=len(leases)
        )
        yield GaugeMetricFamily(
            "omaticaya_extender_lease_cache_synced", "1 once the first LIST of Leases "
            "is stored.", value=1 if leases.synced else 0,
        )  # fmt: skip
        yield CounterMetricFamily(
            "omaticaya_extender_leases_skipped", "Lease events that could not be read "
            "(the Lease is dropped).", value=leases.skipped,
        )  # fmt: skip


class LedgerMetrics:
    """The reservation ledger (``scheduler.ledger.Ledger``: ``reserved()``, ``counts``):
    ``omaticaya_extender_reservations`` (held by the filter, not yet seen bound) and
    ``_reservation_events_total{event}`` (reserved, confirmed, moved, expired)."""

    def __init__(self, ledger: Any) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(
            "omaticaya_extender_reservations", "Reservations made by the filter and "
            "not yet seen bound.", value=self._ledger.reserved(),
        )  # fmt: skip
        yield _counter(
            "omaticaya_extender_reservation_events", "Reservations by event: reserved (the "
            "filter narrowed a pod to a node), confirmed (seen bound there), moved "
            "(bound elsewhere), expired (never seen bound).", ["event"], self._ledger.counts,
        )  # fmt: skip


class Decisions:
    """Every filter, prioritize and preempt decision, counted by (verb, result, reason) and
    logged once per request at DEBUG with its tally: ``verb`` filter, prioritize or preempt;
    ``result`` passed / failed (filter, per node), scored / zero (prioritize, per node), kept /
    dropped (preempt, per node); ``reason`` a ``fit.Reason`` code for the filter (bounded: the
    text, which names pods and sizes, is only logged), a fixed name for preempt."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()

    def filtered(self, pod: str, passed: Sequence[str], failed: Mapping[str, ReasonText]) -> None:
        """Count a filter's answer for ``pod``: each failed node by its reason's code."""
        codes: Counter[str] = Counter()
        for text, n in Counter(failed.values()).items():  # few distinct texts among thousands
            codes[text.code] += n
        with self._lock:
            if passed:
                self.counts[("filter", "passed", "")] += len(passed)
            for code, n in codes.items():
                self.counts[("filter", "failed", code)] += n
        log.debug("filter {}: {} passed, failed {}", pod, len(passed), dict(codes) or "none")

    def prioritized(self, pod: str, scores: Sequence[Mapping[str, Any]]) -> None:
        """Count a HostPriorityList for ``pod``: scored (> 0) and zero."""
        scored = len(scores) - countOf(map(_score, scores), 0)
        with self._lock:
            if scored:
                self.counts[("prioritize", "scored", "")] += scored
            if len(scores) - scored:
                self.counts[("prioritize", "zero", "")] += len(scores) - scored
        log.debug("prioritize {}: {} scored, {} zero", pod, scored, len(scores) - scored)

    def preempted(self, result: str, reason: str, n: int = 1) -> None:
        """Count ``n`` candidate nodes of a preemption: kept, or dropped for ``reason``."""
        with self._lock:
            self.counts[("preempt", result, reason)] += n

    def unasked(self, result: str, reason: str, n: int = 1) -> None:
        """Count ``n`` outcomes of preemption kube-scheduler did not ask for
        (``unasked.UnaskedPreemption``): pods evicted, evictions refused, pods skipped."""
        with self._lock:
            self.counts[("preempt-unasked", result, reason)] += n


class DecisionMetrics:
    """``omaticaya_extender_decisions_total{verb,result,reason}``: per-node decisions
    (``Decisions.counts``)."""

    def __init__(self, decisions: Any) -> None:
        self._decisions = decisions

    def collect(self) -> Iterator[Any]:
        yield _counter(
            "omaticaya_extender_decisions",
            "Per-node decisions, by verb, result and reason (scheduler/metrics.py).",
            ["verb", "result", "reason"], self._decisions.counts,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class MetricSources:
    """What the extender's metrics read (``metrics_registry``): the Node ``cache`` and the
    ``problems`` found in Nodes always; the pod cache of in-flight placements (``pods``, with
    ``pod_problems``), the ``decisions``, the Lease cache (``leases``), the ``ledger`` and the
    node cache's API ``requests`` (``Informer.requests``) each when set."""

    cache: Any
    problems: Any
    pods: Any = None
    pod_problems: Any = None
    decisions: Any = None
    leases: Any = None
    ledger: Any = None
    requests: Mapping[tuple[str, str], int] | None = None


def metrics_registry(sources: MetricSources) -> Any:
    """A prometheus-client ``CollectorRegistry`` of the collectors above over ``sources``."""
    from prometheus_client import CollectorRegistry

    s = sources
    collectors: list[Any] = [
        NodeCacheMetrics(s.cache, s.problems),
        ExtenderApiRequests(s.requests if s.requests is not None else {}),
    ]
    if s.pods is not None:
        collectors.append(PodCacheMetrics(s.pods, s.pod_problems))
    if s.leases is not None:
        collectors.append(LeaseCacheMetrics(s.leases))
    if s.ledger is not None:
        collectors.append(LedgerMetrics(s.ledger))
    if s.decisions is not None:
        collectors.append(DecisionMetrics(s.decisions))
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    return registry

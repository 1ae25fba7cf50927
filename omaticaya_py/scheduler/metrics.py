"""The extender's Prometheus metrics: one collector over its caches, problems, decisions and
reservation ledger, read at scrape time (no I/O)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["metrics_registry"]


def metrics_registry(
    cache: Any,
    problems: Any,
    pods: Any = None,
    pod_problems: Any = None,
    decisions: Any = None,
    leases: Any = None,
    ledger: Any = None,
) -> Any:
    """A prometheus-client ``CollectorRegistry`` over the node cache (``kube.NodeCache``) and
    ``problems`` (``app.NodeProblems``): ``omaticaya_extender_cache_nodes`` (Nodes held), ``_cache_synced``,
    ``_cache_ready`` (``cache.health()``), ``_cache_lists_total``, ``_cache_events_total``,
    ``_nodes_skipped_total`` (Nodes whose parsing raised), ``_node_problems_total{problem}``
    (Nodes whose telemetry turned unusable) and ``_api_requests_total{verb,result}``; with the
    pod cache (``kube.PodCache`` of in-flight placements): ``_inflight_pods`` (pods placed and
    not yet settled or gone), ``_pod_cache_synced``, ``_pod_cache_events_total`` and
    ``_pods_skipped_total{problem}`` (pods that could not be read, from ``pod_problems``); with
    ``decisions`` (``scheduler.decisions.Decisions``): ``_decisions_total{verb,result,reason}``;
    with the lease cache (``kube.LeaseCache``): ``_cache_leases``, ``_lease_cache_synced`` and
    ``_leases_skipped_total`` (Lease events that could not be read); with the ``ledger``
    (``scheduler.ledger.Ledger``): ``_reservations`` (held by the filter, not yet seen bound)
    and ``_reservation_events_total{event}`` (reserved, confirmed, moved, expired)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class _Collector:
        def collect(self) -> Iterable[Any]:
            yield GaugeMetricFamily(
                "omaticaya_extender_cache_nodes", "Nodes in the cache.", value=len(cache)
            )
            yield GaugeMetricFamily(
                "omaticaya_extender_cache_synced", "1 once the first LIST is stored.",
                value=1 if cache.synced else 0,
            )
            yield GaugeMetricFamily(
                "omaticaya_extender_cache_ready", "1 while the list+watch is alive and current.",
                value=1 if cache.health()[0] else 0,
            )
            for name, doc, value in (
                ("omaticaya_extender_cache_lists", "LISTs of every Node.", cache.lists),
                ("omaticaya_extender_cache_events", "WATCH events received.", cache.events),
                ("omaticaya_extender_nodes_skipped", "Nodes whose parsing raised (dropped).",
                 cache.skipped),
            ):  # fmt: skip
                yield CounterMetricFamily(name, doc, value=value)
            bad = CounterMetricFamily(
                "omaticaya_extender_node_problems",
                "Times a Node's GPU telemetry turned unusable, by problem.",
                labels=["problem"],
            )
            for problem, n in sorted(problems.counts.items()):
                bad.add_metric([problem], n)
            yield bad
            requests = CounterMetricFamily(
                "omaticaya_extender_api_requests", "Kubernetes API requests, by verb and result.",
                labels=["verb", "result"],
            )
            client = getattr(cache, "_client", None)
            for (verb, result), n in sorted(getattr(client, "requests", {}).items()):
                requests.add_metric([verb, result], n)
            yield requests
            if pods is not None:
                yield from _pod_metrics(pods, pod_problems)
            if leases is not None:
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
            if ledger is not None:
                yield GaugeMetricFamily(
                    "omaticaya_extender_reservations", "Reservations made by the filter and "
                    "not yet seen bound.", value=ledger.reserved(),
                )  # fmt: skip
                events = CounterMetricFamily(
                    "omaticaya_extender_reservation_events", "Reservations by event: reserved (the "
                    "filter narrowed a pod to a node), confirmed (seen bound there), moved "
                    "(bound elsewhere), expired (never seen bound).", labels=["event"],
                )  # fmt: skip
                for event, n in sorted(ledger.counts.items()):
                    events.add_metric([event], n)
                yield events
            if decisions is not None:
                made = CounterMetricFamily(
                    "omaticaya_extender_decisions",
                    "Per-node decisions, by verb, result and reason (scheduler/decisions.py).",
                    labels=["verb", "result", "reason"],
                )
                for key, n in sorted(decisions.counts.items()):
                    made.add_metric(list(key), n)
                yield made

    registry = CollectorRegistry()
    registry.register(_Collector())  # type: ignore[arg-type]
    return registry


def _pod_metrics(pods: Any, pod_problems: Any) -> Iterable[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
    skipped = CounterMetricFamily(
        "omaticaya_extender_pods_skipped", "Pods that could not be read (not counted in flight).",
        labels=["problem"],
    )  # fmt: skip
    for problem, n in sorted(getattr(pod_problems, "counts", {}).items()):
        skipped.add_metric([problem], n)
    yield skipped

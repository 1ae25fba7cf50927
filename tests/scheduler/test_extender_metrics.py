"""The extender's collectors (``scheduler.metrics``), each given only what it reads; and the
API request counts of the running extender's node cache on the real kube-apiserver (read from
``Informer.requests``: the collector looked for a private ``_client`` the cache never had, so
``omaticaya_extender_api_requests_total`` had no series)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from omaticaya_py.scheduler.metrics import (
    DecisionMetrics,
    ExtenderApiRequests,
    LeaseCacheMetrics,
    LedgerMetrics,
    MetricSources,
    metrics_registry,
)
from tests.extender import RunningExtender, metric
from tests.waiting import wait_for


class _Leases:
    """A Lease cache's face for its collector."""

    synced, skipped = True, 4

    def __len__(self) -> int:
        return 1


def _one(collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(collector)
    return registry


@pytest.mark.parametrize(
    ("collector", "name", "labels", "value"),
    [
        (ExtenderApiRequests(Counter({("list", "200"): 2})), "omaticaya_extender_api_requests_total",
         {"verb": "list", "result": "200"}, 2),
        (DecisionMetrics(SimpleNamespace(counts=Counter({("filter", "fail", "stale"): 3}))),
         "omaticaya_extender_decisions_total",
         {"verb": "filter", "result": "fail", "reason": "stale"}, 3),
        (LeaseCacheMetrics(_Leases()), "omaticaya_extender_leases_skipped_total", {}, 4),
        (LeaseCacheMetrics(_Leases()), "omaticaya_extender_cache_leases", {}, 1),
        (LedgerMetrics(SimpleNamespace(reserved=lambda: 5, counts=Counter({"expired": 6}))),
         "omaticaya_extender_reservation_events_total", {"event": "expired"}, 6),
        (LedgerMetrics(SimpleNamespace(reserved=lambda: 5, counts=Counter())),
         "omaticaya_extender_reservations", {}, 5),
    ],
)
def test_each_collector_reads_only_what_it_is_given(collector, name, labels, value):
    assert _one(collector).get_sample_value(name, labels) == value


def test_the_request_counter_is_read_at_each_scrape():
    requests: Counter[tuple[str, str]] = Counter()  # empty when wired: still the one read
    nodes = type("Nodes", (), {"__len__": lambda self: 0, "synced": True, "lists": 1,
                               "events": 0, "skipped": 0, "health": lambda self: (True, "ok")})()
    registry = metrics_registry(MetricSources(nodes, SimpleNamespace(counts={}), requests=requests))
    key = {"verb": "watch", "result": "200"}
    assert registry.get_sample_value("omaticaya_extender_api_requests_total", key) is None
    requests[("watch", "200")] += 1
    assert registry.get_sample_value("omaticaya_extender_api_requests_total", key) == 1


@pytest.mark.cluster
def test_the_running_extender_counts_its_node_cache_requests(dev_cluster):
    extender = RunningExtender(str(dev_cluster.kubeconfig))
    try:
        wait_for("readyz", lambda: extender.get("/readyz")[0] == 200, 30)
        status, text = extender.get("/metrics")
        assert status == 200
        assert metric(text, "omaticaya_extender_api_requests_total", verb="list",
                      result="200") >= 1
    finally:
        extender.close()

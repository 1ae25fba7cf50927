"""The agent's collectors (``agent.collectors``), each on a fresh registry with only the thing it
reads: a counter, a callable, the last tick's result. No Agent in sight but where a real tick
makes the result; the whole agent's exposition is tests/agent/test_metrics.py's."""

from __future__ import annotations

from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.collectors import (
    AgentCounters,
    ApiRequests,
    BuildInfo,
    NvmlErrors,
    PodResourcesErrors,
    SliceApiErrors,
)
from omaticaya_py.agent.gpu_collectors import GpuReadings
from omaticaya_py.agent.state import SnapshotCache
from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.core.model.sharing import Sharing
from omaticaya_py.core.rules.health import XidLedger
from omaticaya_py.sources.replay import TraceReader
from tests.helpers import H100_TRACE, policy_of, settings


def _registry(*collectors) -> CollectorRegistry:
    registry = CollectorRegistry()
    for c in collectors:
        registry.register(c)
    return registry


@pytest.mark.parametrize(
    ("collector", "name", "labels", "value"),
    [
        (NvmlErrors(Counter({("nvmlDeviceGetPowerUsage", "Unknown"): 2})),
         "omaticaya_nvml_errors_total", {"call": "nvmlDeviceGetPowerUsage", "error": "Unknown"}, 2),
        (NvmlErrors({}, lambda: 3), "omaticaya_xid_events_dropped_total", {}, 3),
        (NvmlErrors({}), "omaticaya_xid_events_dropped_total", {}, 0),
        (PodResourcesErrors(Counter({"UNAVAILABLE": 4}), {}),
         "omaticaya_pod_resources_errors_total", {"code": "UNAVAILABLE"}, 4),
        (PodResourcesErrors({}, Counter({"unknown-gpu": 5})),
         "omaticaya_pod_resources_skipped_total", {"reason": "unknown-gpu"}, 5),
        (SliceApiErrors(Counter({"get-forbidden": 1})),
         "omaticaya_slice_api_errors_total", {"kind": "get-forbidden"}, 1),
        (ApiRequests(Counter({("patch", "200"): 7, ("get", "error"): 1})),
         "omaticaya_api_requests_total", {"verb": "patch", "result": "200"}, 7),
        (ApiRequests(Counter({("patch", "200"): 7, ("get", "error"): 1})),
         "omaticaya_api_requests_total", {"verb": "get", "result": "error"}, 1),
    ],
)
def test_each_counter_collector_reads_only_its_counter(collector, name, labels, value):
    assert _registry(collector).get_sample_value(name, labels) == value


def test_a_counter_is_read_at_each_scrape():
    errors: Counter[tuple[str, str]] = Counter()
    registry = _registry(NvmlErrors(errors))
    key = {"call": "nvmlInit", "error": "DriverNotLoaded"}
    assert registry.get_sample_value("omaticaya_nvml_errors_total", key) is None
    errors[("nvmlInit", "DriverNotLoaded")] += 1
    assert registry.get_sample_value("omaticaya_nvml_errors_total", key) == 1


def test_agent_counters_from_the_cache_ledger_and_callables():
    cache = SnapshotCache(lambda: 0.0)
    cache.ticks, cache.patches_sent, cache.last_patch_wall_s = 3, 2, 1_700_000_000.0
    ledger = XidLedger(policy_of(settings()))
    steps, on_lease = [0], [False]
    registry = _registry(AgentCounters(
        cache, ledger, Counter({"GpuUnhealthy": 1}), lambda: steps[0], lambda: on_lease[0]))
    get = registry.get_sample_value
    assert get("omaticaya_ticks_total") == 3 and get("omaticaya_patches_total") == 2
    assert get("omaticaya_events_total", {"reason": "GpuUnhealthy"}) == 1
    assert get("omaticaya_last_patch_timestamp_seconds") == 1_700_000_000.0
    assert get("omaticaya_xid_events_seeded_total") == 0
    assert get("omaticaya_clock_steps_total") == 0 and get("omaticaya_heartbeat_on_lease") == 0
    steps[0], on_lease[0] = 2, True
    assert get("omaticaya_clock_steps_total") == 2 and get("omaticaya_heartbeat_on_lease") == 1


def test_gpu_readings_from_the_last_tick_result_only():
    last: list = [None]
    registry = _registry(BuildInfo(), GpuReadings(lambda: last[0], Sharing.of(settings())))
    get = registry.get_sample_value
    assert get("omaticaya_gpu_healthy", {"gpu": "0", "uuid": ""}) is None  # before a tick
    assert get("omaticaya_node_health", {"state": "Healthy"}) is None
    agent = Agent(load_settings(node_name="n"), TraceReader(H100_TRACE, at_s=14.0), NodeApi(None))
    last[0] = agent.tick()  # the one thing the collector is given: this result
    g = last[0].snapshot.gpus[0]
    key = {"gpu": "0", "uuid": g.uuid}
    assert get("omaticaya_gpu_memory_free_bytes", key) == g.memory_free_mib * 1024 * 1024
    assert get("omaticaya_gpu_healthy", key) == 1
    assert get("omaticaya_node_health", {"state": "Healthy"}) == 1
    assert get("omaticaya_node_health", {"state": "Unknown"}) == 0
    assert get("omaticaya_gpu_utilization_ratio",
               {**key, "pod": "", "namespace": "", "container": ""}) == pytest.approx(
        g.utilization_pct / 100)

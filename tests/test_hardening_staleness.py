"""Staleness that matches the publisher: the agent publishes how long its telemetry stays
current (``refresh_s`` and ``expires_at``: the heartbeat plus one schedule period plus the
jitter), and the extender uses it, falling back to its own TTL for agents that do not say."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from omaticaya_py.agent import Agent
from omaticaya_py.kube import NodeClient
from omaticaya_py.scheduler import ExtenderSettings, handle_filter, parse_node
from omaticaya_py.sources.replay import TraceReader
from tests.conftest import H100_TRACE, node_metadata
from tests.helpers import settings

P = "omaticaya.io/"
EXT = ExtenderSettings(_env_file=None)  # type: ignore[call-arg]  (TTL 300 + grace 60)


def pod(mib: int = 1024) -> dict:
    return {"metadata": {"annotations": {P + "gpu-memory-mib": str(mib)}}}


def verdict(name: str, labels: dict, annotations: dict, now: float) -> tuple[bool, str]:
    state = parse_node(name, labels, annotations)
    result = handle_filter({"Pod": pod(), "NodeNames": [name]}, EXT, {name: state}.get, now=now)
    return name in result["NodeNames"], result["FailedNodes"].get(name, "")


@pytest.mark.cluster
def test_an_hourly_agent_is_not_stale_between_its_writes(dev_cluster, admin_api, make_node):
    """``@hourly`` with a 2-hour heartbeat: the telemetry is rewritten up to ~3 h apart. The
    extender's fixed 300 + 60 s window called such a node stale after six minutes."""
    node = make_node()
    s = settings(node_name=node, trace=H100_TRACE, schedule="@hourly", heartbeat_s=7200, jitter_s=30)
    agent = Agent(s, TraceReader(H100_TRACE), NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig)))
    agent.tick()
    labels, annotations = node_metadata(admin_api, node)
    doc = json.loads(annotations[P + "telemetry"])
    read_at = datetime.fromisoformat(doc["read_at"].replace("Z", "+00:00")).timestamp()
    assert doc["refresh_s"] == 7200 + 3600 + 30
    expires = datetime.fromisoformat(doc["expires_at"].replace("Z", "+00:00")).timestamp()
    assert expires == read_at + 7200 + 3600 + 30

    assert verdict(node, labels, annotations, now=read_at + 3600) == (True, "")
    assert verdict(node, labels, annotations, now=expires + EXT.grace_s - 1)[0]
    ok, reason = verdict(node, labels, annotations, now=expires + EXT.grace_s + 1)
    assert not ok and "stale GPU telemetry" in reason and "expired" in reason


def test_an_old_agent_without_expiry_gets_the_extenders_ttl():
    doc = {"read_at": "2026-01-01T00:00:00Z", "health": "Healthy",
           "gpus": [{"index": 0, "memory_free_mib": 40960, "health": "Healthy"}]}  # fmt: skip
    at = datetime.fromisoformat("2026-01-01T00:00:00+00:00").timestamp()
    ann = {P + "telemetry": json.dumps(doc)}
    assert verdict("old", {P + "gpu.health": "Healthy"}, ann, now=at + 359)[0]
    ok, reason = verdict("old", {P + "gpu.health": "Healthy"}, ann, now=at + 361)
    assert not ok and "read_at older than 360s" in reason


@pytest.mark.parametrize(
    "expires_at",
    ["2025-12-31T23:00:00Z", "soon", 12, None, "9999-12-31T23:59:59Z"],
    ids=["before-read_at", "not-a-time", "a-number", "null", "year-9999"],
)
def test_a_bad_expiry_is_not_trusted(expires_at):
    """An ``expires_at`` before ``read_at``, unreadable, or more than 8 days after it (no working
    agent promises that: someone else wrote it) falls back to the TTL."""
    doc = {"read_at": "2026-01-01T00:00:00Z", "expires_at": expires_at, "health": "Healthy",
           "gpus": [{"index": 0, "memory_free_mib": 40960, "health": "Healthy"}]}  # fmt: skip
    at = datetime.fromisoformat("2026-01-01T00:00:00+00:00").timestamp()
    state = parse_node("n", {P + "gpu.health": "Healthy"}, {P + "telemetry": json.dumps(doc)})
    assert state.expires_at is None
    assert not verdict("n", {P + "gpu.health": "Healthy"}, {P + "telemetry": json.dumps(doc)}, now=at + 400)[0]

"""The scheduler extender's Node cache and probes, against the real kube-apiserver
(``scripts/dev-cluster``) where the cache is concerned: one hostile Node annotation must not take
the cache down, and ``/readyz`` must say when the list+watch is dead or stalled."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from starlette.testclient import TestClient

from omaticaya_py.kube import NodeCache
from omaticaya_py.scheduler import Extender, ExtenderSettings, create_app
from tests.extender import RunningExtender, metric
from tests.faultproxy import Fault, FaultProxy
from tests.waiting import wait_for

P = "omaticaya.io/"


def telemetry(free_mib: Any = 40960, *, read_at: str | None = None) -> str:
    """A telemetry annotation as the agent writes it (one healthy GPU); ``free_mib`` is put in
    the JSON as is, so that ``float('inf')`` writes ``Infinity``."""
    stamp = read_at or datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    doc = {"read_at": stamp, "health": "Healthy",
           "gpus": [{"index": 0, "memory_free_mib": free_mib, "health": "Healthy"}]}  # fmt: skip
    return json.dumps(doc)


GOOD_LABELS = {P + "gpu.health": "Healthy", P + "gpu.count": "1"}


@pytest.fixture
def extender(dev_cluster) -> Iterator[RunningExtender]:
    ext = RunningExtender(str(dev_cluster.kubeconfig))
    yield ext
    ext.close()


# ------------------------------------------------------------------------ the cluster ----


@pytest.mark.cluster
def test_one_hostile_node_annotation_does_not_kill_the_node_cache(make_node, dev_cluster):
    """``Infinity`` in a Node's telemetry (valid for ``json.loads``) used to raise
    OverflowError in the watch thread: the cache died, /readyz stayed 200 and every later Node
    change was missed. Now the bad Node fails the filter with a reason, logged once and counted,
    and the Nodes after it are still seen."""
    listed_bad = make_node(GOOD_LABELS, {P + "telemetry": telemetry(float("inf"))})
    ext = RunningExtender(str(dev_cluster.kubeconfig))
    try:
        wait_for("readyz", lambda: ext.get("/readyz")[0] == 200, 30)
        watched_bad = make_node(GOOD_LABELS, {P + "telemetry": telemetry(float("inf"))})
        good = make_node(GOOD_LABELS, {P + "telemetry": telemetry(40960)})
        result = wait_for(
            "the Node created after the bad ones to pass the filter",
            lambda: (r := ext.filter(listed_bad, watched_bad, good))["NodeNames"] == [good] and r,
            30,
        )
        for bad in (listed_bad, watched_bad):
            assert "unusable GPU telemetry" in result["FailedNodes"][bad]
        assert ext.get("/readyz") == (200, "ok")
        status, text = ext.get("/metrics")
        assert status == 200
        assert metric(text, "omaticaya_extender_node_problems_total") >= 2
        assert metric(text, "omaticaya_extender_cache_nodes") >= 3
    finally:
        ext.close()


@pytest.mark.cluster
def test_a_node_whose_parsing_raises_is_skipped_and_the_cache_keeps_serving(
    make_node, dev_cluster
):
    """Whatever a Node holds, an exception while parsing it skips that Node (dropped from the
    cache: the filter says it is unknown), logged once and counted; the watch goes on."""
    poison = "poison"

    def factory(transform, **kw):  # a parser bug that only one Node's content triggers
        def fragile(meta):
            if meta.annotations.get(P + "poison"):
                raise RecursionError("maximum recursion depth exceeded")
            return transform(meta)

        return NodeCache(fragile, **kw)

    ext = RunningExtender(str(dev_cluster.kubeconfig), cache_factory=factory)
    try:
        wait_for("readyz", lambda: ext.get("/readyz")[0] == 200, 30)
        bad = make_node(GOOD_LABELS, {P + "telemetry": telemetry(), P + "poison": poison})
        good = make_node(GOOD_LABELS, {P + "telemetry": telemetry()})
        result = wait_for(
            "the good Node to pass", lambda: (r := ext.filter(bad, good))["NodeNames"] == [good] and r, 30
        )
        assert "not yet in the omaticaya extender's cache" in result["FailedNodes"][bad]
        _, text = ext.get("/metrics")
        assert metric(text, "omaticaya_extender_nodes_skipped_total") == 1
        assert ext.get("/readyz")[0] == 200
    finally:
        ext.close()


@pytest.mark.cluster
def test_readyz_says_when_the_watch_stalls_and_recovers(dev_cluster, tmp_path):
    """The cache talks to the real API server through a proxy; when every request fails, the
    cache's last contact ages and readiness turns false with the reason; it comes back."""
    proxy = FaultProxy(dev_cluster)
    cache = NodeCache(
        lambda meta: meta.name,
        kubeconfig=str(proxy.kubeconfig(tmp_path / "kc")),
        watch_timeout_s=1,  # the proxy buffers whole answers: short watches
        backoff_s=0.05,
        backoff_max_s=0.2,
        stall_s=2.0,
    )
    try:
        cache.start()
        assert cache.wait_synced(30)
        assert cache.health() == (True, "ok")
        proxy.inject(*[Fault("*", status=503) for _ in range(10_000)])
        ok, reason = wait_for("the cache to report a stall", lambda: (h := cache.health()) and not h[0] and h, 20)
        assert "no successful list or watch" in reason and "503" in reason
        proxy.faults.clear()
        wait_for("the cache to recover", lambda: cache.health()[0], 20)
    finally:
        cache.stop()
        proxy.close()


# ------------------------------------------------------------------------------ pure ----


def test_readyz_reports_the_caches_health():
    state = {"health": (True, "ok")}
    ext = Extender(
        ExtenderSettings(_env_file=None),  # type: ignore[call-arg]
        lambda n: None,
        synced=lambda: True,
        health=lambda: state["health"],
    )
    with TestClient(create_app(ext)) as client:
        assert client.get("/readyz").status_code == 200
        state["health"] = (False, "node cache thread is not running")
        r = client.get("/readyz")
        assert r.status_code == 503 and r.text == "node cache thread is not running"


@pytest.mark.cluster
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_cache_thread_is_not_ready(dev_cluster, monkeypatch):
    cache = NodeCache(lambda meta: meta.name, kubeconfig=str(dev_cluster.kubeconfig))

    def boom() -> None:
        raise MemoryError("the thread dies")

    monkeypatch.setattr(cache, "_run", boom)
    try:
        cache.start()
        wait_for("the thread to die", lambda: not cache._thread.is_alive(), 10)  # noqa: SLF001
        ok, reason = cache.health()
        assert not ok and "not running" in reason
    finally:
        cache.stop()

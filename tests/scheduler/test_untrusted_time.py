"""Untrusted time in the extender (issue 23, items 1 and 2): a time in year 1, a time far ahead,
an agent whose clock is behind, and anything else on one node that makes judging it raise, are
that node's problem. The other nodes are judged as before, the request never fails, and the
problem is counted (``omaticaya_extender_node_problems_total{problem}``) and logged once."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from loguru import logger
from starlette.testclient import TestClient

from omaticaya_py.core.rules.liveness import READ_AT_AHEAD, Seen
from omaticaya_py.scheduler import Extender, ExtenderSettings, create_app, parse_node
from omaticaya_py.scheduler.app import NodeProblems
from omaticaya_py.scheduler.metrics import MetricSources, metrics_registry
from omaticaya_py.scheduler.nodeview import LeaseState, NodeView, with_policy
from tests.helpers import Clock
from tests.scheduler.untrusted_time_support import (  # the names moved out, for this file's tests
    put_lease,  # noqa: F401
)
from tests.waiting import wait_for

P = "omaticaya.io/"
NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
S = ExtenderSettings(_env_file=None)  # type: ignore[call-arg]
HEALTHY = {P + "gpu.health": "Healthy"}
POD = {"metadata": {"uid": "u1", "namespace": "d", "name": "p",
                    "annotations": {P + "gpu-memory-mib": "1024"}}}  # fmt: skip


def tele(**kw: Any) -> dict[str, str]:
    doc = {"read_at": "2025-12-31T23:59:50Z", "health": "Healthy",
           "gpus": [{"index": 0, "memory_free_mib": 40960, "health": "Healthy"}], **kw}  # fmt: skip
    return {P + "telemetry": json.dumps(doc)}


class _Cache:
    """The node cache's face for ``metrics_registry``, over a dict."""

    synced, lists, events, skipped = True, 1, 0, 0

    def __init__(self, states: dict[str, Any]) -> None:
        self.states = states

    def __len__(self) -> int:
        return len(self.states)

    def health(self) -> tuple[bool, str]:
        return True, "ok"


def served(states: dict[str, Any], **kw: Any) -> tuple[TestClient, NodeProblems]:
    problems = NodeProblems()
    ext = Extender(S, states.get, clock=lambda: NOW, on_problem=problems.judged, **kw)
    registry = metrics_registry(MetricSources(_Cache(states), problems, decisions=ext.decisions))
    return TestClient(create_app(ext, registry)), problems


def problems_metric(client: TestClient, problem: str) -> float:
    from tests.extender import metric

    text = client.get("/metrics").text
    return metric(text, "omaticaya_extender_node_problems_total", problem=problem)


@pytest.fixture
def warnings() -> Any:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING")
    yield lines
    logger.remove(sink)


def call(client: TestClient, verb: str, names: list[str]) -> Any:
    response = client.post(f"/{verb}", json={"Pod": POD, "NodeNames": names})
    assert response.status_code == 200, response.text
    return response.json()


def test_a_year_one_time_fails_that_node_only():
    """``0001-01-01T00:00:00+23:59`` is valid RFC 3339 and lies in year 0 once in UTC: the whole
    /filter answered an Error (and /prioritize 500) for every node."""
    year1 = "0001-01-01T00:00:00+23:59"
    states = {
        "year1": parse_node("year1", HEALTHY, tele(read_at=year1, expires_at=year1)),
        "good": parse_node("good", HEALTHY, tele()),
    }
    client, _ = served(states)
    result = call(client, "filter", ["year1", "good"])
    assert result["Error"] == "" and result["NodeNames"] == ["good"]
    assert "without a valid read_at" in result["FailedNodes"]["year1"]
    assert call(client, "prioritize", ["year1", "good"]) == [
        {"Host": "year1", "Score": 0}, {"Host": "good", "Score": 10}]  # fmt: skip


def test_a_lease_renewed_past_year_9999_is_that_nodes_problem():
    """A Lease whose ``renewTime`` + ``leaseDurationSeconds`` lies beyond year 9999: its
    deadline could not be printed either."""
    ref = "ns/omaticaya-node-far"
    far = LeaseState("agent", 253402300799.0, 8 * 86400.0)
    states = {
        "far": parse_node("far", HEALTHY, tele(lease=ref)),
        "good": parse_node("good", HEALTHY, tele()),
    }
    client, _ = served(states, leases={ref: far}.get)
    result = call(client, "filter", ["far", "good"])
    assert result["NodeNames"] == ["good"]
    assert "renewTime 9999-12-31T23:59:59Z is" in result["FailedNodes"]["far"]


def test_a_time_far_ahead_fails_the_node_counted_once(warnings):
    """A dead agent whose ``read_at`` is a year ahead passed as fresh for a year."""
    ahead = {"read_at": "2027-01-01T00:00:00Z", "expires_at": "2027-01-01T00:05:30Z"}
    states: dict[str, Any] = {
        "ahead": parse_node("ahead", HEALTHY, tele(**ahead)),
        "good": parse_node("good", HEALTHY, tele()),
    }
    client, problems = served(states)
    for _ in range(3):
        result = call(client, "filter", ["ahead", "good"])
        assert result["NodeNames"] == ["good"]
        call(client, "prioritize", ["ahead", "good"])
    reason = result["FailedNodes"]["ahead"]
    assert reason.startswith("node(s) had unusable GPU telemetry (")
    assert (
        "read_at 2027-01-01T00:00:00Z is 31536000s ahead of this clock (allowed skew 300s)"
        in reason
    )
    assert problems_metric(client, READ_AT_AHEAD) == 1
    assert sum(READ_AT_AHEAD in line for line in warnings) == 1
    # its clock fixed: usable again; ahead once more: counted again
    states["ahead"] = parse_node("ahead", HEALTHY, tele())
    assert call(client, "filter", ["ahead", "good"])["NodeNames"] == ["ahead", "good"]
    states["ahead"] = parse_node("ahead", HEALTHY, tele(**ahead))
    assert call(client, "filter", ["ahead", "good"])["NodeNames"] == ["good"]
    assert problems_metric(client, READ_AT_AHEAD) == 2


def test_judging_that_raises_is_that_nodes_reason_counted_and_logged_once(warnings):
    """Whatever a node carries, an exception while judging it (here: its in-flight placements)
    fails that node with a reason; the others are judged."""

    def placements(name: str) -> Any:
        if name == "bad":
            raise RuntimeError("a placement no one expected")
        return ()

    states = {n: parse_node(n, HEALTHY, tele()) for n in ("bad", "good")}
    client, _ = served(states, placements=placements)
    for _ in range(2):
        result = call(client, "filter", ["bad", "good"])
        assert result["Error"] == "" and result["NodeNames"] == ["good"]
        assert call(client, "prioritize", ["bad", "good"]) == [
            {"Host": "bad", "Score": 0}, {"Host": "good", "Score": 10}]  # fmt: skip
    assert result["FailedNodes"]["bad"] == (
        "node(s) could not be judged by the omaticaya extender (judging raised RuntimeError)"
    )
    assert problems_metric(client, "judging raised RuntimeError") == 1
    from tests.extender import metric

    text = client.get("/metrics").text
    assert metric(text, "omaticaya_extender_decisions_total", verb="filter", result="failed",
                  reason="judging-failed") == 2  # fmt: skip
    logged = [line for line in warnings if "judging raised RuntimeError" in line]
    assert len(logged) == 1 and "a placement no one expected" in logged[0]


def test_a_node_document_of_another_shape_fails_alone():
    """Without ``nodeCacheCapable`` the scheduler sends whole Nodes: a ``metadata`` that is not
    an object, or a name that is not text, raised for the whole request."""
    good = {"metadata": {"name": "good", "labels": HEALTHY,
                         "annotations": tele(read_at="2025-12-31T23:59:50Z")}}  # fmt: skip
    client, _ = served({})
    for odd in ({"metadata": "x"}, {"metadata": {"name": {"a": 1}}}, {"metadata": None}):
        body = {"Pod": POD, "Nodes": {"items": [odd, good]}}
        response = client.post("/filter", json=body)
        assert response.status_code == 200 and response.json()["Error"] == ""
        assert [n["metadata"]["name"] for n in response.json()["Nodes"]["items"]] == ["good"]
        assert client.post("/prioritize", json=body).status_code == 200


def test_a_live_agent_behind_by_10_minutes_is_fresh_while_its_values_change():
    """The extender's watch saw ``read_at`` change 5 s ago (its monotonic clock): fresh,
    although ``read_at`` says 10 min ago; once it has not changed for its validity + grace,
    stale with the extender's own count of seconds."""
    behind = parse_node("behind", HEALTHY, tele(read_at="2025-12-31T23:50:00Z",
                                                 expires_at="2025-12-31T23:55:30Z"))  # fmt: skip
    mono = Clock(1000.0)

    def state(seen: Seen | None) -> NodeView:
        return with_policy(behind, {}, "omaticaya.io", seen)

    states: dict[str, Any] = {"behind": state(Seen(995.0, changed=True))}
    client, _ = served(states, monotonic=mono)
    assert call(client, "filter", ["behind"])["NodeNames"] == ["behind"]
    mono.t = 995.0 + 330 + 60 + 1
    reason = call(client, "filter", ["behind"])["FailedNodes"]["behind"]
    assert "read_at unchanged for 391s (limit 390s)" in reason
    # never seen to change (the extender just started): its own clock is all there is
    states["behind"] = state(Seen(mono.t, changed=False))
    assert (
        "expired at 2025-12-31T23:55:30Z"
        in call(client, "filter", ["behind"])["FailedNodes"]["behind"]
    )


# ------------------------------------------------------------------ the real API server ----

NAMESPACE = "omaticaya-skew-test"




@pytest.mark.cluster
def test_skewed_agents_on_the_real_watch(dev_cluster, admin_api, make_node):
    """Through the extender's real Node and Lease watches: an agent 10 min behind (Lease mode
    and telemetry mode) is fresh while its Lease is renewed / its telemetry rewritten, and
    stale once that stops; a node a year ahead fails, counted; one in year 1 fails alone."""
    from kubernetes import client

    from tests.extender import RunningExtender, metric

    leases_api = client.CoordinationV1Api(admin_api.api_client)
    lease_mode, tele_mode, ahead, year1 = (make_node() for _ in range(4))
    behind = timedelta(minutes=10)
    lease = f"omaticaya-node-{lease_mode}"

    def stamp(when: datetime) -> str:
        return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    def write(node: str, **doc: Any) -> None:
        annotations = tele(**doc)
        admin_api.patch_node(node, {"metadata": {"labels": HEALTHY, "annotations": annotations}})

    def beat() -> None:
        """One heartbeat of both agents 10 min behind: the Lease renewed, the telemetry
        rewritten."""
        now = datetime.now(UTC) - behind
        put_lease(admin_api, NAMESPACE, lease, now, duration_s=5)
        write(tele_mode, read_at=stamp(now), expires_at=stamp(now + timedelta(seconds=5)))

    lease_ref = f"{NAMESPACE}/{lease}"
    write(lease_mode, read_at=stamp(datetime.now(UTC) - behind), lease=lease_ref)
    beat()
    write(ahead, read_at=stamp(datetime.now(UTC) + timedelta(days=365)))
    write(year1, read_at="0001-01-01T00:00:00+23:59")

    ext = RunningExtender(str(dev_cluster.kubeconfig), {"grace_s": 1, "lease_namespace": NAMESPACE})
    stop = threading.Event()
    beating = threading.Thread(target=lambda: [beat() for _ in iter(lambda: stop.wait(0.5), True)])
    beating.start()
    names = [lease_mode, tele_mode, ahead, year1]

    def passing(expected: set[str]) -> Any:
        result = ext.filter(*names)
        # the filter narrows the pod to one node: the others that fit "fit, another was chosen"
        fit = {n for n, why in result["FailedNodes"].items() if "another was chosen" in why}
        return result if set(result["NodeNames"]) | fit == expected else None

    try:
        result = wait_for(
            "both agents 10 min behind to pass while beating",
            lambda: passing({lease_mode, tele_mode}), 60,
        )  # fmt: skip
        failed = result["FailedNodes"]
        assert result["Error"] == ""
        assert "ahead of this clock (allowed skew 300s)" in failed[ahead]
        assert "without a valid read_at" in failed[year1]
        _, text = ext.get("/metrics")
        assert metric(text, "omaticaya_extender_node_problems_total", problem=READ_AT_AHEAD) == 1

        stop.set()
        beating.join(10)
        result = wait_for("both to turn stale once the beats stop", lambda: passing(set()), 60)
        assert "renewTime unchanged for" in result["FailedNodes"][lease_mode]
        assert "read_at unchanged for" in result["FailedNodes"][tele_mode]
    finally:
        stop.set()
        beating.join(10)
        ext.close()
        try:
            leases_api.delete_namespaced_lease(lease, NAMESPACE)
        except client.exceptions.ApiException:
            pass

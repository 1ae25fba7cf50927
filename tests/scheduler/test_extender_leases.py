"""The extender judges a node whose telemetry names a Lease by that Lease's renewals: an agent
in a cluster keeps its liveness there and rewrites a quiet Node's telemetry only when a label
changes, so ``read_at`` + TTL would call every quiet node stale minutes after its last change."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from omaticaya_py.core.rules.liveness import FRESH, LivenessClock, node_liveness
from omaticaya_py.kube import LeaseCache
from omaticaya_py.scheduler import ExtenderSettings, parse_node
from omaticaya_py.scheduler.nodeview import LeaseState, lease_from_object
from omaticaya_py.scheduler.protocol import handle_filter, handle_prioritize
from tests.conftest import node_metadata
from tests.waiting import wait_for

P = "omaticaya.io/"
EXT = ExtenderSettings(_env_file=None)  # type: ignore[call-arg]  (TTL 300 + grace 60)
AT = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
REF = "omaticaya/omaticaya-node-n"


def pod(mib: int = 1024) -> dict:
    return {"metadata": {"annotations": {P + "gpu-memory-mib": str(mib)}}}


def annotations(**extra) -> dict:
    doc = {"read_at": "2026-01-01T00:00:00Z", "health": "Healthy",
           "gpus": [{"index": 0, "memory_free_mib": 40960, "health": "Healthy"}], **extra}  # fmt: skip
    return {P + "telemetry": json.dumps(doc)}


def verdict(state, now: float, leases=None) -> tuple[bool, str]:
    result = handle_filter(
        {"Pod": pod(), "NodeNames": ["n"]}, EXT, {"n": state}.get, now=now, leases=leases
    )
    return "n" in result["NodeNames"], result["FailedNodes"].get("n", "")


HELD = LeaseState("agent-pod", AT + 86400, 40)


@pytest.mark.parametrize(
    ("lease", "now", "fresh", "why"),
    [
        (HELD, AT + 86400 + 1, True, ""),
        (HELD, AT + 86400 + 40 + 60, True, ""),  # the last second of renewTime + duration + grace
        (HELD, AT + 86400 + 40 + 60 + 1, False, "expired at 2026-01-02T00:00:40Z, grace 60s"),
        (LeaseState("", AT + 86400, 40), AT + 86400 + 1, False, "released (no holder)"),
        (None, AT + 1, False, "not found"),
    ],
    ids=["renewed", "at-the-edge", "expired", "released", "missing"],
)
def test_the_lease_rule(lease, now, fresh, why):
    state = parse_node("n", {P + "gpu.health": "Healthy"}, annotations(lease=REF))
    assert state.lease == REF
    alive = node_liveness(state, LivenessClock(now, 60), ttl_s=300, leases={REF: lease}.get)
    assert (alive.kind == FRESH) is fresh
    ok, reason = verdict(state, now, {REF: lease}.get)
    assert ok is fresh
    assert why in reason and (fresh or f"Lease {REF}" in reason)


def test_a_renewed_lease_outlives_read_at_and_the_prioritize_scores_it():
    state = parse_node("n", {P + "gpu.health": "Healthy"}, annotations(lease=REF))
    now = AT + 86400 + 10  # a day after the last label change
    assert verdict(state, now, {REF: HELD}.get) == (True, "")
    ok, reason = verdict(state, now)  # no Lease watch: today's rule
    assert not ok and "read_at older than 360s" in reason
    scores = handle_prioritize(
        {"Pod": pod(), "NodeNames": ["n"]}, EXT, {"n": state}.get, now=now, leases={REF: HELD}.get
    )
    assert scores == [{"Host": "n", "Score": 10}]


def test_nodes_without_a_lease_keep_the_telemetry_rule():
    state = parse_node("n", {P + "gpu.health": "Healthy"}, annotations())
    assert state.lease is None
    assert verdict(state, AT + 359, {}.get)[0]
    assert not verdict(state, AT + 361, {}.get)[0]


@pytest.mark.parametrize(
    "ref", ["no-slash", "/name", "ns/", "NS/name", "ns/a/b", 12, None, "x" * 64 + "/n"]
)
def test_a_bad_lease_reference_is_ignored(ref):
    state = parse_node("n", {P + "gpu.health": "Healthy"}, annotations(lease=ref))
    assert state.lease is None


@pytest.mark.parametrize(
    "spec",
    [
        {"holderIdentity": "a", "leaseDurationSeconds": 40},
        {"holderIdentity": "a", "renewTime": "yesterday", "leaseDurationSeconds": 40},
        {"holderIdentity": "a", "renewTime": "0001-01-01T00:00:00+23:59", "leaseDurationSeconds": 40},
        {"holderIdentity": "a", "renewTime": "0000-12-31T00:01:00.000000Z", "leaseDurationSeconds": 40},
        {"holderIdentity": "a", "renewTime": "2026-01-01T00:00:00.000000Z"},
        {"holderIdentity": "a", "renewTime": "2026-01-01T00:00:00Z", "leaseDurationSeconds": 0},
        {"holderIdentity": "a", "renewTime": "2026-01-01T00:00:00Z", "leaseDurationSeconds": 1e9},
        {"holderIdentity": "a", "renewTime": "2026-01-01T00:00:00Z", "leaseDurationSeconds": True},
        {"holderIdentity": 7, "renewTime": "2026-01-01T00:00:00Z", "leaseDurationSeconds": 40},
    ],
)
def test_a_lease_that_cannot_be_judged_by_raises(spec):
    with pytest.raises(ValueError):
        lease_from_object({"spec": spec})


def test_a_lease_is_read():
    lease = lease_from_object({"spec": {"renewTime": "2026-01-01T00:00:00.500000Z",
                                        "leaseDurationSeconds": 40}})  # fmt: skip
    assert lease == LeaseState("", AT + 0.5, 40.0)


# ------------------------------------------------------------------ the real API server ----


@pytest.mark.cluster
def test_a_quiet_node_with_a_renewed_lease_passes_and_a_lapsed_one_is_stale(
    dev_cluster, admin_api, make_node
):
    """A real agent creates its Lease and writes the telemetry once; its Lease client renews the
    Lease at chosen times; the extender's Lease cache (list+watch on the real server) follows,
    and the filter, judged at chosen instants, passes the quiet node a day after ``read_at``,
    then calls it stale once the renewals stop, the holder is cleared or the Lease is gone."""
    from kubernetes import client

    from tests.helpers import Clock
    from tests.kube.lease_cluster_support import NAMESPACE, POD, make_agent

    try:
        admin_api.create_namespace({"metadata": {"name": NAMESPACE}})
    except client.exceptions.ApiException as exc:
        if exc.status != 409:
            raise
    leases_api = client.CoordinationV1Api(admin_api.api_client)
    node = make_node()
    agent = make_agent(dev_cluster.kubeconfig, node, NAMESPACE, Clock(3.0), heartbeat_s=30)
    agent.tick()  # the Lease created, the Node labelled and its telemetry written
    labels, ann = node_metadata(admin_api, node)
    state = parse_node(node, labels, ann)
    assert agent.lease is not None and state.lease == agent.lease.ref
    assert state.read_at is not None and state.expires_at is None

    # a short server-side watch timeout: stop() waits for the open watch to end
    cache = LeaseCache(
        lease_from_object, NAMESPACE, kubeconfig=str(dev_cluster.kubeconfig), watch_timeout_s=5
    )
    cache.start()
    try:
        assert cache.wait_synced(30)

        def judged(now: float) -> tuple[bool, str]:
            result = handle_filter(
                {"Pod": pod(), "NodeNames": [node]}, EXT, {node: state}.get, now=now,
                leases=cache.lease,
            )  # fmt: skip
            return node in result["NodeNames"], result["FailedNodes"].get(node, "")

        def renewed_at(t: float) -> bool:
            lease = cache.lease(state.lease)
            return lease is not None and lease.renewed_at == t and lease.holder == POD

        later = float(int(state.read_at)) + 86400  # a day after the last label change
        agent.lease.renew(datetime.fromtimestamp(later, timezone.utc))
        wait_for("the lease cache to see the renewal", lambda: renewed_at(later), 30)
        duration = cache.lease(state.lease).duration_s
        assert duration == 40
        assert judged(later + 30) == (True, "")  # fresh on the Lease
        assert not verdict_without_leases(state, node, later + 30)[0]  # read_at: stale

        # the renewals stop: stale once renewTime + duration + grace has passed
        ok, reason = judged(later + duration + EXT.grace_s + 1)
        assert not ok and "expired at" in reason and state.lease in reason

        # a renewal moves it on again; then the holder releases it: stale at once
        agent.lease.renew(datetime.fromtimestamp(later + 600, timezone.utc))
        wait_for("the second renewal", lambda: renewed_at(later + 600), 30)
        assert judged(later + 600 + 1)[0]
        agent.lease.release()
        wait_for(
            "the lease cache to see the release",
            lambda: (cache.lease(state.lease) or HELD).holder == "",
            30,
        )
        ok, reason = judged(later + 600 + 1)
        assert not ok and "released (no holder)" in reason

        # a Lease that cannot be judged by (no renewTime) is skipped and counted, not stored
        bad = f"omaticaya-node-{node}-bad"
        leases_api.create_namespaced_lease(
            NAMESPACE, {"metadata": {"name": bad}, "spec": {"holderIdentity": "x"}}
        )
        wait_for("the bad Lease to be skipped", lambda: cache.skipped >= 1, 30)
        assert cache.lease(f"{NAMESPACE}/{bad}") is None
        leases_api.delete_namespaced_lease(bad, NAMESPACE)

        # the Lease deleted: missing once the cache has synced means stale
        leases_api.delete_namespaced_lease(state.lease.split("/")[1], NAMESPACE)
        wait_for("the lease cache to drop the Lease", lambda: cache.lease(state.lease) is None, 30)
        ok, reason = judged(later + 600 + 1)
        assert not ok and "not found" in reason
    finally:
        cache.stop()


def verdict_without_leases(state, node: str, now: float) -> tuple[bool, str]:
    result = handle_filter({"Pod": pod(), "NodeNames": [node]}, EXT, {node: state}.get, now=now)
    return node in result["NodeNames"], result["FailedNodes"].get(node, "")

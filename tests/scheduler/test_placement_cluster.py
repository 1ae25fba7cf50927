"""End to end: a burst of GPU pods on a real kube-apiserver + kube-scheduler (the dev cluster's
release) with the extender's in-flight accounting (``scheduler.inflight``), and the extender
restarted mid-burst.

Three Nodes labelled by real agents replaying one-GPU traces: big (70000 MiB free: room for two
30 GiB pods), mid (35000: one), small (20000: none). No kubelet runs, so no pod ever starts and
the telemetry never shows their memory: a placement counts until its pod is deleted (settle time
600 s). Ten 30 GiB pods created together: three bind (two on big, one on mid), seven wait with
the in-flight reason; a restarted extender rebuilds the placements from the pod watch; deleting
the bound pods frees their room and the waiting pods bind.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.scheduler.placement_cluster_support import (  # the names moved out, for this file's tests
    _restart_extender,  # noqa: F401
    api,  # noqa: F401
    sched_settings,  # noqa: F401
)
from tests.scheduler.scheduling_cluster_support import (
    Agents,
    ExtenderScheduler,
    bound_node,
    gpu_pod,
    schedulable,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SCHEDULER = "omaticaya-burst"
FREE = {"big": 70000, "mid": 35000, "small": 20000}
POD_MIB = 30720
ROOM = {role: free // POD_MIB for role, free in FREE.items()}  # big 2, mid 1, small 0




@pytest.fixture(scope="module")
def burst(api, scheduling_cluster, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """Namespace, three labelled Nodes and a kube-scheduler with its extender (settle 600 s)."""
    tmp = tmp_path_factory.mktemp("burst")
    ns = f"burst-{os.getpid()}"
    api.create_namespace({"metadata": {"name": ns}})
    api.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    agents = Agents(scheduling_cluster, tmp)
    names = {role: f"burst-{role}-{os.getpid()}" for role in FREE}
    env = {"OMATICAYA_SETTLE_S": "600", "OMATICAYA_EXTENDER_SCHEDULER_NAME": SCHEDULER}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    sched = None
    try:
        for role, name in names.items():
            api.create_node(
                {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}
            )
            schedulable(api, name)
            agents.start(name, FREE[role])
        wait_for(
            "the agents to label the nodes",
            lambda: all(
                "omaticaya.io/gpu.health" in (api.read_node(n).metadata.labels or {})
                for n in names.values()
            ),
            30,
        )
        sched = ExtenderScheduler(scheduling_cluster, tmp, SCHEDULER, "spread", settle_s=60)
        yield {"ns": ns, "names": names, "sched": sched, "tmp": tmp, "cluster": scheduling_cluster}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if sched is not None:
            sched.close()
        agents.stop_all()
        for name in names.values():
            try:
                api.delete_node(name)
            except Exception:  # noqa: BLE001
                pass
        api.delete_namespace(ns)


def _placement(api, ns: str) -> dict[str, str]:
    """{pod: node} of the bound pods in ``ns``."""
    return {
        p.metadata.name: p.spec.node_name
        for p in api.list_namespaced_pod(ns).items
        if p.spec.node_name
    }


def _unschedulable(api, ns: str, pod: str) -> str | None:
    p = api.read_namespaced_pod(pod, ns)
    assert not p.spec.node_name, f"{pod} was bound to {p.spec.node_name}"
    for c in p.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return c.message
    return None


def _check_room(api, ns: str, names: dict[str, str]) -> Counter[str]:
    on = Counter(_placement(api, ns).values())
    for role, name in names.items():
        assert on[name] <= ROOM[role], f"{on[name]} pods of {POD_MIB} MiB on {role}: {on}"
    return on




def _metrics(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        return r.read().decode()


def _inflight_pods(port: int) -> int:
    for line in _metrics(port).splitlines():
        if line.startswith("omaticaya_extender_inflight_pods "):
            return int(float(line.split()[1]))
    raise AssertionError("no omaticaya_extender_inflight_pods in /metrics")




def test_a_burst_is_not_all_sent_to_the_freest_gpu_and_survives_a_restart(api, burst):
    ns, names = burst["ns"], burst["names"]
    pods = [f"burst-{i}" for i in range(10)]
    for pod in pods:  # all ten at once, before any is scheduled
        api.create_namespaced_pod(ns, gpu_pod(pod, SCHEDULER, POD_MIB))
    expected = sum(ROOM.values())
    wait_for(f"{expected} pods bound", lambda: len(_placement(api, ns)) >= expected, 30)
    waiting = [p for p in pods if p not in _placement(api, ns)]

    def all_wait_in_flight() -> bool:
        _check_room(api, ns, names)
        messages = [_unschedulable(api, ns, p) for p in waiting]
        return all(m and "room taken by in-flight pods" in m for m in messages)

    wait_for("the rest to wait with the in-flight reason", all_wait_in_flight, 30)
    on = _check_room(api, ns, names)
    assert on == {names["big"]: 2, names["mid"]: 1}, on

    # the extender restarts: it rebuilds the placements from the pod watch
    _restart_extender(burst["sched"])
    api.create_namespaced_pod(ns, gpu_pod("after-restart", SCHEDULER, POD_MIB))
    waiting.append("after-restart")
    wait_for(
        "after-restart to wait with the in-flight reason",
        lambda: "room taken by in-flight pods" in (_unschedulable(api, ns, "after-restart") or ""),
        30,
    )
    _check_room(api, ns, names)

    # the bound pods go away: their room is free again, the waiting pods bind into it
    for pod, _node in _placement(api, ns).items():
        api.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
    # the scheduler may retry the waiting pods on the deletions before the extender's watch has
    # seen them; once the extender holds no placement of a deleted pod, touch the waiting pods
    # so that the scheduler retries them now rather than at its 60 s flush of unschedulable pods
    port = sched_settings(burst["sched"]).port
    touched: list[str] = []

    def rebound() -> bool:
        bound = _placement(api, ns)
        if len(bound) >= expected:
            return True
        if not touched and _inflight_pods(port) == len(bound):  # the deleted ones are gone
            for pod in (p for p in waiting if p not in bound):
                api.patch_namespaced_pod(pod, ns, {"metadata": {"labels": {"retry": "1"}}})
                touched.append(pod)
        return False

    wait_for(f"{expected} more pods bound", rebound, 40)
    on = _check_room(api, ns, names)
    assert on == {names["big"]: 2, names["mid"]: 1}, on
    assert bound_node(api, ns, next(iter(_placement(api, ns)))) in names.values()


def test_pod_cache_lists_watches_and_skips_a_bad_pod(api, dev_cluster):
    """kube.PodCache on the real API: placements appear and go with their pods; a pod whose
    transform raises is skipped and counted, never fatal."""
    from omaticaya_py.kube import PodCache
    from omaticaya_py.scheduler.ledger import PodProblems, placement_from_pod

    ns = f"podcache-{os.getpid()}"
    api.create_namespace({"metadata": {"name": ns}})
    problems = PodProblems()

    def transform(pod: Any, previous: Any) -> Any:
        if pod["metadata"]["name"] == "hostile":
            raise ValueError("hostile pod")
        return placement_from_pod(pod, previous,
                                  now=0.0)  # fmt: skip

    def bound(name: str, mib: str = "30720") -> dict[str, Any]:
        return {
            "metadata": {"name": name, "annotations": {"omaticaya.io/gpu-memory-mib": mib}},
            "spec": {"schedulerName": SCHEDULER, "nodeName": "somewhere",
                     "containers": [{"name": "c", "image": "pause"}]},
        }  # fmt: skip

    def mine() -> set[str]:
        return {k for k in cache.snapshot() if k.startswith(f"{ns}/")}

    api.create_namespaced_pod(ns, bound("before"))
    cache = PodCache(
        transform, field_selector=f"spec.schedulerName={SCHEDULER},spec.nodeName!=",
        kubeconfig=str(dev_cluster.kubeconfig), on_skip=problems.skipped,
    ).start()  # fmt: skip
    try:
        assert cache.wait_synced(10)
        assert mine() == {f"{ns}/before"}
        api.create_namespaced_pod(ns, bound("hostile"))
        api.create_namespaced_pod(ns, bound("bad-need", "lots"))
        api.create_namespaced_pod(ns, bound("after"))
        wait_for("the watch to add 'after'", lambda: f"{ns}/after" in cache.snapshot(), 10)
        assert mine() == {f"{ns}/before", f"{ns}/after"}
        assert cache.skipped == 1 and problems.counts == {"skipped: ValueError": 1}
        api.delete_namespaced_pod("before", ns, grace_period_seconds=0)
        wait_for("the watch to drop 'before'", lambda: f"{ns}/before" not in cache.snapshot(), 10)
    finally:
        cache.stop()
        api.delete_namespace(ns)


@pytest.mark.parametrize(
    ("policy", "binds"),
    [("allow", True), ("score-zero", True), ("reject", False)],
)
def test_stale_node_follows_its_policy_annotation(api, burst, policy, binds):
    """A node whose agent was killed (75000 MiB free in its last reading, more than any other
    node): the only home of a 72000 MiB pod. Its ``scheduler.omaticaya.io/stale-policy`` annotation
    decides: ``allow`` and ``score-zero`` let the pod bind there, ``reject`` keeps it Pending
    with the stale reason."""
    from tests.scheduler.scheduling_cluster_support import GRACE_S, TTL_S, Agents

    ns = burst["ns"]
    # no other pod may compete for the stale node: the burst's pods still waiting would take its
    # room (its last reading has room for two of them) before this test's pod is created
    api.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    wait_for("the namespace's pods to be gone",
             lambda: not api.list_namespaced_pod(ns).items, 30)  # fmt: skip
    name = f"burst-stale-{policy}-{os.getpid()}"
    api.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name},
                                  "annotations": {"scheduler.omaticaya.io/stale-policy": policy}}})  # fmt: skip
    agents = Agents(burst["cluster"], burst["tmp"])
    try:
        schedulable(api, name)
        agents.start(name, 75000)
        wait_for("the stale node's labels",
                 lambda: "omaticaya.io/gpu.health" in (api.read_node(name).metadata.labels or {}),
                 30)  # fmt: skip
        agents.kill(name)
        expires = _expires_at(api, name)
        # stale: past the agent's own expires_at + the extender's grace (no fixed sleep: the
        # extender's clock decides, the test waits until the wall clock is past it)
        wait_for("the node's telemetry to go stale",
                 lambda: time.time() > expires + GRACE_S + 0.5, TTL_S + 30)  # fmt: skip
        pod = f"stale-{policy}"
        api.create_namespaced_pod(ns, gpu_pod(pod, SCHEDULER, 72000))
        if binds:
            assert bound_node(api, ns, pod) == name
        else:
            message = wait_for(f"{pod} to be Unschedulable", lambda: _unschedulable(api, ns, pod))
            assert "node(s) had stale GPU telemetry" in message, message
    finally:
        agents.stop_all()
        api.delete_node(name)


def _expires_at(api, name: str) -> float:
    import json
    from datetime import datetime

    doc = json.loads((api.read_node(name).metadata.annotations or {})["omaticaya.io/telemetry"])
    return datetime.fromisoformat(doc["expires_at"].replace("Z", "+00:00")).timestamp()


def test_pod_cache_lists_in_pages_and_feeds_the_ledger(api, dev_cluster):
    """The LIST is paginated (limit 2, then continue: 5 pods in 3 pages) and every change
    reaches the ledger through ``on_change``: the LIST's pods, a bound pod added, one deleted;
    a relist (a new Informer LIST) drops what went meanwhile.

    The pods are told apart by their node (``spec.nodeName``, one made up for the test), not
    by ``metadata.namespace``: a cluster-wide LIST of pods whose field selector names a
    namespace is served in pages that do not join up on kube-apiserver 1.31 and 1.37 (the first
    page's continue token is a key inside the namespace, read again from the top of every
    namespace: pages repeated, or, for a namespace that sorts before its pods' names, the
    rest lost); 1.20 paged it right. The extender's own selector
    (``spec.schedulerName=...,spec.nodeName!=``) names none."""
    from omaticaya_py.kube import PodCache
    from omaticaya_py.scheduler.ledger import Ledger, placement_from_pod

    ns = f"podpages-{os.getpid()}"
    api.create_namespace({"metadata": {"name": ns}})
    ledger = Ledger()

    def transform(pod: Any, previous: Any) -> Any:
        return placement_from_pod(pod, previous,
                                  now=0.0)  # fmt: skip

    def pod(name: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "annotations": {"omaticaya.io/gpu-memory-mib": "1024"}},
            "spec": {"schedulerName": SCHEDULER, "nodeName": f"pages-{ns}",
                     "containers": [{"name": "c", "image": "pause"}]},
        }  # fmt: skip

    for i in range(5):
        api.create_namespaced_pod(ns, pod(f"p{i}"))
    cache = PodCache(
        transform, field_selector=f"spec.nodeName=pages-{ns}",
        kubeconfig=str(dev_cluster.kubeconfig), on_change=ledger.pod_changed, page_size=2,
    ).start()  # fmt: skip
    try:
        assert cache.wait_synced(10)
        assert len(ledger.on_node(f"pages-{ns}")) == 5 and len(ledger) == 5
        assert cache.requests[("list", "200")] == 3, cache.requests  # 2 + 2 + 1
        api.create_namespaced_pod(ns, pod("late"))
        wait_for("the watch to add 'late'", lambda: len(ledger) == 6, 10)
        api.delete_namespaced_pod("p0", ns, grace_period_seconds=0)
        wait_for("the watch to drop 'p0'", lambda: len(ledger) == 5, 10)
        cache._stop.set()  # no watch: the next LIST is the relist a 410 would cause
        cache._thread.join(10)  # type: ignore[union-attr]
        api.delete_namespaced_pod("p1", ns, grace_period_seconds=0)
        wait_for("p1 gone", lambda: all(p.metadata.name != "p1"
                                        for p in api.list_namespaced_pod(ns).items), 10)  # fmt: skip
        cache._list()
        assert len(ledger) == 4 and {p.key for p in ledger.on_node(f"pages-{ns}")} == {
            f"{ns}/p2", f"{ns}/p3", f"{ns}/p4", f"{ns}/late"}
    finally:
        cache.stop()
        api.delete_namespace(ns)

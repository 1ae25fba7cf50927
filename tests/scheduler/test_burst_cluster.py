"""End to end (issue 24): bursts of GPU pods on a real kube-apiserver + kube-scheduler (the dev
cluster's release) with the extender's exact reservation rule (the filter narrows each pod to
one node and reserves its GPU memory there: ``scheduler.protocol``, ``scheduler.ledger``).

Nodes are written as an agent would write them (labels and telemetry from ``core.publish.render`` over
synthetic snapshots, valid for 600 s), made schedulable by hand; no kubelet runs, so bound pods
stay Pending and their memory never shows in the telemetry: each counts on its node until it is
deleted (settle time 600 s). Per GPU, what bound pods hold is computed from where they bound and
the GPUs their reservation chose (the ledger the extender filled, passed to ``serve``).

1. 40 pods x 40 GiB created at once onto 10 nodes x 8 idle 80 GiB GPUs: all bind, none ever
   waits (no FailedScheduling), no GPU holds more than its room. Before (issue 24): pods 8
   onward failed with "room taken by in-flight pods" and waited in the scheduler's backoff.
2. 14 pods x 40 GiB into 4 nodes x 2 GPUs with room for one each (8 slots), the extender
   restarted mid-burst: 8 bind, no GPU overcommitted, 6 Pending with the in-flight reason;
   deleting 3 bound pods lets 3 waiting ones bind, still without overcommit.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from tests.helpers import gpu, settings, snapshot
from tests.scheduler.burst_cluster_support import (  # the names moved out, for this file's tests
    bound,  # noqa: F401
    ledger_scheduler,  # noqa: F401
    waiting_reason,  # noqa: F401
)
from tests.scheduler.placement_cluster_support import _restart_extender, api  # noqa: F401
from tests.scheduler.scheduling_cluster_support import gpu_pod, schedulable
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

POD_MIB = 40960
IDLE_MIB = 81079
IN_FLIGHT = "room taken by in-flight pods"


def write_node(core: Any, name: str, free_mib: list[int]) -> None:
    """A Node labelled as the agent labels it: ``core.publish.render`` + the telemetry annotation of a
    snapshot of ``len(free_mib)`` H100s read now, promising its next rewrite in 600 s."""
    from omaticaya_py.core.publish.render import render
    from omaticaya_py.core.publish.render_telemetry import telemetry_annotation
    from omaticaya_py.core.rules.health import assess

    snap = snapshot(*(gpu(i, memory_free_mib=f) for i, f in enumerate(free_mib)),
                    read_at=datetime.now(timezone.utc))  # fmt: skip
    health = assess(snap)
    s = settings()
    labels = dict(render(snap, health, s, with_telemetry=False).labels)
    annotations, _ = telemetry_annotation(snap, health, s.prefix, refresh_s=600)
    core.create_node({"metadata": {"name": name, "annotations": annotations,
                                  "labels": {"kubernetes.io/hostname": name, **labels}}})  # fmt: skip
    schedulable(core, name)


@pytest.fixture
def setup(api, scheduling_cluster, tmp_path, request) -> Iterator[dict[str, Any]]:  # noqa: F811
    """A namespace, Nodes (``request.param``: {name suffix: free MiB per GPU}) and a
    kube-scheduler whose extender fills the returned ledger."""

    ns, tag = f"burst24-{os.getpid()}-{request.node.name[5:20].replace('_', '-')}", os.getpid()
    names = {f"b24-{tag}-{k}": free for k, free in request.param.items()}
    yield from ledger_scheduler(api, scheduling_cluster, tmp_path, ns, f"omaticaya-b24-{len(names)}",
                                names, lambda name, free: write_node(api, name, free))  # fmt: skip








def per_gpu(core: Any, ns: str, ledger: Any) -> tuple[Counter[tuple[str, int]], Counter[str]]:
    """(MiB per (node, GPU) of the bound pods whose reservation chose their GPUs, pods per
    node). A bound pod's ledger entry is on the node it bound to."""
    gpus: Counter[tuple[str, int]] = Counter()
    nodes: Counter[str] = Counter()
    for pod, (node, uid) in bound(core, ns).items():
        nodes[node] += 1
        held = ledger.get(uid)
        assert held is not None and held.node == node, (pod, node, held)
        for g in held.gpus:
            gpus[(node, g)] += held.memory_mib
    return gpus, nodes


def failed_scheduling(core: Any, ns: str) -> list[str]:
    return [f"{e.involved_object.name}: {e.message}" for e in core.list_namespaced_event(ns).items
            if e.reason == "FailedScheduling"]  # fmt: skip


ROOMY = {f"n{i}": [IDLE_MIB] * 8 for i in range(10)}


@pytest.mark.parametrize("setup", [ROOMY], indirect=True, ids=["10x8-idle"])
def test_a_burst_of_40_onto_idle_gpus_all_binds_without_waiting(api, setup):  # noqa: F811
    ns, ledger = setup["ns"], setup["ledger"]
    for i in range(40):  # all at once, before any is scheduled
        api.create_namespaced_pod(ns, gpu_pod(f"p{i}", setup["name"], POD_MIB))
    seen_waiting: list[str] = []

    def all_bound() -> bool:
        got = bound(api, ns)
        for pod in (f"p{i}" for i in range(40)):
            if pod not in got and IN_FLIGHT in waiting_reason(api, ns, pod):
                seen_waiting.append(pod)
        return len(got) == 40

    wait_for("40 pods bound", all_bound, 120, every_s=0.5)
    assert not seen_waiting, seen_waiting
    assert failed_scheduling(api, ns) == []
    gpus, nodes = per_gpu(api, ns, ledger)
    assert sum(gpus.values()) == 40 * POD_MIB  # every pod's GPU known: reserved, confirmed
    assert max(gpus.values()) <= IDLE_MIB, gpus
    assert sum(nodes.values()) == 40 and max(nodes.values()) <= 8
    wait_for("the pod watch to confirm every reservation", lambda: len(ledger) == 40, 30)
    assert ledger.counts["confirmed"] == 40 and ledger.counts["moved"] == 0


TIGHT = {f"t{i}": [50000, 50000] for i in range(4)}  # one 40 GiB pod per GPU: 8 slots


@pytest.mark.parametrize("setup", [TIGHT], indirect=True, ids=["4x2-tight"])
def test_a_burst_into_tight_room_across_a_restart(api, setup):  # noqa: F811
    from omaticaya_py.scheduler.ledger import Ledger

    ns, name = setup["ns"], setup["name"]
    pods = [f"t{i}" for i in range(14)]
    for pod in pods[:7]:
        api.create_namespaced_pod(ns, gpu_pod(pod, name, POD_MIB))
    wait_for("4 pods bound before the restart", lambda: len(bound(api, ns)) >= 4, 60)
    ledger = Ledger(600, 30)
    _restart_extender(setup["sched"], ledger=ledger)  # mid-burst: the rest arrive meanwhile
    for pod in pods[7:]:
        api.create_namespaced_pod(ns, gpu_pod(pod, name, POD_MIB))

    def check_room() -> Counter[str]:
        gpus, nodes = per_gpu(api, ns, ledger)
        assert all(n <= 2 for n in nodes.values()), nodes
        assert all(mib <= 50000 for mib in gpus.values()), gpus
        return nodes

    touched: set[str] = set()

    def settled() -> bool:
        check_room()
        got = bound(api, ns)
        if len(got) < 8:
            return False
        reasons = {p: waiting_reason(api, ns, p) for p in pods if p not in got}
        for pod, why in reasons.items():  # judged before the restarted extender synced
            if why and IN_FLIGHT not in why and pod not in touched:
                api.patch_namespaced_pod(pod, ns, {"metadata": {"labels": {"retry": "1"}}})
                touched.add(pod)
        return len(got) == 8 and all(IN_FLIGHT in why for why in reasons.values())

    wait_for("8 bound, 6 waiting with the in-flight reason", settled, 150, every_s=0.5)
    assert sum(check_room().values()) == 8

    # room frees: three bound pods go; three waiting ones bind into it
    first = sorted(bound(api, ns))[:3]
    for pod in first:
        api.delete_namespaced_pod(pod, ns, grace_period_seconds=0)
    retried: list[str] = []

    def rebound() -> bool:
        got = bound(api, ns)
        check_room()
        if len(got) >= 8 and not set(first) & set(got):
            return True
        if not retried and len(ledger) == len(got):  # the deletions reached the ledger
            for pod in (p for p in pods if p not in got and p not in first):
                api.patch_namespaced_pod(pod, ns, {"metadata": {"labels": {"retry": "2"}}})
                retried.append(pod)
        return False

    wait_for("3 waiting pods bound into the freed room", rebound, 120, every_s=0.5)
    assert sum(check_room().values()) == 8

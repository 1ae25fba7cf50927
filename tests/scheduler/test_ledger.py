"""The reservation ledger and the narrowing filter (issue 24, items 1-2): pure, table-driven.

The ledger (``scheduler.ledger``): reserve, replace on a refilter, confirm on bind, move when
bound elsewhere, expire, and stop counting once the node's telemetry shows the pod
(``inflight.pending`` over a ``fit.NodeRecord``). The filter (``protocol.Narrowing``) narrows a
pod to its one best node and reserves there: a burst of 40 pods x 40 GiB onto 10 nodes x 8 idle
80 GiB GPUs, none bound yet, all pass, and no GPU is promised more than it has.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from omaticaya_py.core.rules.liveness import LeaseState, Seen
from omaticaya_py.core.schema import GpuInfo, NodeGpuState
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.cache import NodeIndex
from omaticaya_py.scheduler.fit import (
    TEXTS,
    JudgingContext,
    NodeRecord,
    Reason,
    build_record,
    choose_gpus,
    window,
)
from omaticaya_py.scheduler.inflight import Placement, pending
from omaticaya_py.scheduler.ledger import Ledger
from omaticaya_py.scheduler.need import Need
from omaticaya_py.scheduler.nodeview import NodeView
from tests.scheduler.ledger_support import (  # the names moved out, for this file's tests
    NOW,  # noqa: F401
    node,  # noqa: F401
    res,  # noqa: F401
)

P = "omaticaya.io"
H100_FREE = 81079
POD_MIB = 40960






def bound(uid: str, node: str, *, at: float = NOW + 1, started: float | None = None,
          mib: int = 30000, baseline: int | None = 50000,
          on: tuple[int, int] | None = None) -> Placement:  # fmt: skip
    """A bound placement; ``on``: (its GPU, that GPU's free MiB when first counted)."""
    return Placement(f"ns/{uid}", uid, node, mib, 1, placed_at=at, started_at=started,
                     gpus=(on[0],) if on else (),
                     baselines=(on[1],) if on else ())  # fmt: skip


def held(ledger: Ledger) -> dict[str, list[tuple[str, tuple[int, ...], bool]]]:
    nodes = ("a", "b", "c")
    return {n: sorted((p.uid, p.gpus, p.bound) for p in ledger.on_node(n))
            for n in nodes if ledger.on_node(n)}  # fmt: skip


# ------------------------------------------------------------------------- the ledger ----

# each step: ("reserve", placement) | ("release", uid) | ("pod", key, old, new)
LEDGER_CASES = [
    ("reserve", [("reserve", res("u", "a", (1,)))], {"a": [("u", (1,), False)]}, 1, 0),
    ("refilter replaces: release, then reserve elsewhere",
     [("reserve", res("u", "a")), ("release", "u"), ("reserve", res("u", "b", (3,)))],
     {"b": [("u", (3,), False)]}, 1, 0),
    ("a second reserve replaces the first",
     [("reserve", res("u", "a")), ("reserve", res("u", "b"))], {"b": [("u", (0,), False)]}, 1, 0),
    ("confirmed on bind: its GPUs kept",
     [("reserve", res("u", "a", (2,))), ("pod", "ns/u", None, bound("u", "a"))],
     {"a": [("u", (2,), True)]}, 0, 1),
    ("moved when bound elsewhere: GPUs not known there",
     [("reserve", res("u", "a", (2,))), ("pod", "ns/u", None, bound("u", "b"))],
     {"b": [("u", (), True)]}, 0, 1),
    ("learned from the watch (a restart): added",
     [("pod", "ns/u", None, bound("u", "c"))], {"c": [("u", (), True)]}, 0, 1),
    ("deleted after binding: gone",
     [("reserve", res("u", "a")), ("pod", "ns/u", None, bound("u", "a")),
      ("pod", "ns/u", bound("u", "a"), None)], {}, 0, 0),
    ("a bound pod is not released by a refilter, nor reserved again",
     [("pod", "ns/u", None, bound("u", "a")), ("release", "u"), ("reserve", res("u", "b"))],
     {"a": [("u", (), True)]}, 0, 1),
    ("a pod recreated under the same name: the old uid goes",
     [("pod", "ns/u", None, bound("u", "a")),
      ("pod", "ns/u", bound("u", "a"), replace(bound("v", "b"), key="ns/u"))],
     {"b": [("v", (), True)]}, 0, 1),
    ("never bound: dropped at the next reservation after assume_s",
     [("reserve", res("u", "a")), ("reserve", res("v", "b", at=NOW + 31))],
     {"b": [("v", (0,), False)]}, 1, 0),
]  # fmt: skip


@pytest.mark.parametrize(("case", "steps", "nodes", "reserved", "bound_n"), LEDGER_CASES,
                         ids=[c[0] for c in LEDGER_CASES])  # fmt: skip
def test_ledger(case, steps, nodes, reserved, bound_n):
    ledger = Ledger(settle_s=60, assume_s=30)
    versions = {n: ledger.versions.get(n, 0) for n in "abc"}
    for step in steps:
        if step[0] == "reserve":
            ledger.reserve(step[1])
        elif step[0] == "release":
            ledger.release(step[1])
        else:
            ledger.pod_changed(*step[1:])
    assert held(ledger) == nodes, case
    assert (ledger.reserved(), len(ledger)) == (reserved, bound_n), case
    for n in nodes:  # every node whose placements changed has a new version
        assert ledger.versions.get(n, 0) != versions[n], case


def test_ledger_counts_events():
    ledger = Ledger(settle_s=60, assume_s=30)
    ledger.reserve(res("u", "a"))
    ledger.reserve(res("v", "a"))
    ledger.pod_changed("ns/u", None, bound("u", "a"))
    ledger.pod_changed("ns/v", None, bound("v", "b"))
    ledger.reserve(res("w", "a"))
    ledger.reserve(res("x", "a", at=NOW + 31))
    assert ledger.counts == {"reserved": 4, "confirmed": 1, "moved": 1, "expired": 1}


# ------------------------------------------------------- what still counts on a node ----

A = node("a", 70000, 70000)
def record(state: NodeGpuState, placements: list[Placement], now: float = NOW) -> NodeRecord:
    """The record of ``state`` with the placements that still count at ``now`` (settle 60 s,
    assume 30 s), as ``cache.NodeIndex`` builds it."""
    live = pending(placements, state, now=now, settle_s=60, assume_s=30)
    return build_record(state, live, JudgingContext(now, 300, 60, max_skew_s=300), version=0,
                        until=float("inf"))

RECORD_CASES = [
    ("a reservation counts on its GPU", A, [res("u", "a", (1,))], NOW, (70000, 40000)),
    ("a placement whose GPUs are not known takes the freest",
     node("a", 50000, 70000), [bound("u", "a")], NOW, (50000, 40000)),
    ("an unbound reservation expires after assume_s", A, [res("u", "a", (1,))], NOW + 30,
     (70000, 70000)),
    ("a bound one after settle_s from its binding", A, [bound("u", "a", at=NOW - 60)], NOW,
     (70000, 70000)),
    ("bound, started, not yet in the telemetry: counts", node("a", 70000, 70000, read_age_s=1),
     [bound("u", "a", at=NOW - 10, started=NOW - 5, baseline=140000)], NOW, (40000, 70000)),
    ("shown by the telemetry: read after it started, its GPU's free dropped by its need",
     node("a", 70000, 40000, read_age_s=1),
     [bound("u", "a", at=NOW - 10, started=NOW - 5, on=(1, 70000))], NOW, (70000, 40000)),
    ("not shown by a drop on another GPU (per GPU, as the device plugin judges)",
     node("a", 40000, 70000, read_age_s=1),
     [bound("u", "a", at=NOW - 10, started=NOW - 5, on=(1, 70000))], NOW, (40000, 40000)),
    ("a reservation on a GPU gone unhealthy moves to a healthy one",
     node("a", 70000, 70000, unhealthy=(1,)), [res("u", "a", (1,))], NOW, (40000, 70000)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "state", "placements", "now", "left"), RECORD_CASES,
                         ids=[c[0] for c in RECORD_CASES])  # fmt: skip
def test_record_counts_what_is_pending(case, state, placements, now, left):
    rec = record(state, placements, now)
    assert tuple(g.free_mib for g in rec.left.gpus) == left, case


def test_record_is_rebuilt_on_change_only():
    states = {"a": A}
    ledger = Ledger(settle_s=60, assume_s=30)
    index = NodeIndex(states.get, ledger, settle_s=60, ttl_s=300, grace_s=60, skew_s=300)
    first = index.record("a", NOW)
    assert index.record("a", NOW + 1) is first and index.builds == 1  # nothing changed
    ledger.reserve(res("u", "a", (0,), at=NOW))
    second = index.record("a", NOW + 2)
    assert second is not first and second.fits == (70000, 40000) and second.until == NOW + 30
    assert index.record("a", NOW + 3) is second
    assert index.record("a", NOW + 30).fits == (70000, 70000)  # the reservation expired
    states["a"] = node("a", 10000, 70000)  # the Node changed: a new cache object
    assert index.record("a", NOW + 31).raw == (70000, 10000)
    assert index.builds == 4
    assert index.record("nowhere", NOW) is None


@pytest.mark.parametrize(
    ("seen", "now", "mono", "fresh"),
    [
        (None, NOW, 0, True),                      # read 5 s ago, valid 330 + 60
        (None, NOW + 386, 0, False),               # past read_at + valid + grace
        (None, NOW - 306, 0, False),               # read_at 301 s ahead of this clock
        (Seen(100.0, changed=True), NOW + 10_000, 489, True),   # judged by the watch
        (Seen(100.0, changed=True), NOW, 491, False),
        (Seen(100.0, changed=False), NOW, 491, False),           # unchanged too long
        (Seen(100.0, changed=False), NOW + 386, 120, False),     # the publisher's age
    ],
)  # fmt: skip
def test_the_freshness_window_is_the_liveness_rule(seen, now, mono, fresh):
    from omaticaya_py.core.rules.liveness import LivenessClock, node_liveness

    state = node("a", 70000)
    w = window(state.read_at, 330, seen, 60, 300)
    got = w[0] <= now <= w[1] and mono <= w[2]
    rule = node_liveness(state, LivenessClock(now, 60, mono, 300), ttl_s=300,
                         seen=seen).kind == "fresh"  # fmt: skip
    assert got == rule == fresh


@pytest.mark.parametrize(
    ("free", "mib", "count", "strategy", "gpus"),
    [
        ((80000, 45000, 60000), 40960, 1, "binpack", (1,)),  # least room that fits
        ((80000, 45000, 60000), 40960, 1, "spread", (0,)),
        ((80000, 45000, 60000), 40960, 2, "binpack", (1, 2)),
        ((80000, 30000, 60000), 40960, 3, "binpack", ()),      # not enough fit
    ],
)  # fmt: skip
def test_choose_gpus(free, mib, count, strategy, gpus):
    assert choose_gpus(node("a", *free), Need(mib, count), strategy) == gpus


# ----------------------------------------------------------------- the narrowing filter ----


def extender(states: dict[str, NodeGpuState], **kw: Any) -> Extender:
    s = ExtenderSettings(_env_file=None, **kw)  # type: ignore[call-arg]
    ext = Extender(s, states.get, clock=lambda: NOW, monotonic=lambda: 0.0)
    ext.ledger = Ledger(s.settle_s, s.assume_s)
    return ext


def pod(uid: str, mib: int = POD_MIB, count: int = 1) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": uid, "namespace": "ns", "annotations": {
        f"{P}/gpu-memory-mib": str(mib), f"{P}/gpu-count": str(count)}}}  # fmt: skip


def per_gpu(ext: Extender, names: list[str]) -> Counter[tuple[str, int]]:
    """MiB promised per (node, GPU) by the ledger."""
    out: Counter[tuple[str, int]] = Counter()
    for n in names:
        for p in ext.ledger.on_node(n):  # type: ignore[union-attr]
            for g in p.gpus:
                out[(n, g)] += p.memory_mib
    return out


@pytest.mark.parametrize("strategy", ["binpack", "spread"])
def test_a_burst_onto_idle_gpus_all_passes_and_no_gpu_is_overcommitted(strategy):
    """The issue's reproduction: before, pod 8 onward failed on every node (room taken by
    in-flight pods) though there was room for 160."""
    names = [f"n{i}" for i in range(10)]
    states = {n: node(n, *[H100_FREE] * 8) for n in names}
    ext = extender(states, placement_policy=strategy)
    chosen = []
    for i in range(40):
        out = ext.filter({"Pod": pod(f"p{i}"), "NodeNames": names})
        assert len(out["NodeNames"]) == 1, (i, out["FailedNodes"])
        chosen.append(out["NodeNames"][0])
        # the others: not chosen, or (binpack) full of this burst's reservations
        assert {r[:30] for r in out["FailedNodes"].values()} <= {
            TEXTS[Reason.OTHER_NODE].format(prefix=P)[:30], "node(s) had room taken by in-f"}
    promised = per_gpu(ext, names)
    assert sum(promised.values()) == 40 * POD_MIB
    assert max(promised.values()) <= H100_FREE  # one 40 GiB pod per 80 GiB GPU
    on = Counter(chosen)
    if strategy == "binpack":
        assert sorted(on.values()) == [8] * 5  # fills a node before the next
    else:
        assert sorted(on.values()) == [4] * 10
    assert ext.ledger.reserved() == 40  # type: ignore[union-attr]


def test_tight_room_fails_with_the_in_flight_reason_and_a_refilter_replaces():
    names = ["a", "b"]
    states = {"a": node("a", 50000), "b": node("b", 45000)}
    ext = extender(states)
    assert ext.filter({"Pod": pod("p0"), "NodeNames": names})["NodeNames"] == ["b"]  # binpack
    assert ext.filter({"Pod": pod("p1"), "NodeNames": names})["NodeNames"] == ["a"]
    out = ext.filter({"Pod": pod("p2"), "NodeNames": names})
    assert out["NodeNames"] == []
    assert all("room taken by in-flight pods" in r for r in out["FailedNodes"].values())
    # p0 is filtered again (its binding failed): its own reservation does not stand in its way
    assert ext.filter({"Pod": pod("p0"), "NodeNames": names})["NodeNames"] == ["b"]
    assert ext.ledger.reserved() == 2  # type: ignore[union-attr]
    # p1 bound to a: confirmed; p0 bound elsewhere (b) as reserved
    ext.ledger.pod_changed("ns/p1", None, bound("p1", "a", mib=POD_MIB))  # type: ignore[union-attr]
    assert ext.ledger.get("p1").bound and ext.ledger.get("p1").gpus == (0,)  # type: ignore[union-attr]
    # prioritize for a pod holding a reservation puts its node first
    scores = ext.prioritize({"Pod": pod("p0"), "NodeNames": names})
    assert scores == [{"Host": "a", "Score": 0}, {"Host": "b", "Score": 10}]


def test_without_the_ledger_or_with_settle_s_0_every_fitting_node_passes():
    states = {"a": node("a", 50000), "b": node("b", 45000)}
    ext = extender(states, settle_s=0)
    assert ext.filter({"Pod": pod("p0"), "NodeNames": ["a", "b"]})["NodeNames"] == ["a", "b"]


def test_nodes_that_only_a_policy_lets_pass_lose_to_a_fitting_one():
    states = {"a": node("a", 50000), "old": node("old", 80000, read_age_s=1000)}
    ext = extender(states, stale_policy="score-zero")
    out = ext.filter({"Pod": pod("p0"), "NodeNames": ["old", "a"]})
    assert out["NodeNames"] == ["a"] and "another was chosen" in out["FailedNodes"]["old"]
    full = extender({"a": node("a", 1000), "old": node("old", 80000, read_age_s=1000)},
                    stale_policy="score-zero")  # fmt: skip
    out = full.filter({"Pod": pod("p0"), "NodeNames": ["old", "a"]})
    assert out["NodeNames"] == ["old"] and full.ledger.reserved() == 0  # type: ignore[union-attr]


def test_whole_nodes_are_narrowed_too():
    from tests.scheduler.extender_support import NOW as AGENT_NOW
    from tests.scheduler.extender_support import agent_node

    ext = extender({})
    ext.clock = lambda: AGENT_NOW
    nodes = [agent_node("big", 70000), agent_node("mid", 45000)]
    out = ext.filter({"Pod": pod("p0"), "Nodes": {"items": nodes}, "NodeNames": None})
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["mid"]
    assert ext.ledger.get("p0").node == "mid"  # type: ignore[union-attr]


def test_each_request_rebuilds_only_the_records_that_changed():
    names = [f"n{i}" for i in range(50)]
    states = {n: node(n, *[H100_FREE] * 8) for n in names}
    ext = extender(states)
    ext.filter({"Pod": pod("warm"), "NodeNames": names})
    index = ext.narrowing().index  # type: ignore[union-attr]
    before = index.builds
    for i in range(10):
        ext.filter({"Pod": pod(f"p{i}"), "NodeNames": names})
    assert index.builds - before <= 10  # the one node reserved on, per request


# ---------------------------------- the records' window = the liveness rule, node by node

REF = "omaticaya/omaticaya-node-n"
HELD = LeaseState("agent-pod", NOW - 10, 40)


def lease_node(**kw: Any) -> NodeGpuState:
    return replace(node("n", 70000), lease=REF, **kw)


FAST_CASES = [
    ("fresh", node("n", 70000), None, 0.0),
    ("no room", node("n", 20000), None, 0.0),
    ("stale by read_at", node("n", 70000, read_age_s=400), None, 0.0),
    ("read_at 301 s ahead", node("n", 70000, read_age_s=-301), None, 0.0),
    ("unhealthy", replace(node("n", 70000), health="Unhealthy"), None, 0.0),
    ("unusable telemetry", replace(node("n", 70000), problem="bad"), None, 0.0),
    ("seen changed 400 s ago (monotonic)",
     NodeView(**{f: getattr(node("n", 70000), f) for f in NodeGpuState.__dataclass_fields__},
              seen=Seen(0.0, changed=True)), None, 400.0),
    ("seen changed 100 s ago", NodeView(**{f: getattr(node("n", 70000), f)
                                           for f in NodeGpuState.__dataclass_fields__},
                                        seen=Seen(0.0, changed=True)), None, 100.0),
    ("Lease renewed", lease_node(), {REF: HELD}, 0.0),
    ("Lease lapsed", lease_node(), {REF: LeaseState("agent-pod", NOW - 200, 40)}, 0.0),
    ("Lease released", lease_node(), {REF: LeaseState("", NOW - 10, 40)}, 0.0),
    ("Lease missing", lease_node(), {}, 0.0),
    ("Lease renewTime ahead", lease_node(), {REF: LeaseState("agent-pod", NOW + 400, 40)}, 0.0),
    ("Lease named, no Lease watch", lease_node(read_at=NOW - 400, expires_at=NOW - 70), None, 0.0),
    ("not in the cache", None, None, 0.0),
]  # fmt: skip


@pytest.mark.parametrize(("case", "state", "leases", "mono"), FAST_CASES,
                         ids=[c[0] for c in FAST_CASES])  # fmt: skip
def test_the_narrowing_filter_judges_one_node_as_the_rules_do(case, state, leases, mono):
    """One node asked about: the narrowing filter (records, windows) passes it or fails it with
    the same reason as the rules' filter (no ledger) does."""
    states = {"n": state} if state is not None else {}
    results = []
    for ledger in (None, Ledger()):
        ext = Extender(ExtenderSettings(_env_file=None), states.get, clock=lambda: NOW,  # type: ignore[call-arg]
                       monotonic=lambda: mono, ledger=ledger)  # fmt: skip
        if leases is not None:
            ext.leases = leases.get
        out = ext.filter({"Pod": pod("p"), "NodeNames": ["n"]})
        results.append((out["NodeNames"], out["FailedNodes"]))
    assert results[0] == results[1], case


def test_settle_heap_waits_for_the_caches_then_freezes():
    import gc

    from omaticaya_py.scheduler.server import settle_heap

    class Cache:
        def __init__(self, synced: bool) -> None:
            self.synced = synced

        def wait_synced(self, timeout_s: float | None = None) -> bool:
            return self.synced

    thresholds = gc.get_threshold()
    try:
        before = gc.get_freeze_count()
        assert settle_heap(Cache(True), Cache(False), timeout_s=0) is False
        assert gc.get_freeze_count() == before  # not synced: nothing frozen
        assert settle_heap(Cache(True), None) is True
        assert gc.get_freeze_count() > before and gc.get_threshold()[0] == 20_000
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_a_node_after_its_reservations_keeps_each_gpus_other_facts():
    gpus = (GpuInfo(0, 70000, True, 65000, 81559), GpuInfo(1, 70000, True, None, 81559))
    state = replace(node("a"), gpus=gpus, free_total_mib=140000)
    left = record(state, [res("u", "a", (1,))]).left
    assert left.gpus == (gpus[0], GpuInfo(1, 40000, True, None, 81559))
    assert left.free_total_mib == 110000

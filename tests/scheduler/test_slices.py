"""The extender places memory slices of shared GPUs (issue 25 item 3): pure, table-driven.

Nodes are rendered by the agent's own pure tick (``tests.helpers.evaluate`` with
``OMATICAYA_SHARED_GPUS``), so the telemetry marks shared GPUs as the agent writes them; the
extender parses them (``parse_node``: ``shared``, never whole GPUs), reads a pod's slices from
its containers' resources (``need.parse_slices``), judges them (``slices``, ``rules.judge``, the
narrowing's fast path) and reserves each slice on its GPU in the ledger.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from omaticaya_py.core.schema import GpuInfo, parse_node
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.container_asks import MAX_UNITS
from omaticaya_py.scheduler.fit import place_slices, slice_room
from omaticaya_py.scheduler.inflight import Placement, adjust, pending
from omaticaya_py.scheduler.ledger import Ledger
from omaticaya_py.scheduler.need import Need, parse_need, parse_slices
from omaticaya_py.scheduler.protocol import handle_filter, handle_prioritize
from tests.helpers import READ_AT, evaluate, gpu, settings, snapshot

NOW = READ_AT.timestamp() + 10
R = "omaticaya.io/gpu-memory"
U = 1024  # MiB per unit


def shared_node(name: str, *free_mib: int, shared: str = "all", unhealthy: tuple[int, ...] = (),
                labels: dict[str, str] | None = None) -> Any:  # fmt: skip
    """A node's parsed state as the agent renders it, GPUs ``shared`` (OMATICAYA_SHARED_GPUS)."""
    readings = [gpu(i, memory_free_mib=f, **({"ecc_uncorrected_volatile": 1} if i in unhealthy
                                             else {})) for i, f in enumerate(free_mib)]  # fmt: skip
    _, desired = evaluate(snapshot(*readings, read_at=READ_AT), settings(shared_gpus=shared))
    return parse_node(name, {**desired.labels, **(labels or {})}, desired.annotations)


def slice_pod(*units: Any, uid: str = "", where: str = "limits", resource: str = R,
              annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    containers = [{"name": f"c{i}", "resources": {where: {resource: u}}} for i, u in enumerate(units)]
    return {"metadata": {"name": uid or "p", "namespace": "ns", "uid": uid,
                         "annotations": annotations or {}},
            "spec": {"containers": containers}}  # fmt: skip


# ------------------------------------------------------------------- the pod's slices ----

SLICE_NEEDS = [
    ("limits", slice_pod(20), (20,)),
    ("requests only, as the API writes it", slice_pod("10", where="requests"), (10,)),
    ("two containers", slice_pod(20, "10"), (20, 10)),
    ("a container asking for 0 is left out", slice_pod(0, 8), (8,)),
    ("every container 0: no slices", slice_pod(0), None),
    ("no containers", {"spec": {}}, None),
    ("another resource", slice_pod(20, resource="example.com/other"), None),
    ("slices win over the whole-GPU annotation",
     slice_pod(4, annotations={"omaticaya.io/gpu-memory-mib": "30000"}), (4,)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "pod", "units"), SLICE_NEEDS, ids=[c[0] for c in SLICE_NEEDS])
def test_parse_slices(case, pod, units):
    need = parse_need(pod)
    assert (need.slices if need is not None else None) == units, case
    assert need is None or need.error is None


#: quantities the API server may write for a whole number of units (it serialises 1000 as
#: ``1k``, issue 30): each is read as the units it is worth
QUANTITY_UNITS = [
    ("1k", 1000), ("2k", 2000), ("1e3", 1000), ("1E3", 1000), ("10e2", 1000), ("1Ki", 1024),
    ("1.5k", 1500), ("0.5k", 500), ("1000m", 1), ("1.0", 1), ("+20", 20), (" 20 ", 20),
    ("1M", 1_000_000), ("1Mi", MAX_UNITS), (str(MAX_UNITS), MAX_UNITS), (MAX_UNITS, MAX_UNITS),
    ("0", 0), ("0k", 0), ("-0", 0),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "units"), QUANTITY_UNITS, ids=[repr(r[0]) for r in QUANTITY_UNITS])
def test_a_quantity_of_whole_units_is_read_as_its_units(raw, units):
    """(A container asking for 0 is left out; the second asks for 4.)"""
    need = parse_slices(slice_pod(raw, 4))
    assert need is not None and need.error is None, need
    assert need.slices == ((units, 4) if units else (4,))


def test_a_pod_of_1k_units_is_placed_where_they_fit():
    """The issue's case: 1000 units, which the API server writes as ``1k``, pass a node whose
    shared GPU has them free (64 MiB units: 64,000 MiB), and fail one without with the room
    reason, never the bad-request one."""
    pod = slice_pod("1k", uid="uid-1k")
    nodes = {}
    for name, free in (("roomy", 70000), ("full", 60000)):
        _, desired = evaluate(snapshot(gpu(0, memory_free_mib=free), read_at=READ_AT),
                              settings(shared_gpus="all", share_unit_mib=64))  # fmt: skip
        nodes[name] = parse_node(name, desired.labels, desired.annotations)
    need = parse_need(pod)
    assert need is not None and need.error is None and need.slice_mibs(64) == (64000,)
    out = handle_filter({"Pod": pod, "NodeNames": ["full", "roomy"]},
                        ExtenderSettings(_env_file=None), nodes.get, now=NOW)  # fmt: skip
    assert out["NodeNames"] == ["roomy"]
    assert "needs 1000 units" in out["FailedNodes"]["full"], out["FailedNodes"]


#: not a whole number of units from 0 to MAX_UNITS: negative, a fraction (``500m``, ``1.5``,
#: ``1e-3``), too many (``2Mi``, ``1e9999``), not a Kubernetes quantity (``2K``: the decimal
#: kilo is ``k``; an exponent and a suffix; Python-only spellings), not a number
BAD_UNITS = [-1, "-1", "-1k", "1.5", 1.5, 1000.0, "500m", "1500m", "1.0001k", "1e-3", "0.1Ki",
             "2Mi", "1e9999", "1Ei", MAX_UNITS + 1, str(MAX_UNITS + 1), 10**30, "2K", "1e3k",
             "1_000", "NaN", "inf", "0x10", "", "1" * 70, True, [], "ten"]  # fmt: skip


@pytest.mark.parametrize("raw", BAD_UNITS, ids=[repr(r) for r in BAD_UNITS])
def test_a_bad_unit_request_fails_every_node_with_the_reason(raw):
    need = parse_slices(slice_pod(raw))
    assert need is not None and need.error and "c0" in need.error and R in need.error
    out = handle_filter({"Pod": slice_pod(raw), "NodeNames": ["a"]},
                        ExtenderSettings(_env_file=None), {"a": shared_node("a", 70000)}.get,
                        now=NOW)  # fmt: skip
    assert out["NodeNames"] == [] and "whole number of units" in out["FailedNodes"]["a"]
    assert out["FailedAndUnresolvableNodes"] == out["FailedNodes"]  # evicting cannot help


@pytest.mark.parametrize("name", ["OMATICAYA_SHARED_RESOURCE", "OMATICAYA_EXTENDER_SHARED_RESOURCE"])
def test_the_shared_resource_is_a_setting(monkeypatch, name):
    """One name for the device plugin and the extender (issue 49); the extender's former name
    still read."""
    monkeypatch.setenv(name, "example.com/vram")
    s = ExtenderSettings(_env_file=None)
    assert s.shared_resource == "example.com/vram"
    pod = slice_pod(8, resource="example.com/vram")
    out = handle_filter({"Pod": pod, "NodeNames": ["a"]}, s, {"a": shared_node("a", 4000)}.get,
                        now=NOW)  # fmt: skip
    assert "8 units of example.com/vram" in out["FailedNodes"]["a"]


# ---------------------------------------------------------------- where slices fit ----

G = [GpuInfo(0, 30000, True), GpuInfo(1, 50000, True), GpuInfo(2, 40000, False)]

PLACE_CASES = [
    ("binpack: the least room that fits", G, [20480], "binpack", ((0,), 30000)),
    ("spread: the most", G, [20480], "spread", ((1,), 50000)),
    ("only one GPU is big enough", G, [40960], "binpack", ((1,), 50000)),
    ("an unhealthy GPU takes none", G, [51200], "binpack", None),
    ("two slices: the second where the first left the least room", G, [20480, 20480], "binpack",
     ((0, 1), 30000)),
    ("two slices share a GPU when it holds both", [GpuInfo(0, 45000, True), GpuInfo(1, 60000, True)],
     [20480, 20480], "binpack", ((0, 0), 45000)),
    ("the pod's own first slice takes room", [GpuInfo(0, 40000, True), GpuInfo(1, 30000, True)],
     [30720, 20480], "binpack", ((0, 1), 40000)),
    ("ties: the lower index", [GpuInfo(3, 9000, True), GpuInfo(1, 9000, True)], [4096], "binpack",
     ((1,), 9000)),
    ("no shared GPU", [], [1024], "binpack", None),
]  # fmt: skip


@pytest.mark.parametrize(("case", "gpus", "mibs", "strategy", "placed"), PLACE_CASES,
                         ids=[c[0] for c in PLACE_CASES])  # fmt: skip
def test_place_slices(case, gpus, mibs, strategy, placed):
    assert place_slices(gpus, mibs, strategy, 1) == placed, case


# (case, node, pod units, passes, text in the reason)
JUDGE_CASES = [
    ("fits on one shared GPU", shared_node("n", 30000, 50000), (20,), True, ""),
    ("no shared GPU has the slice", shared_node("n", 30000, 50000), (60,), False,
     "had no room: pod needs 60 units of omaticaya.io/gpu-memory on one shared GPU"),
    ("two slices, one on each GPU", shared_node("n", 30000, 30000), (25, 25), True, ""),
    ("two slices that need one GPU each, one GPU too small", shared_node("n", 30000, 10000),
     (25, 25), False, "slices of 25 + 25 units"),
    ("the free memory is the labels' (rounded down): 29,696 MiB < 29 units + 1",
     shared_node("n", 30000), (29,), True, ""),
    ("a slice never goes on a whole GPU", shared_node("n", 30000, 70000, shared="0"), (40,),
     False, "had no room"),
    ("an unhealthy shared GPU takes none", shared_node("n", 30000, 70000, unhealthy=(1,)), (40,),
     False, "had no room"),
    ("gpu.shared.memory.free-mib below the telemetry bounds it",
     shared_node("n", 70000, labels={"omaticaya.io/gpu.shared.memory.free-mib": "20480"}), (21,),
     False, "had no room"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "state", "units", "passes", "why"), JUDGE_CASES,
                         ids=[c[0] for c in JUDGE_CASES])  # fmt: skip
@pytest.mark.parametrize("narrowing", [False, True], ids=["rules", "narrowing"])
def test_judge_slices(case, state, units, passes, why, narrowing):
    ext = Extender(ExtenderSettings(_env_file=None), {"n": state}.get, clock=lambda: NOW,
                   monotonic=lambda: 0.0, ledger=Ledger() if narrowing else None)  # fmt: skip
    out = ext.filter({"Pod": slice_pod(*units, uid="u"), "NodeNames": ["n"]})
    assert (out["NodeNames"] == ["n"]) is passes, (case, out)
    assert why in out["FailedNodes"].get("n", ""), case


def test_whole_gpu_pods_never_count_shared_gpus():
    state = shared_node("n", 70000, 70000, 20000, shared="0,1")
    assert [g.index for g in state.gpus] == [2] and [g.index for g in state.shared] == [0, 1]
    assert state.free_total_mib == 19456  # the whole GPU only (its label, rounded down)
    pod = {"metadata": {"annotations": {"omaticaya.io/gpu-memory-mib": "30000"}}}
    out = handle_filter({"Pod": pod, "NodeNames": ["n"]}, ExtenderSettings(_env_file=None),
                        {"n": state}.get, now=NOW)  # fmt: skip
    assert out["NodeNames"] == [] and "had no room" in out["FailedNodes"]["n"]


def test_a_node_without_a_unit_size_has_no_shared_gpus():
    import json

    state = shared_node("n", 70000)
    _, desired = evaluate(snapshot(gpu(0, memory_free_mib=70000), read_at=READ_AT),
                          settings(shared_gpus="all"))  # fmt: skip
    doc = json.loads(desired.annotations["omaticaya.io/telemetry"])
    del doc["share_unit_mib"]
    bare = parse_node("n", desired.labels, {"omaticaya.io/telemetry": json.dumps(doc)})
    assert state.shared and not bare.shared and not bare.gpus


def test_prioritize_ranks_by_the_room_of_the_gpu_the_slice_goes_to():
    """binpack, as the device plugin: the node whose best-fitting GPU is tightest first."""
    nodes = {"tight": shared_node("tight", 22000, 70000), "roomy": shared_node("roomy", 60000),
             "none": shared_node("none", 10000)}  # fmt: skip
    s = ExtenderSettings(_env_file=None)
    scores = {h["Host"]: h["Score"] for h in handle_prioritize(
        {"Pod": slice_pod(20), "NodeNames": list(nodes)}, s, nodes.get, now=NOW)}  # fmt: skip
    assert scores == {"tight": 10, "roomy": 1, "none": 0}
    assert slice_room(nodes["tight"], Need(0, slices=(20,))) == 21504  # GPU 0, not GPU 1


# ------------------------------------------------------- reservations in the ledger ----


def test_reservations_count_on_their_gpu_until_the_telemetry_shows_them():
    state = shared_node("n", 40000, 40000)  # 39,936 MiB free each (labels)
    p = Placement("ns/a", "a", "n", 0, 0, placed_at=NOW, gpus=(1,),
                  baselines=(39936,), slices=(30,), bound=False)  # fmt: skip
    left = adjust(state, [p])
    assert [g.free_mib for g in left.shared] == [39936, 39936 - 30 * U]
    assert left.gpus == state.gpus and left.free_total_mib == state.free_total_mib
    started = Placement(**{**{f: getattr(p, f) for f in p.__dataclass_fields__},
                           "started_at": NOW - 60, "bound": True})  # fmt: skip
    later = shared_node("n", 40000, 9000)  # read after it started: 30 units gone from GPU 1
    assert pending([started], later, now=NOW, settle_s=600) == []
    assert pending([started], state, now=NOW, settle_s=600) == [started]  # not shown yet


def test_a_burst_of_slices_never_promises_a_gpu_more_than_it_has_free():
    """40 pods of 20 units at once (nothing bound yet) onto 4 nodes x 3 shared GPUs with varied
    live free memory: every pod that fits passes, on one node, and no GPU is promised more
    than its live free memory."""
    frees = [(80000, 50000, 21000), (40000, 10000, 65000), (81000, 81000, 30000), (0, 45000, 0)]
    states = {f"n{i}": shared_node(f"n{i}", *f) for i, f in enumerate(frees)}
    s = ExtenderSettings(_env_file=None)
    ext = Extender(s, states.get, clock=lambda: NOW, monotonic=lambda: 0.0,
                   ledger=Ledger(s.settle_s, s.assume_s))  # fmt: skip
    passed = 0
    for i in range(40):
        out = ext.filter({"Pod": slice_pod(20, uid=f"u{i}"), "NodeNames": list(states)})
        passed += len(out["NodeNames"])
        assert len(out["NodeNames"]) <= 1
        if not out["NodeNames"]:
            assert all("room taken by in-flight pods" in r or "had no room" in r
                       for r in out["FailedNodes"].values())  # fmt: skip
    promised: Counter[tuple[str, int]] = Counter()
    for name in states:
        for p in ext.ledger.on_node(name):  # type: ignore[union-attr]
            for units, index in zip(p.slices, p.gpus, strict=True):
                promised[(name, index)] += units * U
    free = {(n, g.index): g.free_mib for n, st in states.items() for g in st.shared}
    assert all(promised[k] <= free[k] for k in promised), (promised, free)
    fit = sum(f // (20 * U) for f in free.values())
    assert passed == fit == 19  # every slot of 20 units that the live free memory holds


def test_a_bound_slice_pod_from_the_watch_is_a_placement_of_its_slices():
    from omaticaya_py.scheduler.ledger import placement_from_pod

    doc = slice_pod(10, 20, uid="u")
    doc["spec"]["nodeName"] = "n"
    p = placement_from_pod(doc, None, now=NOW)
    assert p is not None and p.slices == (10, 20) and p.gpus == ()  # container order
    # its GPUs are not known: no per-GPU baseline, so only the kubelet's books show it
    assert p.baselines == ()


def test_whole_and_slice_reservations_on_one_node_each_take_their_own_gpus():
    state = shared_node("n", 40000, 60000, 50000, shared="0,1")  # GPU 2 whole
    whole = Placement("ns/w", "w", "n", 30000, 1, placed_at=NOW, gpus=(2,), bound=False)
    sliced = Placement("ns/s", "s", "n", 0, 0, placed_at=NOW, gpus=(), slices=(20,), bound=False)
    left = adjust(state, [whole, sliced])
    assert [g.free_mib for g in left.gpus] == [49152 - 30000]
    assert [g.free_mib for g in left.shared] == [39936, 59392 - 20 * U]  # the freest: unknown GPU


def test_the_window_minimum_bounds_shared_gpus_too():
    from dataclasses import replace

    from omaticaya_py.scheduler.nodeview import with_signal

    state = shared_node("n", 40000, 60000)
    dipped = replace(state, shared=(replace(state.shared[0], free_min_mib=1000), state.shared[1]))
    assert [g.free_mib for g in with_signal(dipped, "window-min").shared] == [1000, 59392]
    assert with_signal(dipped, "now") is dipped


def test_preemption_of_a_slice_pod_is_kube_schedulers_own():
    from omaticaya_py.scheduler.preempt import preempt
    from tests.scheduler.preemption_support import extender, kept, meta_args, reader

    args = meta_args(slice_pod(20, uid="uid-preemptor"), fits=["uid-a"], small=[])
    assert kept(preempt(extender(), args, reader())) == {"fits": ["uid-a"], "small": []}

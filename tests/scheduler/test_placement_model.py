"""The one placement model (``core.allocation.placement``) and the seam faults of issue 38 it fixes.

- The model's rules, table driven: a slice to the fitting shared GPU by the policy, whole
  devices in the plugin's order, memory alone by the policy, a pod's whole need placed group by
  group, and what is left (``take``).
- Fault 2: "counts until shown" is judged per GPU, on healthy GPUs only: memory taken out of
  band on another GPU, or another GPU turning Unhealthy, never shows a slice.
- Fault 5: a pod of slices and a whole GPU is checked and reserved for both; the next exclusive
  pod is predicted on neither.
- Fault 8: a MIG pod with the memory annotation is judged on the free MIG devices of its
  profile, and never reserves a whole GPU.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from omaticaya_py.core.allocation.placement import (
    Need,
    Taken,
    first_whole,
    pick_memory,
    pick_slice,
    pick_whole,
    place,
    take,
)
from omaticaya_py.core.model.snapshot import MigReading
from omaticaya_py.core.model.topology import GpuTopology, NodeTopology, PairLink
from omaticaya_py.core.schema import GpuInfo, NodeGpuState, parse_node
from omaticaya_py.deviceplugin.allocation import DeviceState, preferred
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.inflight import Placement, adjust, pending
from omaticaya_py.scheduler.ledger import Ledger
from omaticaya_py.scheduler.need import parse_need
from tests.helpers import READ_AT, evaluate, gpu, settings, snapshot

U = 1024
NOW = READ_AT.timestamp()


def shared(index: int, free: int, units: int | None = None, healthy: bool = True) -> GpuInfo:
    return GpuInfo(index, free, healthy, units_left=units)


# ------------------------------------------------------------------------ the rules ----

SLICE_CASES = [
    ("binpack: the least room that fits", [shared(0, 80000), shared(1, 30000)], 20 * U,
     "binpack", 1),
    ("spread: the most room", [shared(0, 80000), shared(1, 30000)], 20 * U, "spread", 0),
    ("units bound the room", [shared(0, 80000, units=10), shared(1, 30000, units=79)], 20 * U,
     "binpack", 1),
    ("a tie: the lower index", [shared(1, 30000), shared(0, 30000)], 20 * U, "binpack", 0),
    ("unhealthy is never chosen", [shared(0, 80000, healthy=False)], U, "binpack", None),
    ("no room anywhere", [shared(0, 10000), shared(1, 20000)], 20 * U, "binpack", None),
    ("unknown free memory (-1) fits nothing", [shared(0, -1, units=79)], U, "spread", None),
]  # fmt: skip


@pytest.mark.parametrize(("case", "gpus", "mib", "policy", "index"), SLICE_CASES,
                         ids=[c[0] for c in SLICE_CASES])  # fmt: skip
def test_pick_slice(case, gpus, mib, policy, index):
    chosen = pick_slice(gpus, mib, U, policy)
    assert (chosen.index if chosen else None) == index, case


WHOLE_CASES = [
    ("most free first", [GpuInfo(0, 40000, True), GpuInfo(1, 80000, True)], 1, 10000, (1,)),
    ("an assigned GPU is never handed out", [GpuInfo(0, 0, True, assigned=True),
                                             GpuInfo(1, 20000, True)], 1, 0, (1,)),
    ("the first in the plugin's order lacks the memory: no fit",
     [GpuInfo(0, 40000, True), GpuInfo(1, 80000, True)], 2, 50000, None),
    ("unhealthy is never handed out", [GpuInfo(0, 80000, False)], 1, 0, None),
    ("MIG devices: most free, then the MIG index",
     [GpuInfo(0, 9000, True, profile="1g.10gb", mig_index=2),
      GpuInfo(0, 9000, True, profile="1g.10gb", mig_index=1)], 1, 0, ((0, 1),)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "devices", "count", "mib", "chosen"), WHOLE_CASES,
                         ids=[c[0] for c in WHOLE_CASES])  # fmt: skip
def test_pick_whole(case, devices, count, mib, chosen):
    got = pick_whole(devices, count, mib)
    if got is None or chosen is None:
        assert got is chosen, case
    else:
        keys = tuple((g.index, g.mig_index) if g.mig_index is not None else g.index for g in got)
        assert keys == chosen, case


def _wired(n: int, nvlinks: dict[frozenset[int], int]) -> NodeTopology:
    """``n`` GPUs joined by ``nvlinks`` NVLinks per pair (score 100 each), others unknown (0)."""
    pairs = {(a, b): PairLink(None, nvlinks.get(frozenset((a, b)), 0))
             for a in range(n) for b in range(a + 1, n)}  # fmt: skip
    return NodeTopology(tuple(GpuTopology(i) for i in range(n)), pairs)


FIRST_WHOLE_CASES = [
    # (case, free MiB per GPU index (None: unknown), count, chosen, NVLinks per pair or None)
    ("most free first, the lower index on a tie", [50, 80, 80, None], 3, [1, 2, 0], None),
    ("unknown free memory last", [None, 10], 2, [1, 0], None),
    ("a tie of free memory: the best linked set", [80000, 80000, 80000], 2, [0, 2],
     {frozenset((0, 2)): 2}),
    ("within an eighth of the most free: links win", [80000, 71000, 80000], 2, [0, 1],
     {frozenset((0, 1)): 4}),
    ("links never beat an eighth more free memory", [80000, 68000, 80000], 2, [0, 2],
     {frozenset((0, 1)): 12}),
    ("one GPU: where it breaks the fewest links", [80000, 80000, 80000, 80000], 1, [2],
     {frozenset((0, 1)): 2, frozenset((1, 2)): 1, frozenset((0, 3)): 1}),
    ("four of eight: the island of four, not two pairs", [80000] * 8, 4, [4, 5, 6, 7],
     {frozenset(p): 2 for p in [(0, 1), (2, 3), (4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)]}),
]  # fmt: skip


@pytest.mark.parametrize(("case", "frees", "count", "chosen", "nvlinks"), FIRST_WHOLE_CASES,
                         ids=[c[0] for c in FIRST_WHOLE_CASES])  # fmt: skip
def test_first_whole_is_the_plugins_and_the_extenders_rule(case, frees, count, chosen, nvlinks):
    """One rule of which whole devices a container gets (issue 48 item 2, issue 50 item 4):
    ``first_whole`` picks them; the device plugin's ``preferred`` (device IDs, the kubelet's
    available list) and the extender's ``pick_whole`` (the telemetry's GPUs) both call it, with
    the node's topology when it is known."""
    infos = [GpuInfo(i, f if f is not None else -1, True) for i, f in enumerate(frees)]
    wiring = None if nvlinks is None else _wired(len(frees), nvlinks)
    links = None if wiring is None else (lambda a, b: wiring.pair_score(a, b))
    got = first_whole(list(range(len(frees))), count, infos.__getitem__, links=links)
    assert sorted(got) == sorted(chosen), case
    ids = {i: f"GPU-{i}" for i in range(len(frees))}
    states = {ids[i]: DeviceState(ids[i], i, True, (), f) for i, f in enumerate(frees)}
    assert preferred(states, list(reversed(states)), [], count, wiring) == [ids[i] for i in got]
    if None not in frees:  # unknown free memory (-1) fits nothing there
        picked = pick_whole(infos, count, topology=wiring)
        assert picked is not None and [g.index for g in picked] == got, case


def test_pick_memory_by_policy():
    gpus = [GpuInfo(0, 80000, True), GpuInfo(1, 30000, True), GpuInfo(2, 50000, True, assigned=True)]
    assert [g.index for g in pick_memory(gpus, 1, 20000, "binpack")] == [1]
    assert [g.index for g in pick_memory(gpus, 1, 20000, "spread")] == [0]
    assert pick_memory(gpus, 3, 20000, "binpack") is None


def node(*, gpus: tuple[GpuInfo, ...] = (), shared_gpus: tuple[GpuInfo, ...] = (),
         mig: tuple[GpuInfo, ...] = ()) -> NodeGpuState:  # fmt: skip
    return NodeGpuState("n", True, "Healthy", read_at=NOW, gpus=gpus, shared=shared_gpus,
                        share_unit_mib=U if shared_gpus else None, mig=mig,
                        free_total_mib=sum(g.free_mib for g in gpus if g.healthy))  # fmt: skip


PLACE_CASES = [
    ("slices in the kubelet's order, each taken off before the next",
     node(shared_gpus=(shared(0, 30 * U), shared(1, 50 * U))), Need(0, 1, slices=(20, 20)),
     Taken(slices=(0, 1), room_mib=30 * U)),
    ("a slice and a whole GPU: both",
     node(gpus=(GpuInfo(0, 80000, True),), shared_gpus=(shared(1, 50 * U),)),
     Need(0, 1, slices=(5,), exclusive=True), Taken(gpus=(0,), slices=(1,), room_mib=50 * U)),
    ("a slice and a whole GPU, no whole GPU free: no fit",
     node(gpus=(GpuInfo(0, 0, True, assigned=True),), shared_gpus=(shared(1, 50 * U),)),
     Need(0, 1, slices=(5,), exclusive=True), None),
    ("MIG devices of the profile, never the whole GPU",
     node(gpus=(GpuInfo(1, 80000, True),),
          mig=(GpuInfo(0, 9000, True, profile="1g.10gb", mig_index=0),
               GpuInfo(0, 19000, True, profile="2g.20gb", mig_index=1))),
     Need(8000, 1, exclusive=True, profile="1g.10gb"), Taken(migs=((0, 0),), room_mib=9000)),
    ("a group is placed by its first container (a 1-unit init before a 2-unit app): the init's GPU must take the group",
     node(shared_gpus=(shared(0, 1 * U), shared(2, 2 * U))), Need(0, 1, slices=(2,), firsts=(1,)),
     None),
    ("the same pod where the first container's GPU takes the group",
     node(shared_gpus=(shared(0, 3 * U), shared(2, 2 * U))), Need(0, 1, slices=(2,), firsts=(1,)),
     Taken(slices=(2,), room_mib=2 * U)),
    ("MIG devices too small: no fit",
     node(mig=(GpuInfo(0, 9000, True, profile="1g.10gb", mig_index=0),)),
     Need(10000, 1, exclusive=True, profile="1g.10gb"), None),
]  # fmt: skip


@pytest.mark.parametrize(("case", "state", "need", "taken"), PLACE_CASES,
                         ids=[c[0] for c in PLACE_CASES])  # fmt: skip
def test_place(case, state, need, taken):
    assert place(state, need, "binpack") == taken, case


def test_take_leaves_what_the_next_pod_judges_by():
    state = node(gpus=(GpuInfo(0, 80000, True), GpuInfo(1, 70000, True)),
                 shared_gpus=(shared(2, 40 * U, units=40),))  # fmt: skip
    need = Need(0, 1, slices=(10,), exclusive=True)
    left = take(state, need, place(state, need))  # type: ignore[arg-type]
    assert [(g.index, g.free_mib, g.assigned) for g in left.gpus] == [(0, 0, True), (1, 70000, False)]
    assert left.free_total_mib == 70000
    assert [(g.free_mib, g.units_left) for g in left.shared] == [(30 * U, 30)]
    # the next exclusive pod: not the GPU the first one took
    assert place(left, Need(40000, 1, exclusive=True)) == Taken(gpus=(1,), room_mib=70000)


# ------------------------------------------------------- fault 2: shown per GPU ----


def two_shared(free0: int, free1: int, healthy1: bool = True) -> NodeGpuState:
    return node(shared_gpus=(shared(0, free0), shared(1, free1, healthy=healthy1)))


def slice_on_gpu0() -> Placement:
    return Placement("ns/a", "a", "n", 0, 1, placed_at=NOW - 10, started_at=NOW - 5,
                     gpus=(0,), baselines=(40 * U,), slices=(20,))  # fmt: skip


@pytest.mark.parametrize(("case", "state", "still"), [
    ("its own GPU dropped by the slice: shown", two_shared(20 * U, 40 * U), False),
    ("memory taken out of band on another GPU: not shown", two_shared(40 * U, 10 * U), True),
    ("another GPU turned Unhealthy: not shown", two_shared(40 * U, 40 * U, healthy1=False), True),
    ("its own GPU turned Unhealthy: no drop shows it", node(
        shared_gpus=(shared(0, 10 * U, healthy=False), shared(1, 40 * U))), True),
])  # fmt: skip
def test_a_slice_counts_until_its_own_gpu_shows_it(case, state, still):
    """Fault 2: judged on the node's total, out-of-band memory on GPU 1 looked like the slice in
    use on GPU 0; the extender forgot it and placed the next slice on the same memory."""
    assert bool(pending([slice_on_gpu0()], state, now=NOW, settle_s=600)) is still, case
    if still and state.shared[0].healthy:  # the next slice is not placed on GPU 0's promise
        left = adjust(state, pending([slice_on_gpu0()], state, now=NOW, settle_s=600))
        assert left.shared[0].free_mib <= max(state.shared[0].free_mib - 20 * U, 0)


# ------------------------------------------ faults 5 and 8, through the extender ----


def pod(uid: str, containers: list[dict[str, Any]], annotations: dict[str, str] | None = None
        ) -> dict[str, Any]:  # fmt: skip
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid,
                         "annotations": annotations or {}},
            "spec": {"containers": containers}}  # fmt: skip


def limits(**res: Any) -> dict[str, Any]:
    return {"name": "c", "resources": {"limits": {k.replace("_", "/", 1).replace("_", "-"): v
                                                  for k, v in res.items()}}}  # fmt: skip


def extender(states: dict[str, NodeGpuState]) -> Extender:
    s = ExtenderSettings(_env_file=None)
    return Extender(s, states.get, clock=lambda: NOW, monotonic=lambda: 0.0,
                    ledger=Ledger(s.settle_s, s.assume_s))  # fmt: skip


def whole_and_shared_node() -> NodeGpuState:
    """GPU 0 whole (80 GiB free), GPU 1 whole (40 GiB), GPU 2 shared: the agent's render."""
    readings = [gpu(0, memory_free_mib=80000), gpu(1, memory_free_mib=40000),
                gpu(2, memory_free_mib=60000)]  # fmt: skip
    _, desired = evaluate(snapshot(*readings, read_at=READ_AT), settings(shared_gpus="2"))
    return parse_node("n", desired.labels, desired.annotations)


def test_a_pod_of_a_slice_and_a_whole_gpu_is_reserved_both():
    """Fault 5: judged by its slices alone, its whole GPU was neither checked nor reserved, and
    the next exclusive pod was reserved on the GPU the kubelet gives the first."""
    first = pod("a", [{"name": "c", "resources": {"limits": {
        "nvidia.com/gpu": 1, "omaticaya.io/gpu-memory": 5}}}])  # fmt: skip
    need = parse_need(first)
    assert need is not None and need.slices == (5,) and need.exclusive and need.whole_count == 1
    ext = extender({"n": whole_and_shared_node()})
    assert ext.filter({"Pod": first, "NodeNames": ["n"]})["NodeNames"] == ["n"]
    held = ext.ledger.get("a")  # type: ignore[union-attr]
    assert held is not None and held.whole_gpus == (0,) and held.gpus == (2,)
    # the next exclusive 38 GiB pod: GPU 0 is the first's, so GPU 1
    second = pod("b", [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                 {"omaticaya.io/gpu-memory-mib": "38000"})  # fmt: skip
    assert ext.filter({"Pod": second, "NodeNames": ["n"]})["NodeNames"] == ["n"]
    assert ext.ledger.get("b").gpus == (1,)  # type: ignore[union-attr]
    # a third finds no whole GPU free
    third = pod("c", [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                {"omaticaya.io/gpu-memory-mib": "1000"})  # fmt: skip
    assert ext.filter({"Pod": third, "NodeNames": ["n"]})["NodeNames"] == []


def mig_node(whole_free: int | None = None) -> NodeGpuState:
    """GPU 0 in MIG mode with two free 1g.10gb devices (9,984 MiB free each), and optionally a
    whole GPU 1: the agent's render."""
    migs = tuple(MigReading(i, f"MIG-{i}", "1g.10gb", memory_total_mib=9984, memory_used_mib=0,
                            memory_free_mib=9984, process_count=0) for i in range(2))  # fmt: skip
    readings = [gpu(0, mig_enabled=True, mig_devices=migs)]
    if whole_free is not None:
        readings.append(gpu(1, memory_free_mib=whole_free))
    _, desired = evaluate(snapshot(*readings, read_at=READ_AT), settings())
    return parse_node("n", desired.labels, desired.annotations)


def mig_pod(uid: str, mib: str = "8000") -> dict[str, Any]:
    return pod(uid, [{"name": "c", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}],
               {"omaticaya.io/gpu-memory-mib": mib})  # fmt: skip


def test_a_mig_pod_is_judged_on_the_mig_devices_of_its_profile():
    """Fault 8: judged against whole GPUs only, it failed "no room" on a MIG node whose free MIG
    devices fit, and on a node with a whole GPU reserved memory it would never use there."""
    need = parse_need(mig_pod("m"))
    assert need is not None and need.profile == "1g.10gb" and need.exclusive
    state = mig_node()
    assert len(state.mig) == 2 and not state.gpus
    ext = extender({"n": state})
    assert ext.filter({"Pod": mig_pod("m1"), "NodeNames": ["n"]})["NodeNames"] == ["n"]
    assert ext.filter({"Pod": mig_pod("m2"), "NodeNames": ["n"]})["NodeNames"] == ["n"]
    assert ext.ledger.get("m1").migs != ext.ledger.get("m2").migs  # type: ignore[union-attr]
    out = ext.filter({"Pod": mig_pod("m3"), "NodeNames": ["n"]})  # both taken in flight
    assert out["NodeNames"] == [] and "in-flight" in str(out["FailedNodes"]["n"]) or \
        "room taken by in-flight pods" in out["FailedNodes"]["n"]
    # a node with a whole GPU as well: the MIG pod reserves nothing on the whole GPU
    ext = extender({"n": mig_node(whole_free=80000)})
    assert ext.filter({"Pod": mig_pod("m4"), "NodeNames": ["n"]})["NodeNames"] == ["n"]
    held = ext.ledger.get("m4")  # type: ignore[union-attr]
    assert held.gpus == () and len(held.migs) == 1
    whole = pod("w", [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
                {"omaticaya.io/gpu-memory-mib": "70000"})  # fmt: skip
    assert ext.filter({"Pod": whole, "NodeNames": ["n"]})["NodeNames"] == ["n"]
    # too big for a 1g.10gb device
    assert ext.filter({"Pod": mig_pod("m5", "20000"), "NodeNames": ["n"]})["NodeNames"] == []


# ------------------------------------------- fault 7: ages on the monotonic clock ----


def test_reservations_age_on_the_extenders_monotonic_clock():
    """Fault 7: a reservation's age is measured on the extender's own monotonic clock: a step
    of the wall clock (NTP, a VM resumed) neither ages it out nor keeps it; only monotonic
    time passing does (``assume_s`` for one never seen bound)."""
    clocks = {"wall": NOW, "mono": 5000.0}
    s = ExtenderSettings(_env_file=None)
    state = whole_and_shared_node()
    ext = Extender(s, {"n": state}.get, clock=lambda: clocks["wall"],
                   monotonic=lambda: clocks["mono"], ledger=Ledger(s.settle_s, s.assume_s))  # fmt: skip

    def whole(uid: str) -> dict[str, Any]:
        return pod(uid, [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}],
                   {"omaticaya.io/gpu-memory-mib": "30000", "omaticaya.io/gpu-count": "2"})  # fmt: skip

    assert ext.filter({"Pod": whole("a"), "NodeNames": ["n"]})["NodeNames"] == ["n"]
    assert ext.ledger.get("a").placed_at == 5000.0  # type: ignore[union-attr]
    clocks["wall"] += s.assume_s + 100  # the wall clock steps forward: still counts
    clocks["mono"] += 1
    assert ext.filter({"Pod": whole("b"), "NodeNames": ["n"]})["NodeNames"] == []
    clocks["wall"] -= 2 * (s.assume_s + 100)  # and back: still counts, no longer
    clocks["mono"] += s.assume_s  # monotonic time passes: it ages out
    assert ext.filter({"Pod": whole("c"), "NodeNames": ["n"]})["NodeNames"] == ["n"]


# ------------------------- a plain init container's units the kubelet does not list ----


def test_a_larger_init_containers_units_count_for_the_pods_life():
    """A 40-unit plain init container before a 1-unit app: the kubelet holds 40 units for the
    pod's life, its PodResources lists the app's 1. Long after ``settle_s`` the extender still
    counts the 39 unlisted units in the units book of their GPU (never in its memory), so a
    40-unit pod is not promised units the kubelet's available list lacks."""
    state = replace(node(shared_gpus=(shared(0, 40 * U, units=78), shared(1, 0, units=79))),
                    holders=frozenset({"ns/a"}), slices_held=(("ns/a", 0, 1),),
                    units_attributed=True)  # fmt: skip
    p = Placement("ns/a", "a", "n", 0, 1, placed_at=0.0, started_at=NOW - 600,
                  gpus=(0,), slices=(40,), bound=True)  # fmt: skip
    still = pending([p], state, now=10_000.0, settle_s=60)
    assert [(q.slices, q.gpus, q.in_memory, q.in_units) for q in still] == [((39,), (0,), False, True)]
    left = adjust(state, still)
    assert (left.shared[0].free_mib, left.shared[0].units_left) == (40 * U, 39)
    assert place(left, Need(0, 1, slices=(40,))) is None
    # every unit listed (the app reused them all): nothing hidden
    listed = replace(state, slices_held=(("ns/a", 0, 40),))
    assert pending([p], listed, now=10_000.0, settle_s=60) == []


def test_a_reused_init_containers_slice_counts_its_units_not_its_memory():
    """A 40-unit plain init container before a 1-unit app: 40 units held on one GPU, placed by
    the init's 40; once admitted the device plugin counts only the app's slice in memory (the
    init's is superseded), so what is left is 39 GiB less in units and 1 GiB less in memory."""
    need = parse_need(pod("p", [{"name": "a", "resources": {"limits": {
        "omaticaya.io/gpu-memory": 1}}}]) | {"spec": {
        "initContainers": [{"name": "i", "resources": {"limits": {"omaticaya.io/gpu-memory": 40}}}],
        "containers": [{"name": "a", "resources": {"limits": {"omaticaya.io/gpu-memory": 1}}}]}})
    assert need is not None and (need.slices, need.slice_memory) == ((40,), (1,))
    state = node(shared_gpus=(shared(0, 50 * U, units=79),))
    taken = place(state, need)
    assert taken is not None and taken.slices == (0,)
    left = take(state, need, taken)
    assert (left.shared[0].free_mib, left.shared[0].units_left) == (49 * U, 39)

"""The in-flight rules (``scheduler.inflight``) pinned where a mutation run found no test
(``scripts/mutation``): the devices a placement is on and their live free memory (MIG devices
too), the baselines, the edge of "read after the pod started", the units of a bound pod's
slices the kubelet holds and does not list (each field of that placement), where the kubelet
put a slice, and where ``adjust`` takes a placement off (known devices first, then the model's
order; slices, whole GPUs beside slices, MIG devices). Table-driven where it can be; each row
names what it pins.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from omaticaya_py.core.schema import GpuInfo, NodeGpuState
from omaticaya_py.scheduler.inflight import Placement, adjust, baselines, live_free_mib, pending

NOW = 1_000.0
SETTLE = 60.0
UNIT = 1024
KEY = "ns/p"


def slice_gpu(index: int, units: int = 20, free: int = 80_000, healthy: bool = True) -> GpuInfo:
    return GpuInfo(index, free, healthy, units_left=units)


def mig(index: int, k: int | None, free: int, profile: str = "1g.10gb", healthy: bool = True,
        assigned: bool = False) -> GpuInfo:  # fmt: skip
    return GpuInfo(index, free, healthy, profile=profile, mig_index=k, assigned=assigned)


def node(**kw: Any) -> NodeGpuState:
    return NodeGpuState(**{"name": "n", "known": True, "read_at": NOW, "share_unit_mib": UNIT,
                           **kw})  # fmt: skip


def placed(**kw: Any) -> Placement:
    """A pod's placement on node n, bound, started before the reading."""
    return Placement(**{"key": KEY, "uid": "u", "node": "n", "memory_mib": 0, "count": 0,
                        "placed_at": NOW, "started_at": NOW - 10, **kw})  # fmt: skip


# ------------------------------------------------------------ devices and memory ----


def test_the_devices_a_placement_is_on():
    assert placed(slices=(5,), gpus=(0,)).memory_on(None) == ((("shared", 0), 0),)
    assert placed(slices=(5,), gpus=(0,)).memory_on(UNIT) == ((("shared", 0), 5 * UNIT),)
    whole = placed(memory_mib=7, count=1, gpus=(2,))
    assert whole.memory_on(UNIT) == ((("gpu", 2), 7),)
    assert placed(memory_mib=7, count=1, profile="1g.10gb", migs=((1, 2),)).memory_on(UNIT) == (
        (("mig", (1, 2)), 7),
    )


MIGS = (mig(0, None, 100), mig(0, 1, 200), mig(1, 0, 300), mig(1, 2, 400, healthy=False))
LIVE = [
    ("a MIG device without a MIG index is index 0", ("mig", (0, 0)), 100),
    ("a MIG device by its index", ("mig", (0, 1)), 200),
    ("a MIG device of index 0", ("mig", (1, 0)), 300),
    ("an unhealthy MIG device shows nothing", ("mig", (1, 2)), None),
    ("a MIG device not there", ("mig", (3, 0)), None),
    ("an assigned GPU by its live reading", ("gpu", 0), 5_000),
    ("a GPU not assigned", ("gpu", 1), 6_000),
    ("a shared GPU", ("shared", 0), 80_000),
]  # fmt: skip


@pytest.mark.parametrize(("case", "device", "free"), LIVE, ids=[c[0] for c in LIVE])
def test_a_devices_live_free_memory(case, device, free):
    state = node(mig=MIGS, shared=(slice_gpu(0),),
                 gpus=(GpuInfo(0, 0, True, assigned=True, assigned_free_mib=5_000),
                       GpuInfo(1, 6_000, True)))  # fmt: skip
    assert live_free_mib(state, device) == free, case


def test_a_placements_baselines():
    state = node(gpus=(GpuInfo(0, 6_000, True), GpuInfo(1, 7_000, True)))
    p = placed(memory_mib=1, count=2, gpus=(1, 0))
    assert baselines(state, p) == (7_000, 6_000)
    assert baselines(None, p) == ()


def test_a_holder_read_at_the_moment_its_pod_started_is_not_in_the_reading_yet():
    state = node(gpus=(GpuInfo(0, 0, True, assigned=True, assigned_free_mib=70_000),),
                 holders=frozenset({KEY}))  # fmt: skip
    p = placed(memory_mib=1000, count=1, gpus=(0,), started_at=NOW, placed_at=NOW)
    assert pending([p], state, now=NOW, settle_s=SETTLE) == [p]
    assert pending([replace(p, started_at=NOW - 1)], state, now=NOW, settle_s=SETTLE) == []


# ------------------------------------------------- units held and not listed ----

AGED = NOW - 2 * SETTLE  # so old that only its unlisted units count
FIELDS = {"whole_gpus": (3,), "count": 1, "exclusive": True, "baselines": (1_000, 2_000),
          "slice_memory": (1, 1), "memory_mib": 9, "placed_at": AGED, "in_units": False}  # fmt: skip


def unlisted(slices: tuple[int, ...], gpus: tuple[int, ...]) -> Placement:
    """What ``pending`` keeps of an aged pod: its units held and not listed, units book only."""
    return placed(**{**FIELDS, "slices": slices, "gpus": gpus, "whole_gpus": (), "count": 0,
                     "exclusive": False, "in_memory": False, "in_units": True, "baselines": (),
                     "slice_memory": ()})  # fmt: skip


UNLISTED = [
    ("two slices on their GPUs, one partly listed", (20, 20), (0, 1), ((0, 1), (1, 20)),
     {}, [unlisted((19,), (0,))]),
    ("one slice, its GPU not known: on the GPU its listed units are on", (40,), (),
     ((1, 1),), {}, [unlisted((39,), (1,))]),
    ("one slice, its GPU known: there, wherever the listed units are", (40,), (0,), ((1, 1),),
     {}, [unlisted((40,), (0,))]),
    ("two slices, their GPUs not all known: not placed", (20, 20), (0,), ((0, 1), (1, 1)),
     {}, []),
    ("listed units on one GPU add up", (40,), (0,), ((0, 1), (0, 2)), {}, [unlisted((37,), (0,))]),
    ("two slices on one GPU add up", (20, 20), (0, 0), ((0, 1),), {}, [unlisted((39,), (0,))]),
    ("a GPU none of whose units is listed: all of them", (20, 1), (0, 1), ((0, 1),), {},
     [unlisted((19, 1), (0, 1))]),
    ("every unit listed: nothing", (20,), (0,), ((0, 20),), {}, []),
    ("a pod never seen bound: nothing", (40,), (0,), ((0, 1),), {"bound": False}, []),
    ("holders of shared GPUs not published: nothing", (40,), (0,), ((0, 1),),
     {"attributed": False}, []),
]  # fmt: skip


@pytest.mark.parametrize(("case", "slices", "gpus", "listed", "kw", "expected"), UNLISTED,
                         ids=[u[0] for u in UNLISTED])  # fmt: skip
def test_the_units_held_and_not_listed(case, slices, gpus, listed, kw, expected):
    state = node(shared=(slice_gpu(0, 40), slice_gpu(1, 40)), holders=frozenset({KEY}),
                 slices_held=tuple((KEY, i, n) for i, n in listed),
                 units_attributed=kw.get("attributed", True))  # fmt: skip
    p = placed(**{**FIELDS, "slices": slices, "gpus": gpus, "bound": kw.get("bound", True)})
    if not kw.get("bound", True):
        expected = [replace(e, bound=False) for e in expected]
    assert pending([p], state, now=NOW, settle_s=SETTLE) == expected, case


# ---------------------------------------------------- where the kubelet put a slice ----

HELD_ON = [
    ("its GPU not known: where the kubelet put it", (), ((1, 5),), (1,)),
    ("its GPU known: where the kubelet put it", (0,), ((1, 5),), (1,)),
    ("two slices, each matched by its size", (0, 0), ((1, 7), (2, 5)), (2, 1)),
    ("a slice of another size listed: where the ledger put it", (0, 0), ((1, 4), (2, 5)), (0, 0)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "gpus", "listed", "where"), HELD_ON, ids=[h[0] for h in HELD_ON])
def test_a_slice_still_in_memory_counts_where_the_kubelet_put_it(case, gpus, listed, where):
    """The pod is a holder (its units shown) and no drop shows its memory yet: its slices
    still count in the memory book, on the GPUs the telemetry lists them on."""
    slices = (5,) if len(gpus) < 2 else (5, 7)
    state = node(shared=(slice_gpu(0), slice_gpu(1), slice_gpu(2)), holders=frozenset({KEY}),
                 slices_held=tuple((KEY, i, n) for i, n in listed)
                 + (("ns/other", 0, 5), ("ns/other", 0, 7)),
                 units_attributed=True)  # fmt: skip
    p = placed(slices=slices, gpus=gpus)
    got = [q for q in pending([p], state, now=NOW, settle_s=SETTLE) if q.in_memory]
    assert got == [replace(p, in_memory=True, in_units=False, gpus=where)], case


# --------------------------------------------------------------------- adjust ----


def frees(state: NodeGpuState) -> list[tuple[int, bool]]:
    return [(g.free_mib, g.assigned) for g in state.gpus]


def test_a_known_gpu_first_then_the_most_free():
    state = node(gpus=(GpuInfo(0, 70_000, True), GpuInfo(1, 40_000, True),
                       GpuInfo(2, 50_000, True)))  # fmt: skip
    p = placed(memory_mib=10_000, count=2, gpus=(0,))
    assert frees(adjust(state, [p])) == [(60_000, False), (40_000, False), (40_000, False)]


def test_an_unhealthy_gpu_never_takes_a_placement():
    state = node(gpus=(GpuInfo(0, 70_000, True), GpuInfo(1, 80_000, False)))
    p = placed(memory_mib=10_000, count=2)
    assert frees(adjust(state, [p])) == [(60_000, False), (80_000, False)]


SHARED = [
    ("equal room: the lower index", (slice_gpu(0), slice_gpu(1)), [15, 20]),
    ("no healthy shared GPU: nothing taken", (slice_gpu(0, healthy=False),
                                              slice_gpu(1, healthy=False)), [20, 20]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "shared", "units"), SHARED, ids=[s[0] for s in SHARED])
def test_a_slice_of_unknown_gpu_goes_to_the_roomiest(case, shared, units):
    got = adjust(node(shared=shared), [placed(slices=(5,))])
    assert [g.units_left for g in got.shared] == units, case


def test_whole_gpus_beside_slices_go_to_healthy_gpus_no_container_holds():
    state = node(shared=(slice_gpu(0),),
                 gpus=(GpuInfo(0, 0, True, assigned=True, assigned_free_mib=1),
                       GpuInfo(1, 80_000, False), GpuInfo(2, 70_000, True),
                       GpuInfo(3, 60_000, True)))  # fmt: skip
    p = placed(slices=(5,), count=2, exclusive=True)
    assert frees(adjust(state, [p])) == [(0, True), (80_000, False), (0, True), (0, True)]
    one = replace(p, count=1)
    assert frees(adjust(state, [one])) == [(0, True), (80_000, False), (0, True), (60_000, False)]
    four = replace(p, count=4)  # more than there are: the two there are, never an unhealthy one
    assert frees(adjust(state, [four])) == frees(adjust(state, [p]))


def test_placements_on_known_gpus_are_taken_off_first():
    state = node(gpus=(GpuInfo(0, 50_000, True), GpuInfo(1, 45_000, True)))
    unknown, known = (
        placed(memory_mib=10_000, count=1),
        placed(memory_mib=10_000, count=1, gpus=(0,)),
    )
    assert frees(adjust(state, [unknown, known])) == [(40_000, False), (35_000, False)]


def migs(state: NodeGpuState) -> list[tuple[int, int | None, bool]]:
    return [(m.index, m.mig_index, m.assigned) for m in state.mig]


def test_mig_devices_known_first_then_the_most_free_of_the_profile():
    state = node(mig=(mig(0, 0, 100), mig(0, 1, 900, assigned=True), mig(0, 2, 500),
                      mig(1, 0, 800), mig(1, 1, 9_000, profile="2g.20gb"),
                      mig(1, 2, 7_000, healthy=False)))  # fmt: skip
    p = placed(memory_mib=1, count=2, profile="1g.10gb", migs=((0, 0),))
    assert migs(adjust(state, [p])) == [(0, 0, True), (0, 1, True), (0, 2, False), (1, 0, True),
                                        (1, 1, False), (1, 2, False)]  # fmt: skip
    unknown = replace(p, migs=(), count=1)
    assert migs(adjust(state, [unknown])) == [(0, 0, False), (0, 1, True), (0, 2, False),
                                              (1, 0, True), (1, 1, False), (1, 2, False)]  # fmt: skip
    gone = replace(p, migs=((5, 5),), count=1)
    assert migs(adjust(state, [gone])) == migs(adjust(state, [unknown]))


# -------------------------------------------------------------------- pending ----


def test_pending_orders_by_start_then_placement_and_ages_by_the_given_windows():
    a = placed(uid="a", memory_mib=1, count=1, placed_at=1.0, started_at=20.0)
    b = placed(uid="b", memory_mib=1, count=1, placed_at=2.0, started_at=10.0)
    c = placed(uid="c", memory_mib=1, count=1, placed_at=0.5, started_at=None)
    assert pending([a, c, b], None, now=3.0, settle_s=SETTLE) == [b, a, c]
    reserved = replace(a, bound=False, placed_at=NOW - 10)
    assert pending([reserved], None, now=NOW, settle_s=SETTLE, assume_s=5.0) == []
    assert pending([reserved], None, now=NOW, settle_s=SETTLE, assume_s=11.0) == [reserved]


def drop(**kw: Any) -> NodeGpuState:
    """GPU 0 read at ``NOW`` with 10,000 MiB less free than when a placement was counted."""
    return node(gpus=(GpuInfo(0, 70_000, True),), **kw)


def test_a_drop_shows_a_placement_only_in_a_reading_after_its_pod_started():
    p = placed(memory_mib=10_000, count=1, gpus=(0,), baselines=(80_000,), started_at=NOW)
    assert pending([p], drop(), now=NOW, settle_s=SETTLE) == [p]
    assert pending([replace(p, started_at=NOW - 1)], drop(), now=NOW, settle_s=SETTLE) == []
    at_epoch = replace(p, started_at=0.5)  # a reading at 0 s is before a start at 0.5 s
    assert pending([at_epoch], drop(read_at=0.0), now=NOW, settle_s=SETTLE) == [at_epoch]


def test_a_placement_of_unknown_devices_does_not_hide_the_later_ones():
    first = placed(uid="a", memory_mib=10_000, count=1, placed_at=NOW - 2)
    later = placed(uid="b", memory_mib=5_000, count=1, gpus=(0,), placed_at=NOW - 1)
    assert pending([first, later], drop(), now=NOW, settle_s=SETTLE) == [first, later]


def test_a_holder_on_a_gpu_now_unhealthy_is_shown_by_the_books():
    state = node(gpus=(GpuInfo(0, 70_000, False),), holders=frozenset({KEY}))
    p = placed(memory_mib=10_000, count=1, gpus=(0,), baselines=(80_000,))
    assert pending([p], state, now=NOW, settle_s=SETTLE) == []
    assert pending([replace(p, key="ns/q")], state, now=NOW, settle_s=SETTLE) == [
        replace(p, key="ns/q")
    ]


def slices_node(free: int, **kw: Any) -> NodeGpuState:
    return node(shared=(slice_gpu(0, free=free), slice_gpu(1)), units_attributed=True, **kw)


def test_a_slice_counts_in_each_book_until_each_shows_it():
    p = placed(slices=(5,), gpus=(0,), baselines=(80_000,))
    # no drop, not a holder: both books
    assert pending([p], slices_node(80_000), now=NOW, settle_s=SETTLE) == [p]
    # a drop of its memory, not a holder yet: its units only
    assert pending([p], slices_node(80_000 - 5 * UNIT), now=NOW, settle_s=SETTLE) == [
        replace(p, in_memory=False)
    ]
    # a reading at its start lists it elsewhere: its units still count where it was placed
    listed = slices_node(80_000, slices_held=((KEY, 1, 5),))
    unheld = replace(p, in_units=False, started_at=NOW)
    assert pending([unheld], listed, now=NOW, settle_s=SETTLE) == [replace(unheld, in_units=True)]

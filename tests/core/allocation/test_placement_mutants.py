"""Direct cases for ``core.allocation.placement`` that its other tests (the scheduler's fit, the
device plugin's slices, ``tests/scheduler/test_placement_model.py``) leave open: the mutants
``scripts mutation`` found surviving there, each case named by the rule it pins.

- The edges: a device with exactly the memory asked fits; exactly ``count`` fitting devices
  are enough; ``pick_whole``'s memory defaults to 0 (a device with no free memory fits a pod
  that asks none).
- ``place``: memory without a device goes by the policy (``pick_memory``), never the plugin's
  whole order; a need of nothing takes nothing (room 0); a MIG pod's room counts only the
  healthy free devices; a node without a unit size fits no slice; a group is placed by its
  first container's size in MiB; a slice's memory that no longer counts is not taken off.
- ``place_slices`` alone: no slices; memories not given (each slice's own size).
- ``take`` of memory alone, of units or memory alone, of slices on a node without a unit
  size, of a reservation naming fewer slices than the need.
- ``take_slice``, ``take_memory``, ``take_whole`` and ``whole_key`` (``first_whole`` with
  links: test_placement_links.py).
- ``slice_room`` and ``choose_gpus``, which no other in-process test reaches directly.
"""

from __future__ import annotations

import pytest

from omaticaya_py.core.allocation.placement import (
    Need,
    Taken,
    choose_gpus,
    first_whole,
    pick_memory,
    pick_whole,
    place,
    place_slices,
    slice_room,
    take,
    take_memory,
    take_slice,
    take_whole,
    whole_key,
)
from omaticaya_py.core.schema import GpuInfo, NodeGpuState

U = 1024  # MiB per unit


def shared(index: int, free: int, units: int | None = None, healthy: bool = True) -> GpuInfo:
    return GpuInfo(index, free, healthy, units_left=units)


def node(*, gpus: tuple[GpuInfo, ...] = (), shared_gpus: tuple[GpuInfo, ...] = (),
         mig: tuple[GpuInfo, ...] = (), unit: int | None = U) -> NodeGpuState:  # fmt: skip
    return NodeGpuState("n", True, "Healthy", gpus=gpus, shared=shared_gpus,
                        share_unit_mib=unit if shared_gpus else None, mig=mig,
                        free_total_mib=sum(g.free_mib for g in gpus if g.healthy))  # fmt: skip


# ------------------------------------------------------------------ the edges ----


@pytest.mark.parametrize(
    ("case", "gpus", "count", "mib", "chosen"),
    [
        ("exactly the memory asked fits", [GpuInfo(0, 20000, True)], 1, 20000, [0]),
        ("one MiB short does not", [GpuInfo(0, 19999, True)], 1, 20000, None),
        ("exactly count fit: enough", [GpuInfo(0, 30000, True), GpuInfo(1, 40000, True)], 2,
         30000, [0, 1]),
        ("one fewer than count: none", [GpuInfo(0, 30000, True), GpuInfo(1, 40000, True)], 3,
         30000, None),
    ],
)  # fmt: skip
def test_pick_memory_edges(case, gpus, count, mib, chosen):
    got = pick_memory(gpus, count, mib, "binpack")
    assert (None if got is None else [g.index for g in got]) == chosen, case


@pytest.mark.parametrize(
    ("case", "devices", "count", "mib", "chosen"),
    [
        ("exactly the memory asked fits", [GpuInfo(0, 20000, True)], 1, 20000, [0]),
        ("one MiB short does not", [GpuInfo(0, 19999, True)], 1, 20000, None),
        ("no memory asked: a device with none free fits", [GpuInfo(0, 0, True)], 1, None, [0]),
    ],
)  # fmt: skip
def test_pick_whole_edges(case, devices, count, mib, chosen):
    got = pick_whole(devices, count) if mib is None else pick_whole(devices, count, mib)
    assert (None if got is None else [g.index for g in got]) == chosen, case


# ------------------------------------------------------------------ place ----


@pytest.mark.parametrize(
    ("case", "state", "need", "policy", "taken"),
    [
        ("memory alone, binpack: the least free that fits, not the plugin's most free",
         node(gpus=(GpuInfo(0, 80000, True), GpuInfo(1, 30000, True))), Need(20000, 1),
         "binpack", Taken(gpus=(1,), room_mib=110000)),
        ("memory alone, spread: the most free",
         node(gpus=(GpuInfo(0, 30000, True), GpuInfo(1, 80000, True))), Need(20000, 1),
         "spread", Taken(gpus=(1,), room_mib=110000)),
        ("memory alone on two GPUs: both, sorted",
         node(gpus=(GpuInfo(0, 30000, True), GpuInfo(1, 80000, True), GpuInfo(2, 10000, True))),
         Need(20000, 2), "binpack", Taken(gpus=(0, 1), room_mib=120000)),
        ("memory alone, none with it free: no fit",
         node(gpus=(GpuInfo(0, 30000, True),)), Need(40000, 1), "binpack", None),
        ("a need of nothing: nothing taken, room 0",
         node(gpus=(GpuInfo(0, 30000, True),)), Need(0, 0), "binpack", Taken()),
        ("a MIG pod's room: the healthy free devices of its profile alone",
         node(mig=(GpuInfo(0, 9000, True, profile="1g.10gb", mig_index=0),
                   GpuInfo(0, 9000, False, profile="1g.10gb", mig_index=1),
                   GpuInfo(0, 0, True, profile="1g.10gb", mig_index=2, assigned=True,
                           assigned_free_mib=9000),
                   GpuInfo(0, 19000, True, profile="2g.20gb", mig_index=3))),
         Need(8000, 1, exclusive=True, profile="1g.10gb"), "binpack",
         Taken(migs=((0, 0),), room_mib=9000)),
        ("a shared GPU on a node without a unit size: no slice fits",
         node(shared_gpus=(shared(0, 40 * U),), unit=None), Need(0, 1, slices=(2,)), "binpack",
         None),
        ("a group placed by its first container in MiB: the GPU too small for the first "
         "is passed over",
         node(shared_gpus=(shared(0, 1 * U), shared(1, 10 * U))),
         Need(0, 1, slices=(8,), firsts=(2,)), "binpack", Taken(slices=(1,), room_mib=10 * U)),
        ("a slice whose memory no longer counts leaves it for the next",
         node(shared_gpus=(shared(0, 10 * U),)), Need(0, 1, slices=(6, 5), slice_memory=(0, 5)),
         "binpack", Taken(slices=(0, 0), room_mib=10 * U)),
        ("a slice whose memory counts takes it off",
         node(shared_gpus=(shared(0, 10 * U),)), Need(0, 1, slices=(6, 5)), "binpack", None),
    ],
)  # fmt: skip
def test_place_edges(case, state, need, policy, taken):
    assert place(state, need, policy) == taken, case


@pytest.mark.parametrize(
    ("case", "mibs", "memories", "placed"),
    [
        ("no slices: none placed, room 0", (), (), ((), 0)),
        ("memories not given: each slice's own size counts", (6 * U, 5 * U), (), None),
        ("memories not given, room enough", (6 * U, 4 * U), (), ((0, 0), 10 * U)),
        ("memories given for the first alone: the later ones' own size",
         (6 * U, 4 * U, 6 * U), (0,), ((0, 0, 0), 10 * U)),
        ("the same, a MiB more than is left", (6 * U, 4 * U, 6 * U + 1), (0,), None),
    ],
)  # fmt: skip
def test_place_slices_alone(case, mibs, memories, placed):
    assert place_slices([shared(0, 10 * U)], mibs, "binpack", U, (), memories) == placed, case


# ------------------------------------------------------------------ take ----


def test_take_memory_alone_counts_the_memory_on_each_gpu_not_the_gpu_whole():
    state = node(gpus=(GpuInfo(0, 80000, True), GpuInfo(1, 30000, True)))
    left = take(state, Need(20000, 1), Taken(gpus=(1,)))
    assert left.gpus == (GpuInfo(0, 80000, True), GpuInfo(1, 10000, True))
    assert left.free_total_mib == 90000


def test_take_of_units_alone_or_memory_alone():
    state = node(shared_gpus=(shared(0, 40 * U, units=40),))
    need, taken = Need(0, 1, slices=(10,)), Taken(slices=(0,))
    assert take(state, need, taken, memory=False).shared == (shared(0, 40 * U, units=30),)
    assert take(state, need, taken, units=False).shared == (shared(0, 30 * U, units=40),)
    assert take(state, need, taken, memory=False, units=False).shared == state.shared


def test_take_of_slices_on_a_node_without_a_unit_size_takes_nothing():
    state = node(shared_gpus=(shared(0, 40 * U, units=40),), unit=None)
    assert take(state, Need(0, 1, slices=(10,)), Taken(slices=(0,))) == state


def test_take_of_a_reservation_naming_fewer_slices_than_the_need():
    state = node(shared_gpus=(shared(0, 40 * U, units=40), shared(1, 40 * U, units=40)))
    left = take(state, Need(0, 1, slices=(10, 5)), Taken(slices=(1,)))
    assert left.shared == (shared(0, 40 * U, units=40), shared(1, 30 * U, units=30))


@pytest.mark.parametrize(
    ("case", "kw", "after"),
    [
        ("memory and units by default", {}, (30 * U, 30)),
        ("memory_mib: what of the slice still counts", {"memory_mib": 2 * U}, (38 * U, 30)),
        ("units alone", {"memory": False}, (40 * U, 30)),
        ("memory alone", {"units": False}, (30 * U, 40)),
    ],
)  # fmt: skip
def test_take_slice(case, kw, after):
    got = take_slice(shared(0, 40 * U, units=40), 10 * U, U, **kw)
    assert (got.free_mib, got.units_left) == after, case
    assert type(got.units_left) is int, case


def test_take_slice_clamps_each_book_at_0():
    got = take_slice(shared(0, 4 * U, units=3), 10 * U, U)
    assert (got.free_mib, got.units_left) == (0, 0)


@pytest.mark.parametrize(("mib", "free"), [(1, 29999), (10000, 20000), (40000, 0), (0, 30000),
                                           (-5, 30000)])  # fmt: skip
def test_take_memory(mib, free):
    assert take_memory(GpuInfo(0, 30000, True), mib) == GpuInfo(0, free, True)


def test_take_memory_of_nothing_leaves_unknown_free_memory_unknown():
    assert take_memory(GpuInfo(0, -1, True), 0) == GpuInfo(0, -1, True)


def test_take_whole_keeps_the_live_free_memory():
    assert take_whole(GpuInfo(0, 30000, True)) == GpuInfo(0, 0, True, assigned=True,
                                                          assigned_free_mib=30000)  # fmt: skip


# ------------------------------------------------------------ the whole order ----


def test_whole_key():
    assert whole_key(GpuInfo(3, 100, True)) == (False, -100, 3, 0)
    assert whole_key(GpuInfo(3, 100, False, profile="1g.10gb", mig_index=2)) == (True, -100, 3, 2)


def test_first_whole_healthy_before_more_free_and_index_before_list_order():
    infos = [GpuInfo(1, 50000, True), GpuInfo(0, 50000, True), GpuInfo(2, 80000, False)]
    assert [g.index for g in first_whole(infos, 3, lambda g: g)] == [0, 1, 2]


# ------------------------------------------------------ slice_room, choose_gpus ----


@pytest.mark.parametrize(
    ("case", "state", "need", "policy", "room"),
    [
        ("no slices: None", node(shared_gpus=(shared(0, 40 * U),)), Need(0, 1), "binpack", None),
        ("binpack: the least room that fits",
         node(shared_gpus=(shared(0, 40 * U), shared(1, 20 * U))), Need(0, 1, slices=(10,)),
         "binpack", 20 * U),
        ("spread: the most", node(shared_gpus=(shared(0, 40 * U), shared(1, 20 * U))),
         Need(0, 1, slices=(10,)), "spread", 40 * U),
        ("slices that do not fit: None", node(shared_gpus=(shared(0, 4 * U),)),
         Need(0, 1, slices=(10,)), "binpack", None),
        ("the slices alone, whatever whole GPU the pod also asks",
         node(gpus=(GpuInfo(0, 0, True, assigned=True),), shared_gpus=(shared(1, 20 * U),)),
         Need(0, 1, slices=(10,), exclusive=True), "binpack", 20 * U),
    ],
)  # fmt: skip
def test_slice_room(case, state, need, policy, room):
    assert slice_room(state, need, policy) == room, case


@pytest.mark.parametrize(
    ("case", "state", "need", "policy", "gpus"),
    [
        ("an exclusive pod with slices: its whole GPU, whatever its slices",
         node(gpus=(GpuInfo(0, 30000, True), GpuInfo(1, 80000, True))),
         Need(0, 1, slices=(10,), exclusive=True), "binpack", (1,)),
        ("an exclusive pod without a free GPU: none",
         node(gpus=(GpuInfo(0, 0, True, assigned=True),)), Need(0, 1, exclusive=True),
         "binpack", ()),
        ("a pod of slices alone takes no whole GPU",
         node(gpus=(GpuInfo(0, 80000, True),), shared_gpus=(shared(1, 40 * U),)),
         Need(0, 1, slices=(10,)), "binpack", ()),
        ("memory alone, spread: the most free",
         node(gpus=(GpuInfo(0, 30000, True), GpuInfo(1, 80000, True))), Need(20000, 1),
         "spread", (1,)),
        ("memory alone, binpack: the least free",
         node(gpus=(GpuInfo(0, 30000, True), GpuInfo(1, 80000, True))), Need(20000, 1),
         "binpack", (0,)),
    ],
)  # fmt: skip
def test_choose_gpus(case, state, need, policy, gpus):
    assert choose_gpus(state, need, policy) == gpus, case

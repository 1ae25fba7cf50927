"""The device plugin's choice of a slice's GPU and units (``rooms``, ``choose``,
``preferred_units``), the unit devices of its GPUs (``expand``, ``gpus_of``) and a refusal's
message: cases that mutation testing (``scripts/mutation``) found no test pinned,
above all a slice that exactly fits and the freest-GPU tie-break when free memory is unknown."""

from __future__ import annotations

import pytest

from omaticaya_py.core.model.sharing import unit_id
from omaticaya_py.core.schema import GpuInfo
from omaticaya_py.deviceplugin.allocation import DeviceState
from omaticaya_py.deviceplugin.slices import (
    Room,
    SliceRefused,
    choose,
    expand,
    gpus_of,
    preferred_units,
    rooms,
)

UNIT = 1024


def units(gpu: str, *ks: int) -> tuple[str, ...]:
    return tuple(unit_id(gpu, k) for k in ks)


def room(gpu: str, index: int, free_mib: int | None, n: int, healthy: bool = True) -> Room:
    """GPU ``gpu`` with ``n`` units available and ``free_mib`` live room."""
    return Room(gpu, index, healthy, free_mib, units(gpu, *range(n)))


# --- rooms --------------------------------------------------------------------------------------


def test_rooms_take_each_gpus_available_units_in_unit_order_less_what_is_pending() -> None:
    gpus = [DeviceState("GPU-a", 0, True, free_mib=10_000), DeviceState("GPU-b", 1, False, ("xid-79",), None),
            DeviceState("GPU-c", 2, True, free_mib=4_000)]  # fmt: skip
    available = [
        unit_id("GPU-a", 10), unit_id("GPU-a", 2), unit_id("GPU-b", 0), unit_id("GPU-a", 2),
        "GPU-a", "not-a-unit", unit_id("GPU-zz", 1), unit_id("GPU-a", 0),
    ]  # fmt: skip
    got = rooms(gpus, {"GPU-a": 3_000, "GPU-b": 500, "GPU-zz": 1}, available)
    assert got == [
        Room("GPU-a", 0, True, 7_000, units("GPU-a", 0, 2, 10)),
        Room("GPU-b", 1, False, None, units("GPU-b", 0)),
        Room("GPU-c", 2, True, 4_000, ()),
    ]


def test_room_is_the_least_of_the_two_books() -> None:
    assert room("GPU-a", 0, 10_000, 3).room_mib(UNIT) == 3 * UNIT
    assert room("GPU-a", 0, 2_000, 3).room_mib(UNIT) == 2_000
    assert room("GPU-a", 0, None, 3).room_mib(UNIT) == -1


# --- choose -------------------------------------------------------------------------------------

A, B, C = "GPU-a", "GPU-b", "GPU-c"

CHOOSE_CASES = [
    # (id, candidates, size, policy, chosen GPU or None)
    ("exactly fits: 2 units, 2048 MiB free", [room(A, 0, 2 * UNIT, 2)], 2, "binpack", A),
    ("exactly fits in units, not in memory", [room(A, 0, 2 * UNIT - 1, 2)], 2, "binpack", None),
    ("exactly fits in memory, not in units", [room(A, 0, 4 * UNIT, 1)], 2, "binpack", None),
    ("unknown free memory never fits", [room(A, 0, None, 4)], 1, "binpack", None),
    ("an unhealthy GPU never fits", [room(A, 0, 8 * UNIT, 8, healthy=False)], 1, "binpack", None),
    ("binpack: the least room", [room(A, 0, 8 * UNIT, 8), room(B, 1, 3 * UNIT, 8), room(C, 2, 5 * UNIT, 8)],
     2, "binpack", B),
    ("spread: the most room", [room(A, 0, 5 * UNIT, 8), room(B, 1, 8 * UNIT, 8), room(C, 2, 3 * UNIT, 8)],
     2, "spread", B),
    ("binpack tie: the lowest index", [room(B, 1, 4 * UNIT, 8), room(A, 0, 4 * UNIT, 8)], 2, "binpack", A),
    ("spread tie: the lowest index", [room(B, 1, 4 * UNIT, 8), room(A, 0, 4 * UNIT, 8)], 2, "spread", A),
    ("room counts the units too: 3 units left is less room than 4 GiB free",
     [room(A, 0, 4 * UNIT, 8), room(B, 1, 9 * UNIT, 3)], 2, "binpack", B),
    ("the binpack pick that does not fit is skipped",
     [room(A, 0, 1 * UNIT, 8), room(B, 1, 6 * UNIT, 8)], 2, "binpack", B),
    ("nothing to choose from", [], 1, "binpack", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("candidates", "size", "policy", "expected"), [c[1:] for c in CHOOSE_CASES], ids=[c[0] for c in CHOOSE_CASES]
)
def test_choose(candidates, size, policy, expected) -> None:
    best = choose(candidates, size, UNIT, policy)
    assert (best.gpu if best is not None else None) == expected


def test_choose_by_default_packs() -> None:
    candidates = [room(A, 0, 8 * UNIT, 8), room(B, 1, 3 * UNIT, 8)]
    assert choose(candidates, 2, UNIT) == candidates[1]


def test_an_unknown_policy_is_refused() -> None:
    """The policy is one enum compared in one place (core.allocation.policy, issue 49): a
    policy that is neither binpack nor spread is an error, no longer packed silently (the
    settings refuse it first: OMATICAYA_PLACEMENT_POLICY)."""
    candidates = [room(A, 0, 8 * UNIT, 8), room(B, 1, 3 * UNIT, 8)]
    with pytest.raises(ValueError, match="other"):
        choose(candidates, 2, UNIT, "other")


# --- preferred_units ----------------------------------------------------------------------------

PREFERRED_CASES = [
    # (id, candidates, must_include, size, policy, preferred unit IDs)
    ("the chosen GPU's first units", [room(A, 0, 8 * UNIT, 8), room(B, 1, 3 * UNIT, 8)], [], 2, "binpack",
     list(units(B, 0, 1))),
    ("exactly fits", [room(A, 0, 2 * UNIT, 2)], [], 2, "binpack", list(units(A, 0, 1))),
    ("spread", [room(A, 0, 8 * UNIT, 8), room(B, 1, 3 * UNIT, 8)], [], 2, "spread", list(units(A, 0, 1))),
    ("no room in memory anywhere: the healthy GPU with the units and the most free",
     [room(A, 0, 100, 4), room(B, 1, 900, 4), room(C, 2, 5_000, 1)], [], 2, "binpack", list(units(B, 0, 1))),
    ("no room anywhere, free memory unknown on both: the lowest index",
     [room(B, 1, None, 4), room(A, 0, None, 4)], [], 2, "binpack", list(units(A, 0, 1))),
    ("no room, unknown free memory ranks below none free",
     [room(A, 0, None, 4), room(B, 1, 0, 4)], [], 2, "binpack", list(units(B, 0, 1))),
    ("no room, an unhealthy GPU is never the fallback",
     [room(A, 0, 900, 4, healthy=False), room(B, 1, 100, 4)], [], 2, "binpack", list(units(B, 0, 1))),
    ("the fallback GPU needs the units: exactly enough",
     [room(A, 0, 900, 1), room(B, 1, 100, 2)], [], 2, "binpack", list(units(B, 0, 1))),
    ("no single GPU has the units", [room(A, 0, 900, 1), room(B, 1, 100, 1)], [], 2, "binpack", []),
    ("must-include units, topped up from their GPU",
     [room(A, 0, 8 * UNIT, 4), room(B, 1, 8 * UNIT, 4)], [unit_id(B, 2)], 3, "binpack",
     [unit_id(B, 2), unit_id(B, 0), unit_id(B, 1)]),
    ("must-include units repeated count once",
     [room(A, 0, 8 * UNIT, 4)], [unit_id(A, 3), unit_id(A, 3)], 2, "binpack", [unit_id(A, 3), unit_id(A, 0)]),
    ("must-include units that are enough already", [room(A, 0, 8 * UNIT, 4)],
     [unit_id(A, 3), unit_id(A, 1)], 1, "binpack", [unit_id(A, 3), unit_id(A, 1)]),
    ("must-include units, exactly the size", [room(A, 0, 8 * UNIT, 4)],
     [unit_id(A, 3), unit_id(A, 1)], 2, "binpack", [unit_id(A, 3), unit_id(A, 1)]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("candidates", "must", "size", "policy", "expected"),
    [c[1:] for c in PREFERRED_CASES],
    ids=[c[0] for c in PREFERRED_CASES],
)
def test_preferred_units(candidates, must, size, policy, expected) -> None:
    assert preferred_units(candidates, must, size, UNIT, policy) == expected


def test_preferred_units_by_default_packs() -> None:
    candidates = [room(A, 0, 8 * UNIT, 8), room(B, 1, 3 * UNIT, 8)]
    assert preferred_units(candidates, [], 1, UNIT) == [unit_id(B, 0)]


# --- the unit devices -----------------------------------------------------------------------


def test_expand_gives_each_gpu_its_count_of_units_sharing_its_state() -> None:
    gpus = [DeviceState("GPU-a", 3, True, (), 5_000), DeviceState("GPU-b", 4, False, ("xid-79",), None),
            DeviceState("GPU-c", 5, True, (), 9_000)]  # fmt: skip
    assert expand(gpus, {"GPU-a": 2, "GPU-b": 1, "GPU-zz": 4}) == [
        DeviceState(unit_id("GPU-a", 0), 3, True, (), 5_000),
        DeviceState(unit_id("GPU-a", 1), 3, True, (), 5_000),
        DeviceState(unit_id("GPU-b", 0), 4, False, ("xid-79",), None),
    ]  # GPU-c has no count: no units


def test_gpus_of_in_first_seen_order_a_plain_id_its_own_gpu() -> None:
    ids = ["GPU-x", unit_id("GPU-a", 1), unit_id("GPU-b", 0), unit_id("GPU-a", 0), "GPU-x"]
    assert gpus_of(ids) == ["GPU-x", "GPU-a", "GPU-b"]
    assert gpus_of([]) == []


def test_a_room_of_unknown_free_memory_is_minus_1_to_the_model() -> None:
    assert room(A, 2, None, 3, healthy=False).info() == GpuInfo(2, -1, False, units_left=3)
    assert room(A, 2, 4_000, 3).info() == GpuInfo(2, 4_000, True, units_left=3)


def test_a_refusal_says_its_message() -> None:
    refused = SliceRefused("FAILED_PRECONDITION", "GPU 2 has 100 MiB free")
    assert (refused.code, refused.message, str(refused)) == (
        "FAILED_PRECONDITION", "GPU 2 has 100 MiB free", "GPU 2 has 100 MiB free")

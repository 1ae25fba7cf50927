"""Issue 48, item 1, the device plugin's half: its device IDs are UUIDs, and a GPU whose UUID
NVML does not give in a reading is never guessed from an NVML index that two known GPUs held
(omaticaya_py/deviceplugin/inventory.py; pure, on the agent's reading as ``TickResult``).

The "reboot": GPUs A and B known at indices 3 and 4 (a trace's, or an earlier reading's); the
node comes back without A, B renumbered 3."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from omaticaya_py.core.readings import TickResult
from omaticaya_py.deviceplugin.config import Scope
from omaticaya_py.deviceplugin.inventory import Inventory
from tests.helpers import evaluate, gpu, lost, snapshot

A = "GPU-0000000a-7fda-b7ae-a94e-630097a14ca4"
B = "GPU-0000000b-7fda-b7ae-a94e-630097a14ca4"


@dataclass
class Cache:
    last: TickResult | None = None


def states(*readings: list[object]) -> dict[str, tuple[int, bool, tuple[str, ...]]]:
    """The inventory of whole GPUs known as A at 3 and B at 4, after each of ``readings`` (the
    GPUs of one tick) in turn: device ID -> (index, healthy, reasons)."""
    cache = Cache()
    inv = Inventory(cache, Scope(), devices=[(3, A), (4, B)])
    got: dict[str, tuple[int, bool, tuple[str, ...]]] = {}
    for gpus in readings:
        snap = snapshot(*gpus)  # type: ignore[arg-type]
        health, desired = evaluate(snap)
        cache.last = TickResult(snap, health, desired, None, False)
        got = {s.id: (s.index, s.healthy, s.reasons) for s in inv.devices()}
    return got


# (case, the readings after the reboot, what each known device's state is after the last)
CASES = [
    ("B renumbered 3, A gone", [[gpu(3, uuid=B)]], {A: (3, False, ("absent",)), B: (3, True, ())}),
    # a GPU at index 4 with no UUID: the one GPU known there, B, is read at 3 now: not B's (before
    # the fix B took that GPU's state, Unhealthy, though read healthy at 3)
    ("a UUID-less GPU at B's old index", [[gpu(3, uuid=B), lost(4, uuid=None)]],
     {A: (3, False, ("absent",)), B: (3, True, ())}),
    # B seen at 3, then a UUID-less GPU at 3: A and B both held index 3, neither is guessed
    ("a UUID-less GPU where two were", [[gpu(3, uuid=B)], [lost(3, uuid=None)]],
     {A: (3, False, ("absent",)), B: (3, False, ("absent",))}),
]  # fmt: skip


@pytest.mark.parametrize(("readings", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_uuidless_gpu_is_never_guessed_from_a_shifted_index(readings, want) -> None:
    got = states(*readings)
    assert {k: v[:2] for k, v in got.items()} == {k: v[:2] for k, v in want.items()}
    for k, (_, _, reasons) in want.items():
        assert set(reasons) <= set(got[k][2]), (k, got[k])


def test_a_uuidless_gpu_at_its_own_index_is_still_its_own() -> None:
    """Within one boot a GPU whose UUID read failed is the one known GPU at its index."""
    got = states([lost(3, uuid=None), gpu(4, uuid=B)])
    assert got[A][:2] == (3, False) and "lost" in got[A][2]

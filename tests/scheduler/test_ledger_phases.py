"""The reservation ledger as a state machine (``scheduler.ledger``'s diagram): every arrow
walked, table-driven, through the public verbs and read back through ``Ledger.phase`` and
``Ledger.counts``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from omaticaya_py.core.schema import GpuInfo, NodeGpuState
from omaticaya_py.scheduler.inflight import Placement
from omaticaya_py.scheduler.ledger import Ledger, Phase

NOW = 1_800_000_000.0
SETTLE_S, ASSUME_S = 60.0, 30.0
UID, KEY = "u", "ns/p"


def reading(free_mib: int, read_at: float = NOW + 5, holders: frozenset[str] = frozenset()
            ) -> NodeGpuState:  # fmt: skip
    """Node ``a``'s reading: one GPU with ``free_mib`` free, read at ``read_at``."""
    return NodeGpuState(name="a", known=True, health="Healthy", read_at=read_at,
                        gpus=(GpuInfo(0, free_mib, True),), free_total_mib=free_mib,
                        holders=holders)  # fmt: skip


def reserved(node: str = "a", at: float = NOW) -> Placement:
    return Placement(KEY, UID, node, 30000, 1, placed_at=at, gpus=(0,),
                     baselines=(70000,), bound=False)  # fmt: skip


def seen_bound(node: str = "a", at: float = NOW + 1, started: float | None = NOW + 2) -> Placement:
    """The pod watch's placement of the pod bound on ``node`` (no GPUs known)."""
    return Placement(KEY, UID, node, 30000, 1, placed_at=at, started_at=started)


# the verbs: each (ledger, now) -> None
def reserve(ledger: Ledger) -> None:
    ledger.reserve(reserved())


def release(ledger: Ledger) -> None:
    ledger.release(UID)


def confirm(ledger: Ledger) -> None:
    ledger.pod_changed(KEY, None, seen_bound("a"))


def move(ledger: Ledger) -> None:
    ledger.pod_changed(KEY, None, seen_bound("b"))


def drop(ledger: Ledger) -> None:
    ledger.pod_changed(KEY, ledger.get(UID), None)


def reserve_other(ledger: Ledger) -> None:
    """Another pod reserved later: the ledger prunes what expired (the EXPIRED -> GONE step)."""
    ledger.reserve(replace(reserved(), key="ns/q", uid="v", placed_at=NOW + ASSUME_S + 1))


#: (arrow, verbs from GONE, the reading, when, phase, counts, node held on)
ARROWS: list[tuple[str, list[Any], NodeGpuState, float, Phase, dict[str, int], str | None]] = [
    ("GONE -reserve-> RESERVED", [reserve], reading(70000), NOW + 1, Phase.RESERVED,
     {"reserved": 1}, "a"),
    ("RESERVED -release-> GONE", [reserve, release], reading(70000), NOW + 1, Phase.GONE,
     {"reserved": 1}, None),
    ("RESERVED -reserve-> RESERVED (a refilter replaces it)", [reserve, reserve],
     reading(70000), NOW + 1, Phase.RESERVED, {"reserved": 2}, "a"),
    ("RESERVED -confirm-> BOUND", [reserve, confirm], reading(70000), NOW + 3, Phase.BOUND,
     {"reserved": 1, "confirmed": 1}, "a"),
    ("RESERVED -move-> BOUND on another node", [reserve, move], reading(70000), NOW + 3,
     Phase.BOUND, {"reserved": 1, "moved": 1}, "b"),
    ("GONE -add-> BOUND (bound, never reserved)", [confirm], reading(70000), NOW + 3,
     Phase.BOUND, {}, "a"),
    ("RESERVED -expire-> EXPIRED (assume_s, never seen bound)", [reserve], reading(70000),
     NOW + ASSUME_S, Phase.EXPIRED, {"reserved": 1}, "a"),
    ("EXPIRED -> GONE at the next reserve", [reserve, reserve_other], reading(70000),
     NOW + ASSUME_S + 1, Phase.GONE, {"reserved": 2, "expired": 1}, None),
    ("BOUND -show-> SHOWN (the free memory dropped by its need)", [reserve, confirm],
     reading(40000), NOW + 6, Phase.SHOWN, {"reserved": 1, "confirmed": 1}, "a"),
    ("BOUND -show-> SHOWN (a holder in the kubelet's books)", [reserve, confirm],
     reading(70000, holders=frozenset({KEY})), NOW + 6, Phase.SHOWN,
     {"reserved": 1, "confirmed": 1}, "a"),
    ("BOUND stays BOUND: the reading is older than the pod's start", [reserve, confirm],
     reading(40000, read_at=NOW + 1), NOW + 6, Phase.BOUND, {"reserved": 1, "confirmed": 1},
     "a"),
    ("BOUND -settle_s-> EXPIRED", [reserve, confirm], reading(70000), NOW + 1 + SETTLE_S,
     Phase.EXPIRED, {"reserved": 1, "confirmed": 1}, "a"),
    ("BOUND -drop-> GONE (deleted, failed, finished)", [reserve, confirm, drop],
     reading(70000), NOW + 3, Phase.GONE, {"reserved": 1, "confirmed": 1}, None),
    ("SHOWN -drop-> GONE", [confirm, drop], reading(40000), NOW + 6, Phase.GONE, {}, None),
    ("BOUND -release-> BOUND (a bound pod is not released)", [reserve, confirm, release],
     reading(70000), NOW + 3, Phase.BOUND, {"reserved": 1, "confirmed": 1}, "a"),
    ("BOUND -reserve-> BOUND (a bound pod is not reserved again)", [reserve, confirm, reserve],
     reading(70000), NOW + 3, Phase.BOUND, {"reserved": 1, "confirmed": 1}, "a"),
]  # fmt: skip


@pytest.mark.parametrize(("arrow", "verbs", "state", "now", "phase", "counts", "node"), ARROWS,
                         ids=[a[0] for a in ARROWS])  # fmt: skip
def test_every_arrow_of_the_ledger(arrow, verbs, state, now, phase, counts, node):
    ledger = Ledger(settle_s=SETTLE_S, assume_s=ASSUME_S)
    for verb in verbs:
        verb(ledger)
    assert ledger.phase(UID, state, now) is phase, arrow
    assert {k: n for k, n in ledger.counts.items() if n} == counts, arrow
    held = ledger.get(UID)
    assert (held.node if held is not None else None) == node, arrow


def test_every_phase_is_reached_by_an_arrow():
    assert {a[4] for a in ARROWS} == set(Phase)


def test_a_change_on_a_node_moves_its_version_only():
    ledger = Ledger()
    reserve(ledger)
    before = dict(ledger.versions)
    move(ledger)
    assert ledger.versions["a"] > before["a"] and ledger.versions["b"] == 1

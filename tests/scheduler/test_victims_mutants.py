"""The preemption rules (``scheduler.victims``) pinned where a mutation run found no test
(``scripts/mutation``): a pod document's every refusal and phase, its start time, the whole
node after an eviction (each GPU's fields), the whole ``Choice`` of a refused node, the edges
of the exact search and of a GPU's size, which failed nodes eviction cannot help (slices and
MIG devices too). Table-driven; each row names what it pins.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from omaticaya_py.core.schema import GpuInfo, NodeGpuState
from omaticaya_py.scheduler.fit import Reason, reason_text
from omaticaya_py.scheduler.need import Need
from omaticaya_py.scheduler.victims import (
    EXACT_POOL,
    Choice,
    GpuRoom,
    PodOnNode,
    Preemptor,
    choose_victims,
    node_after,
    pod_on_node,
    pod_started_s,
    unresolvable,
)

GIB = 1024
NEED = Need(60 * GIB)
META = {"uid": "u", "namespace": "a", "name": "x"}


def room(index: int, free: int, *holders: tuple[str, int | None], total: int | None = 81559,
         healthy: bool = True) -> GpuRoom:  # fmt: skip
    return GpuRoom(index, free, healthy, total, tuple(holders))


def pods(*spec: tuple[str, int]) -> list[PodOnNode]:
    return [PodOnNode(f"uid-{k.split('/')[1]}", k, p) for k, p in spec]


def choose(gpus: list[GpuRoom], on_node: list[PodOnNode], need: Need = NEED, **kw: Any) -> Choice:
    return choose_victims(Preemptor(need, 1000, "uid-preemptor"), gpus, on_node, **kw)


# ----------------------------------------------------------------- pod documents ----

REFUSED = [
    ("not an object", ["a"], "pod is not an object"),
    ("no namespace (a name)", {"metadata": {"uid": "u", "name": "x"}},
     "pod without metadata.uid, namespace and name"),
    ("no name", {"metadata": {"uid": "u", "namespace": "a"}},
     "pod without metadata.uid, namespace and name"),
    ("a priority that is no number", {"metadata": META, "spec": {"priority": "high"}},
     "spec.priority is not a whole number"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "doc", "message"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_pod_document_is_refused_with_its_reason(case, doc, message):
    with pytest.raises(ValueError) as raised:
        pod_on_node(doc)
    assert str(raised.value) == message, case


@pytest.mark.parametrize(("phase", "going"), [("Failed", True), ("Succeeded", True),
                                              ("Running", False), ("Pending", False)])  # fmt: skip
def test_a_finished_pod_is_going(phase, going):
    doc = {"metadata": META, "spec": {"priority": 5}, "status": {"phase": phase}}
    assert pod_on_node(doc) == PodOnNode("u", "a/x", 5, going)


def test_a_pods_start_time():
    assert pod_started_s({"status": {"startTime": "2026-01-01T00:00:00Z"}}) == 1767225600.0
    assert pod_started_s({"status": {}}) is None
    assert pod_started_s(None) is None


# ------------------------------------------------------------- the node after ----


def test_the_node_after_an_eviction_keeps_each_gpus_fields():
    gpus = [room(0, 70_000, ("a/x", 10_000), total=81559),
            room(1, 1_000, ("a/z", 80_000), total=40_960, healthy=False),
            room(2, 30_000, total=None)]  # fmt: skip
    assert node_after(gpus, {"a/z"}) == NodeGpuState(
        name="", known=True, free_total_mib=30_000,
        gpus=(GpuInfo(0, 0, True, total_mib=81559, assigned=True, assigned_free_mib=70_000),
              GpuInfo(1, 81_000, False, total_mib=40_960), GpuInfo(2, 30_000, True)),
    )  # fmt: skip
    assert node_after(gpus, {"a/x", "a/z"}).gpus[0] == GpuInfo(0, 80_000, True, total_mib=81559)
    assert node_after([room(3, 5, ("a/y", 1), healthy=False)]).gpus == (
        GpuInfo(3, 0, False, total_mib=81559, assigned=True, assigned_free_mib=5),
    )


# --------------------------------------------------------------- choose_victims ----

NAMED = "victim uid-x named by the scheduler is not a lower-priority pod on the node"
CHOICES = [
    ("a named victim of the preemptor's own priority: dropped, the reason whole",
     [room(0, 70_000)], pods(("a/x", 1000)), {"named": ["uid-x"]}, Choice(None, NAMED)),
    ("one priority lower: kept", [room(0, 70_000)], pods(("a/x", 999)), {"named": ["uid-x"]},
     Choice(("uid-x",))),
    ("an unhealthy GPU of unknown size is not a GPU of the need",
     [room(0, 70_000, total=None), room(1, 70_000, total=None, healthy=False)], [],
     {"need": Need(60 * GIB, 2)}, Choice(None, f"fewer than 2 healthy GPU(s) of {60 * GIB} MiB")),
    ("a GPU of unknown size may hold the need", [room(0, 1_000, ("a/x", 70_000), total=None)],
     pods(("a/x", 0)), {}, Choice(("uid-x",))),
    ("a GPU exactly the need's size holds it", [room(0, 1_000, ("a/x", 60 * GIB), total=60 * GIB)],
     pods(("a/x", 0)), {}, Choice(("uid-x",))),
    ("evicting everyone frees too little: the reason whole", [room(0, 1_000, ("a/x", 10_000))],
     pods(("a/x", 0)), {},
     Choice(None, "evicting every lower-priority pod frees too little GPU memory")),
]  # fmt: skip


@pytest.mark.parametrize(("case", "gpus", "on_node", "kw", "choice"), CHOICES,
                         ids=[c[0] for c in CHOICES])  # fmt: skip
def test_each_node_gets_its_whole_choice(case, gpus, on_node, kw, choice):
    assert choose(gpus, on_node, **kw) == choice, case


def test_a_pool_of_exactly_the_exact_search_is_searched_for_the_fewest():
    """``EXACT_POOL`` pods are still searched: the one priority-500 pod goes, where the
    reprieve (over ``EXACT_POOL``) would evict the two priority-100 pods sharing GPU 0."""
    n = EXACT_POOL - 3
    filler = [room(2 + i, 1_000, (f"a/f{i}", 10_000)) for i in range(n)]
    gpus = [room(0, 10_000, ("a/lo1", 35_000), ("a/lo2", 35_000)),
            room(1, 1_000, ("a/mid", 79_000)), *filler]  # fmt: skip
    on_node = pods(("a/lo1", 100), ("a/lo2", 100), ("a/mid", 500),
                   *((f"a/f{i}", 10) for i in range(n)))  # fmt: skip
    assert choose(gpus, on_node) == Choice(("uid-mid",))


# ---------------------------------------------------------------- unresolvable ----

UNIT = 1024
NO_ROOM = reason_text(Reason.NO_ROOM, wanted="w", prefix="p")
SLICES = Need(0, 1, slices=(5,))
MIG = Need(5000, 2, exclusive=True, profile="1g.10gb")


def shared(*healthy: bool) -> NodeGpuState:
    return NodeGpuState(name="n", known=True, share_unit_mib=UNIT,
                        shared=tuple(GpuInfo(i, 80_000, h, units_left=20)
                                     for i, h in enumerate(healthy)))  # fmt: skip


def mig(*devices: tuple[str, bool, int | None]) -> NodeGpuState:
    return NodeGpuState(name="n", known=True, mig=tuple(
        GpuInfo(0, 0, healthy, total_mib=total, profile=profile, mig_index=k)
        for k, (profile, healthy, total) in enumerate(devices)))  # fmt: skip


OK_MIG = ("1g.10gb", True, 10_240)
HOPELESS = [
    ("slices: a healthy shared GPU may free", SLICES, shared(False, True), False),
    ("slices: no healthy shared GPU", SLICES, shared(False), True),
    ("slices: not in the cache", SLICES, None, True),
    ("whole GPUs: not in the cache, it may", NEED, None, False),
    ("a GPU exactly the need's size", Need(40_960), NodeGpuState(
        name="n", known=True, gpus=(GpuInfo(0, 0, True, total_mib=40_960),)), False),
    ("MIG: enough devices of the profile", MIG, mig(OK_MIG, OK_MIG), False),
    ("MIG: one device short", MIG, mig(OK_MIG), True),
    ("MIG: another profile's devices never count", MIG, mig(OK_MIG, ("2g.20gb", True, 20_480)),
     True),
    ("MIG: an unhealthy device never counts", MIG, mig(OK_MIG, ("1g.10gb", False, 10_240)), True),
    ("MIG: an unhealthy device of another profile", MIG,
     mig(OK_MIG, ("2g.20gb", False, 20_480)), True),
    ("MIG: a device smaller than the need never counts", MIG, mig(OK_MIG, ("1g.10gb", True, 4000)),
     True),
    ("MIG: a device exactly the need's size", MIG, mig(OK_MIG, ("1g.10gb", True, 5000)), False),
    ("MIG: a device of unknown size may", MIG, mig(OK_MIG, ("1g.10gb", True, None)), False),
]  # fmt: skip


@pytest.mark.parametrize(("case", "need", "state", "hopeless"), HOPELESS,
                         ids=[h[0] for h in HOPELESS])  # fmt: skip
def test_no_room_that_eviction_cannot_help(case, need, state, hopeless):
    got = unresolvable(need, {"n": NO_ROOM}, {"n": state}.get)
    assert got == ({"n": NO_ROOM} if hopeless else {}), case


def test_one_mig_device_of_the_profile_is_one():
    one = replace(MIG, count=1)
    assert unresolvable(one, {"n": NO_ROOM}, {"n": mig(OK_MIG)}.get) == {}
    assert unresolvable(replace(MIG, count=3), {"n": NO_ROOM}, {"n": mig(OK_MIG, OK_MIG)}.get) == {
        "n": NO_ROOM
    }

"""One rule for "fits on a GPU" on both sides of the seam (issue 30 item 3): pure, table-driven.

The agent renders a node with its PodResources attribution (``render(..., attribution=...)``:
the kubelet's holders of each whole GPU and of each shared GPU's units); the extender parses it
(``parse_node``) and judges (``rules.judge``); the device plugin's rules (``deviceplugin.slices``,
``deviceplugin.allocation.preferred``) decide on the same GPUs. The rules are
``core.model.sharing.gpu_room_mib`` and ``core.model.sharing.device_order``.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from omaticaya_py.core.model.sharing import device_order, gpu_room_mib, unit_ids
from omaticaya_py.core.rules.attribution import ContainerDevices, GpuAttribution
from omaticaya_py.core.schema import parse_node
from omaticaya_py.deviceplugin.allocation import DeviceState, preferred
from omaticaya_py.deviceplugin.slices import Room, choose
from omaticaya_py.scheduler.fit import choose_gpus
from omaticaya_py.scheduler.inflight import Placement, adjust, pending
from omaticaya_py.scheduler.need import Need, parse_need, pod_need
from tests import seam
from tests.extender import judge_state
from tests.helpers import READ_AT, evaluate, gpu, settings, snapshot

NOW = READ_AT.timestamp() + 5
U = 1024
F = 79 * U  # free MiB of an idle GPU, on the labels' 1 GiB step
H100_TOTAL = 81559  # 79 units of 1 GiB
SLICES = "omaticaya.io/gpu-memory"
GPU = "nvidia.com/gpu"


def uuid(index: int) -> str:
    return f"GPU-{index:08d}-7fda-b7ae-a94e-630097a14ca4"


def holder(pod: str, resource: str, *ids: str, container: str = "c") -> ContainerDevices:
    return ContainerDevices("ns", pod, container, resource, tuple(ids))


def node(free_mib: list[int], *, shared: str = "none",
         held: dict[int, list[ContainerDevices]] | None = None) -> Any:  # fmt: skip
    """A node as the agent renders it, each GPU ``free_mib`` free of ``H100_TOTAL``, with the
    kubelet's holders ``held`` (GPU index -> holders) as its attribution."""
    readings = [gpu(i, memory_free_mib=f, memory_total_mib=H100_TOTAL,
                    memory_used_mib=H100_TOTAL - f) for i, f in enumerate(free_mib)]  # fmt: skip
    attribution = {
        uuid(i): GpuAttribution(uuid(i), holders=tuple((held or {}).get(i, ())))
        for i in range(len(free_mib))
    }
    snap = snapshot(*readings, read_at=READ_AT)
    health, _ = evaluate(snap, settings(shared_gpus=shared))
    from omaticaya_py.core.publish.render import render

    desired = render(snap, health, settings(shared_gpus=shared), attribution=attribution)
    return parse_node("n", desired.labels, desired.annotations)


def units(index: int, first: int, count: int) -> list[str]:
    return unit_ids(uuid(index), H100_TOTAL // U)[first:first + count]


def whole_pod(mib: int, gpus: int = 0, count: str | None = None) -> dict[str, Any]:
    ann = {"omaticaya.io/gpu-memory-mib": str(mib)}
    if count is not None:
        ann["omaticaya.io/gpu-count"] = count
    limits = {GPU: str(gpus)} if gpus else {}
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": ann},
            "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}  # fmt: skip


def fits(state: Any, need: Need, inflight: tuple[Placement, ...] = ()) -> bool:
    return judge_state(state, need, now=NOW, ttl_s=60, grace_s=10, inflight=inflight).ok


# ------------------------------------------------------------------------- the rules ----

ROOMS = [
    ("the units bound", 80000, 29, 29 * U),
    ("the live memory bounds", 10000, 79, 10000),
    ("no unit left", 80000, 0, 0),
    ("more units held than served", 80000, -3, 0),
    ("free memory below zero", -5, 10, 0),
]


@pytest.mark.parametrize(("free", "left", "want"), [r[1:] for r in ROOMS], ids=[r[0] for r in ROOMS])
def test_gpu_room_mib(free: int, left: int, want: int) -> None:
    assert gpu_room_mib(free, left, U) == want


def test_the_plugin_room_is_the_shared_rule() -> None:
    room = Room("g", 0, True, 80000, tuple(units(0, 0, 29)))
    assert room.room_mib(U) == gpu_room_mib(80000, 29, U) == 29 * U


def test_device_order_most_free_healthy_first() -> None:
    gpus = [(True, 50000, 0), (True, 70000, 1), (False, 80000, 2), (True, None, 3), (True, 70000, 4)]
    assert [g[2] for g in sorted(gpus, key=lambda g: device_order(*g))] == [1, 4, 0, 3, 2]


# ------------------------------------------------------------ the extender's reading ----


def test_a_shared_gpu_room_is_its_units_left() -> None:
    """Four 50-unit slices held on four shared GPUs leave 29 units on each (the issue's case)."""
    held = {i: [holder(f"s{i}", SLICES, *units(i, 0, 50))] for i in range(4)}
    state = node([F] * 4, shared="all", held=held)
    assert [(g.free_mib, g.units_left, g.room_mib(U)) for g in state.shared] == [(F, 29, 29 * U)] * 4
    assert state.slices_held == (("ns/s0", 0, 50), ("ns/s1", 1, 50), ("ns/s2", 2, 50),
                                 ("ns/s3", 3, 50))  # fmt: skip
    assert state.holders == {"ns/s0", "ns/s1", "ns/s2", "ns/s3"}


def test_a_whole_gpu_with_a_holder_is_assigned() -> None:
    state = node([F, F], held={0: [holder("w", GPU, uuid(0))]})
    assert [(g.assigned, g.free_mib) for g in state.gpus] == [(True, 0), (False, F)]
    assert state.holders == {"ns/w"}


def test_without_attribution_only_the_live_memory_counts() -> None:
    state = node([F, F])
    assert [g.free_mib for g in state.gpus] == [F, F] and not state.holders


SEAM = [
    # (name, free per GPU, shared, holders, need, extender passes)
    ("40 units where 29 are left on each of 4 GPUs", [F] * 4, "all",
     {i: [holder(f"s{i}", SLICES, *units(i, 0, 50))] for i in range(4)}, Need(0, slices=(40,)),
     False),
    ("29 units where 29 are left", [F] * 4, "all",
     {i: [holder(f"s{i}", SLICES, *units(i, 0, 50))] for i in range(4)}, Need(0, slices=(29,)),
     True),
    ("two 30-unit containers, one GPU with 59 left and one with 29", [F] * 2, "all",
     {0: [holder("a", SLICES, *units(0, 0, 20))], 1: [holder("b", SLICES, *units(1, 0, 50))]},
     Need(0, slices=(30, 30)), False),
    ("60 GiB on a node whose free GPU is assigned", [F, 49 * U], "none",
     {0: [holder("w", GPU, uuid(0))]}, Need(60 * 1024), False),
    ("40 GiB on the one GPU left", [F, 49 * U], "none",
     {0: [holder("w", GPU, uuid(0))]}, Need(40 * 1024), True),
]  # fmt: skip


@pytest.mark.parametrize(("free", "shared", "held", "need", "ok"), [r[1:] for r in SEAM],
                         ids=[r[0] for r in SEAM])  # fmt: skip
def test_the_extender_judges_by_the_kubelet_books(
    free: list[int], shared: str, held: dict[int, list[ContainerDevices]], need: Need, ok: bool
) -> None:
    assert fits(node(free, shared=shared, held=held), need) is ok


# ------------------------------------------------- whole devices: the plugin's choice ----


def test_parse_need_whole_devices() -> None:
    assert parse_need(whole_pod(30000, 1)) == Need(30000, 1, exclusive=True)
    assert parse_need(whole_pod(30000, 2)) == Need(30000, 2, exclusive=True)
    assert parse_need(whole_pod(30000, 2, count="2")) == Need(30000, 2, exclusive=True)
    assert parse_need(whole_pod(30000)) == Need(30000, 1)
    bad = parse_need(whole_pod(30000, 2, count="1"))
    assert bad is not None and bad.error and "differs" in bad.error
    other = parse_need(whole_pod(30000, 1), gpu_resource="example.com/gpu")
    assert other == Need(30000, 1)
    for raw in ("1.5", "-1", "one"):
        pod = whole_pod(30000)
        pod["spec"]["containers"][0]["resources"]["limits"][GPU] = raw
        got = parse_need(pod)
        assert got is not None and got.error and GPU in got.error


def gpu_pod(limits: dict[str, str], ann: dict[str, str] | None = None,
            requests: bool = False, sidecar: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A pod of one app container asking ``limits`` (as ``requests`` when ``requests``), and
    a sidecar asking ``sidecar``."""
    res = {"requests" if requests else "limits": limits}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": res}]}
    if sidecar is not None:
        spec["initContainers"] = [{"name": "s", "restartPolicy": "Always",
                                   "resources": {"limits": sidecar}}]  # fmt: skip
    return {"metadata": {"name": "p", "namespace": "ns", "annotations": ann or {}}, "spec": spec}


MIG = "nvidia.com/mig-1g.10gb"
POD_NEEDS = [
    # (case, pod, gpu resource, pod_need, parse_need)
    ("nvidia.com/gpu alone: its GPUs, no memory", gpu_pod({GPU: "1"}), GPU,
     Need(0, 1, exclusive=True), None),
    ("by requests too", gpu_pod({GPU: "2"}, requests=True), GPU, Need(0, 2, exclusive=True), None),
    ("a sidecar's GPU beside the app's", gpu_pod({GPU: "1"}, sidecar={GPU: "2"}), GPU,
     Need(0, 3, exclusive=True), None),
    ("the renamed resource", gpu_pod({"example.com/gpu": "1"}), "example.com/gpu",
     Need(0, 1, exclusive=True), None),
    ("another resource's GPUs are not ours", gpu_pod({"example.com/gpu": "1"}), GPU, None, None),
    ("MIG devices of one profile alone", gpu_pod({MIG: "2"}), GPU,
     Need(0, 2, exclusive=True, profile="1g.10gb"), None),
    ("two MIG profiles: kube-scheduler's count decides", gpu_pod({MIG: "1", "nvidia.com/mig-2g.20gb": "1"}),
     GPU, None, None),
    ("no GPU asked", gpu_pod({"cpu": "1"}), GPU, None, None),
    ("the annotation: parse_need's need", gpu_pod({GPU: "1"}, {"omaticaya.io/gpu-memory-mib": "30Gi"}),
     GPU, Need(30720, 1, exclusive=True), Need(30720, 1, exclusive=True)),
]  # fmt: skip


@pytest.mark.parametrize(("pod", "resource", "want", "annotated"), [c[1:] for c in POD_NEEDS],
                         ids=[c[0] for c in POD_NEEDS])  # fmt: skip
def test_every_gpu_pod_has_a_need(pod: dict[str, Any], resource: str, want: Need | None,
                                  annotated: Need | None) -> None:  # fmt: skip
    """Issue 48 item 2: a pod asking for whole devices without the memory annotation is judged
    and counted in flight for its devices (``pod_need``); ``parse_need`` (the annotation's
    need, which preemption reads) is unchanged."""
    assert pod_need(pod, gpu_resource=resource) == want
    assert parse_need(pod, gpu_resource=resource) == annotated


def test_a_malformed_device_count_without_the_annotation_names_the_container() -> None:
    got = pod_need(gpu_pod({GPU: "1.5"}))
    assert got is not None and got.error == (
        "pod container 'c' asks for nvidia.com/gpu='1.5': expected a whole number of GPUs")


def test_a_whole_gpu_given_with_no_memory_asked_is_shown_by_its_holder_alone() -> None:
    """A pod of ``nvidia.com/gpu`` alone holds GPU 0 and uses no memory: a reading taken after
    it started with no holder published does not show it (a drop of nothing shows nothing;
    before the fix it stopped counting, and the next pod was predicted on GPU 0); the reading
    naming it the holder does."""
    p = Placement("ns/a", "u", "n", 0, 1, placed_at=NOW - 2, started_at=NOW - 15, gpus=(0,),
                  exclusive=True, baselines=(F,))  # fmt: skip
    assert pending([p], node([F, F]), now=NOW, settle_s=60) == [p]
    assert [g.free_mib for g in adjust(node([F, F]), [p]).gpus] == [0, F]
    assert pending([p], node([F, F], held={0: [holder("a", GPU, uuid(0))]}), now=NOW,
                   settle_s=60) == []  # fmt: skip


def test_the_extender_reserves_the_gpu_the_plugin_hands_out() -> None:
    """A 10 GiB whole-device pod on GPUs with 80 and 40 GiB free: the plugin hands out GPU 0
    (most free); the extender reserves GPU 0 (binpack would pick GPU 1) and takes it whole."""
    state = node([F, 40 * U])
    gpus = choose_gpus(state, Need(10240, 1, exclusive=True), "binpack")
    states = {uuid(i): DeviceState(uuid(i), i, True, (), f) for i, f in enumerate([F, 40 * U])}
    assert [uuid(i) for i in gpus] == preferred(states, list(states), [], 1)
    assert choose_gpus(state, Need(10240, 1), "binpack") == (1,)  # annotation only: binpack
    p = Placement("ns/a", "u", "n", 10240, 1, placed_at=NOW, gpus=gpus, exclusive=True)
    assert [g.free_mib for g in adjust(state, [p]).gpus] == [0, 40 * U]
    # the next 30 GiB whole-device pod gets GPU 1 on both sides
    assert not fits(state, Need(50000, exclusive=True), (p,))
    assert fits(state, Need(30000, exclusive=True), (p,))


def test_a_placement_shown_as_a_holder_stops_counting() -> None:
    held = node([F, F], held={0: [holder("a", GPU, uuid(0))]})
    p = Placement("ns/a", "u", "n", 10240, 1, placed_at=NOW - 2, started_at=NOW - 15,
                  gpus=(0,), exclusive=True)  # fmt: skip
    assert pending([p], held, now=NOW, settle_s=60) == []
    # a reading from before the pod started does not show it
    early = Placement("ns/a", "u", "n", 10240, 1, placed_at=NOW - 2, started_at=NOW + 1,
                      gpus=(0,), exclusive=True)  # fmt: skip
    assert pending([early], held, now=NOW, settle_s=60) == [early]
    # another pod's placement still counts, and the shown one's memory with it
    q = Placement("ns/b", "v", "n", 10240, 1, placed_at=NOW - 1, started_at=NOW - 15,
                  gpus=(1,), exclusive=True)  # fmt: skip
    assert pending([p, q], held, now=NOW, settle_s=60) == [q]


def test_a_slice_shown_as_a_holder_stops_counting_once() -> None:
    state = node([F], shared="all", held={0: [holder("a", SLICES, *units(0, 0, 20))]})
    p = Placement("ns/a", "u", "n", 0, 0, placed_at=NOW - 2, started_at=NOW - 15,
                  gpus=(0,), slices=(20,))  # fmt: skip
    # its units are in the kubelet's books; its memory is not in use yet: it counts there only
    assert [(q.in_memory, q.in_units) for q in pending([p], state, now=NOW, settle_s=60)] == [
        (True, False)]
    assert state.shared[0].room_mib(U) == 59 * U  # the units count once: in the reading
    left = adjust(state, pending([p], state, now=NOW, settle_s=60))
    assert (left.shared[0].free_mib, left.shared[0].units_left) == (F - 20 * U, 59)
    assert choose([Room(uuid(0), 0, True, 80000, tuple(units(0, 20, 59)))], 59, U) is not None


# ------------------------------------------------- the property: no pod fails at the seam ----


POD = st.one_of(
    st.tuples(st.just("whole"), st.integers(1, 80), st.integers(1, 2)),
    st.tuples(st.just("whole"), st.none(), st.integers(1, 2)),  # nvidia.com/gpu alone
    st.tuples(st.just("slice"), st.lists(st.integers(1, 80), min_size=1, max_size=3)),
)


def pods_of(kinds: list[Any]) -> list[dict[str, Any]]:
    out = []
    for i, k in enumerate(kinds):
        if k[0] == "whole":
            out.append(seam.whole_pod(f"w{i}", None if k[1] is None else k[1] * 1024, k[2]))
        else:
            out.append(seam.slice_pod(f"s{i}", *k[1]))
    return out


@hsettings(max_examples=60, deadline=None)
@given(st.lists(POD, min_size=1, max_size=14))
def test_no_pod_the_extender_passes_is_refused_by_the_device_plugin(kinds: list[Any]) -> None:
    """Random mixes of whole-GPU and slice pods arriving on the 8-GPU trace (GPUs 0-3 shared):
    every pod the extender passes is given what it asked for by the device plugin there."""
    node = seam.Seam()
    for pod in pods_of(kinds):
        node.arrive(pod)
    assert "refused" not in node.outcomes, list(zip(kinds, node.outcomes, strict=True))


def test_a_mix_at_the_seam() -> None:
    """On the trace's shared GPUs (free 81,079 / 50,359 / 70,839 / 9,399 MiB, 79 units each):
    50 units go to GPU 2 then GPU 0 (best fit), a third 50 has no GPU with the memory (Pending),
    9 fit GPU 3, 40 GPU 1, 29 the 29 units left on GPU 0. Whole GPUs (81,079 / 34,999 / 75,959 /
    3,255): 60 GiB goes to GPU 4, then GPU 6; a third has none (Pending, where the live memory
    alone, GPU 4 still reading 81,079 free, would have passed it)."""
    node = seam.Seam()
    got = [node.arrive(p) for p in (
        *(seam.slice_pod(f"s{i}", 50) for i in range(3)), seam.slice_pod("s3", 9),
        seam.slice_pod("s4", 40), seam.slice_pod("s5", 29),
        *(seam.whole_pod(f"w{i}", 60 * 1024) for i in range(3)),
    )]  # fmt: skip
    a, p = "admitted", "pending"
    assert got == [a, a, p, a, a, a, a, a, p]
    on = {h.pod: uuid for uuid, hs in node.holders.items() for h in hs}
    assert [int(on[k][4:12]) for k in ("s0", "s1", "s3", "s4", "s5", "w0", "w1")] == [2, 0, 3, 1, 0, 4, 6]

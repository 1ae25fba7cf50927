# ruff: noqa: F811  (test arguments named after the imported fixtures)
"""GPU sharing by memory in the device plugin (issue 25, items 1 and 2): the rules as tables, and
the plugins over real gRPC channels (the fake kubelet of test_device_plugin.py), fed by a real
``Agent`` replaying the 8-GPU trace with GPUs 0-3 shared.

``tests/data/multi-gpu-trace.json``, every GPU an H100 80GB (81,559 MiB: 79 units of 1,024 MiB),
free memory by the live reading: GPU 0 81,079 MiB (idle), GPU 1 50,359 (30 GiB held by a process
Kubernetes does not know), GPU 2 70,839, GPU 3 9,399 (72 GiB out of band), GPU 4 81,079,
GPU 5 34,999, GPU 6 75,959, GPU 7 3,255. ``write_sharing_trace`` derives from it a trace of
four samples: steady (t=0), GPU 2 remap-pending (t=1), steady again (t=2), 60 GiB out of band
on GPU 0 (t=3).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.state import SnapshotCache
from omaticaya_py.core.allocation.mps import ClientSpec
from omaticaya_py.core.model.sharing import SharedGpus
from omaticaya_py.deviceplugin import DevicePluginSet
from omaticaya_py.deviceplugin.allocation import STALE_READING, DeviceState, trace_slices
from omaticaya_py.deviceplugin.service import CacheFeed
from omaticaya_py.deviceplugin.slicer import KubeletView, Slicer, SliceRefused
from omaticaya_py.deviceplugin.slices import (
    LIMIT_ENV,
    MPS_LIMIT_ENV,
    Room,
    Slice,
    choose,
    preferred_units,
    released,
    slice_envs,
    still_pending,
    superseded,
)
from omaticaya_py.deviceplugin.v1beta1 import api_pb2
from omaticaya_py.sources.replay import TraceReader
from tests.deviceplugin.device_plugin_sharing_support import (  # the names moved out, for this file's tests
    GPU_RESOURCE,  # noqa: F401
    OUT_OF_BAND_MIB,  # noqa: F401
    SHARED_RESOURCE,  # noqa: F401
    UNITS,  # noqa: F401
    UUID,  # noqa: F401
    Rig,  # noqa: F401
    s,  # noqa: F401
    units_of,  # noqa: F401
    write_sharing_trace,  # noqa: F401
)
from tests.deviceplugin.device_plugin_support import FakeKubelet, folder  # noqa: F401
from tests.helpers import MIG_MIXED_TRACE, MULTI_TRACE, Clock, settings

ROOT = Path(__file__).resolve().parents[2]
MIB = 1024








# -- the rules, as tables ------------------------------------------------------------------


def room(index: int, free_mib: int | None, units: int = UNITS, healthy: bool = True) -> Room:
    return Room(UUID[index], index, healthy, free_mib, tuple(units_of(index, units)))


ROOMS = [room(0, 81079), room(1, 50359), room(2, 70839), room(3, 9399)]


@pytest.mark.parametrize(
    ("rooms", "size", "policy", "expected"),
    [
        pytest.param(ROOMS, 30, "binpack", 1, id="binpack-least-live-room-that-fits"),
        pytest.param(ROOMS, 30, "spread", 0, id="spread-most-room"),
        pytest.param(ROOMS, 60, "binpack", 2, id="big-slice-skips-out-of-band-gpu-1"),
        pytest.param(ROOMS, 9, "binpack", 3, id="small-slice-fits-gpu-3"),
        pytest.param(ROOMS, 10, "binpack", 1, id="10-gib-does-not-fit-gpu-3-live"),
        pytest.param([room(0, 81079, units=20), room(1, 50359)], 30, "binpack", 1,
                     id="kubelet-units-rule-out-gpu-0"),
        pytest.param([room(0, 81079, units=40), room(2, 70839)], 30, "binpack", 0,
                     id="room-is-the-least-of-both-books"),
        pytest.param([room(0, 81079, healthy=False), room(2, 70839)], 30, "spread", 2,
                     id="unhealthy-never"),
        pytest.param([room(0, None), room(2, 70839)], 30, "spread", 2, id="unknown-free-never"),
        pytest.param([room(0, 81079), room(4, 81079)], 30, "binpack", 0, id="tie-lowest-index"),
        pytest.param([room(3, 9399), room(1, 20000)], 30, "binpack", None, id="none-fits"),
    ],
)
def test_choose(rooms, size, policy, expected) -> None:
    got = choose(rooms, size, MIB, policy)
    assert (got.index if got else None) == expected


@pytest.mark.parametrize(
    ("rooms", "must", "size", "expected"),
    [
        pytest.param(ROOMS, [], 30, units_of(1, 30), id="one-gpu-lowest-units"),
        pytest.param(ROOMS, [units_of(3)[5]], 3, [units_of(3)[5], *units_of(3, 2)],
                     id="must-include-its-gpu-is-the-one"),
        pytest.param([room(0, 81079, units=0), room(3, 9399)], [], 30, units_of(3, 30),
                     id="no-live-room-anywhere-one-gpu-by-units-allocate-refuses"),
        pytest.param([room(0, 81079, units=20), room(1, 81079, units=20)], [], 30, [],
                     id="no-single-gpu-has-the-units"),
    ],
)
def test_preferred_units(rooms, must, size, expected) -> None:
    assert preferred_units(rooms, must, size, MIB) == expected




@pytest.mark.parametrize(
    ("slices", "free_now", "now_s", "expected"),
    [
        pytest.param([s(30720, 0, 50359)], 50359, 10, [0], id="not-in-use-yet"),
        pytest.param([s(30720, 0, 50359)], 50359 - 30720, 10, [], id="in-use-shown"),
        pytest.param([s(30720, 0, 50359)], 50359 - 20000, 10, [0], id="part-shown-counts-whole"),
        pytest.param([s(30720, 0, 50359)], 50359, 60, [], id="settled-by-age"),
        pytest.param([s(30720, 0, 50359)], None, 10, [0], id="free-unknown-keeps-it"),
        pytest.param([s(10240, 0, 70839), s(10240, 1, 70839)], 70839 - 10240, 10, [1],
                     id="first-of-two-shown"),
        pytest.param([s(10240, 0, 70839), s(10240, 1, 70839)], 70839 - 20480, 10, [],
                     id="both-shown"),
        pytest.param([s(10240, 0, 70839), s(20480, 1, 70839)], 70839 - 20480, 10, [1],
                     id="a-drop-the-size-of-the-second-alone-is-taken-as-the-first"),
        # core.allocation.shown.still_counting (the extender's rule too): once one slice is not shown
        # (no baseline), no later one is, though the drop from its baseline covers both
        pytest.param([s(10240, 0, None), s(10240, 1, 70839)], 70839 - 20480, 10, [0, 1],
                     id="no-later-slice-shows-after-one-without-baseline"),
    ],
)
def test_still_pending(slices, free_now, now_s, expected) -> None:
    kept = still_pending(slices, free_now, now_s, settle_s=60)
    assert [k.at_s for k in kept] == expected


def test_slice_envs() -> None:
    assert slice_envs(30, 1024) == {MPS_LIMIT_ENV: "0=30720M", LIMIT_ENV: "30720"}
    assert slice_envs(3, 512) == {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1536M", "OMATICAYA_GPU_MEMORY_LIMIT_MIB": "1536"
    }


def test_slicer_forgets_a_slice_once_the_reading_shows_it_or_it_settles() -> None:
    clock = Clock(100.0)
    slicer = Slicer(MIB, settle_s=60, clock=clock)
    gpu = DeviceState(UUID[0], 0, True, free_mib=81079)
    assert slicer.allocate(units_of(0, 30), [gpu]) == (UUID[0], ClientSpec(slice_envs(30, MIB), ()))
    assert slicer.pending_mib([gpu]) == {UUID[0]: 30720}
    # the same units again (an app container reusing its init container's): replaced, not added
    slicer.allocate(units_of(0, 30), [gpu])
    assert slicer.pending_mib([gpu]) == {UUID[0]: 30720}
    used = DeviceState(UUID[0], 0, True, free_mib=81079 - 30720)
    assert slicer.pending_mib([used]) == {UUID[0]: 0}
    assert UUID[0] not in slicer.slices
    slicer.allocate(units_of(0, 10, 30), [used])
    clock.t += 59.9
    assert slicer.pending_mib([used]) == {UUID[0]: 10240}
    clock.t += 0.2
    assert slicer.pending_mib([used]) == {UUID[0]: 0}


def held(start: int, n: int, at_s: float, gpu: int = 0) -> Slice:
    return Slice(frozenset(units_of(gpu, n, start)), UUID[gpu], n * MIB, at_s, 25600)


@pytest.mark.parametrize(
    ("slices", "units", "expected"),
    [
        pytest.param([held(0, 20, 0)], units_of(0, 10), [0], id="subset-init-units-reused"),
        pytest.param([held(0, 20, 0)], units_of(0, 20), [0], id="same-units"),
        pytest.param([held(0, 20, 0)], units_of(0, 20, 10), [0], id="overlap-plus-others"),
        pytest.param([held(0, 20, 0)], units_of(0, 10, 20), [], id="disjoint-still-counts"),
        pytest.param([held(0, 10, 0), held(10, 10, 1)], units_of(0, 5), [0],
                     id="only-the-overlapping-one"),
        pytest.param([held(0, 10, 0), held(10, 10, 1)], units_of(0, 4, 8), [0, 1],
                     id="straddling-two"),
        pytest.param([held(0, 20, 0)], [], [], id="no-units"),
    ],
)
def test_superseded(slices, units, expected) -> None:
    assert [s.at_s for s in superseded(slices, units)] == expected


#: a step of a pod's containers on GPU 0: (first unit, units, allowed, GiB pending after it)
@pytest.mark.parametrize(
    ("free_gib", "steps"),
    [
        # issue 30: was refused (20 GiB of the init container still counted), and where it
        # fitted 30 GiB counted against the neighbours
        pytest.param(25, [(0, 20, True, 20), (0, 10, True, 10)], id="init-20-app-10-fits-25"),
        pytest.param(40, [(0, 20, True, 20), (0, 10, True, 10)], id="init-20-app-10-counts-10"),
        pytest.param(25, [(0, 20, True, 20), (0, 15, True, 15), (0, 10, True, 10)],
                     id="two-inits-in-sequence-then-app"),
        pytest.param(25, [(0, 20, True, 20), (10, 20, True, 20)], id="app-reuses-some-adds-others"),
        pytest.param(25, [(0, 20, True, 20), (20, 10, False, 20)], id="disjoint-app-refused"),
        pytest.param(40, [(0, 20, True, 20), (20, 10, True, 30)], id="disjoint-app-both-count"),
        pytest.param(40, [(0, 10, True, 10), (10, 10, True, 20), (0, 5, True, 15)],
                     id="only-the-overlapping-slice-goes"),
        pytest.param(25, [(0, 20, True, 20), (0, 20, True, 20)], id="same-units-again"),
    ],
)
def test_slicer_an_allocation_reusing_units_supersedes_their_slice(free_gib, steps) -> None:
    """An init container's units, reused by the pod's next init container or app container (the
    kubelet's reusable devices), count once: its slice is over (issue 30)."""
    slicer = Slicer(MIB, settle_s=60, clock=Clock(100.0))
    gpu = DeviceState(UUID[0], 0, True, free_mib=free_gib * MIB)  # the reading never shows them
    other = DeviceState(UUID[1], 1, True, free_mib=81079)
    slicer.allocate(units_of(1, 5), [other])
    got = []
    for start, n, _, _ in steps:
        try:
            slicer.allocate(units_of(0, n, start), [gpu, other])
            allowed = True
        except SliceRefused as e:
            assert e.code == "FAILED_PRECONDITION"
            allowed = False
        got.append((start, n, allowed, slicer.pending_mib([gpu])[UUID[0]] // MIB))
    assert got == steps
    assert slicer.pending_mib([other]) == {UUID[1]: 5 * MIB}


@pytest.mark.parametrize(
    ("held_units", "listed_at_s", "expected"),
    [
        pytest.param(units_of(0, 20), 12.0, [1.0], id="listed-still-held"),
        pytest.param(units_of(0, 5), 12.0, [1.0], id="some-units-listed"),
        pytest.param([], 11.0, [], id="not-listed-after-it-was-handed-out: gone"),
        pytest.param(units_of(0, 10, 40), 12.0, [], id="only-other-units-listed"),
        pytest.param([], 10.9, [1.0], id="asked-for-too-soon-after-it-was-handed-out"),
    ],
)
def test_released(held_units, listed_at_s, expected) -> None:
    """A slice whose units the kubelet no longer lists, in a list asked for after the slice's
    ``listed_after_s`` (11.0: its Allocate plus the margin), is over (its pod or container
    went): issue 30."""
    slices = [replace(held(0, 20, 1.0), listed_after_s=11.0), held(0, 5, 2.0, gpu=1)]
    got = released(slices, frozenset(held_units), listed_at_s)
    assert [s.at_s for s in got if s.listed_after_s is not None] == expected
    assert got[-1].listed_after_s is None  # not known when it can be released: kept


def test_slicer_forgets_a_slice_the_kubelet_released() -> None:
    """A pod of 20 units deleted before it used its memory: the next reading of PodResources
    no longer lists its units, and the GPU's 25 GiB are free for the next slice at once (the
    extender, which saw the pod go, already counts them free); before the list is read again,
    the slice still counts."""
    agent = Clock(500.0)  # the agent's clock, which the lists are timed on
    listed: list[tuple[frozenset[str], float]] = [(frozenset(), 499.0)]
    slicer = Slicer(MIB, settle_s=60, clock=Clock(100.0),
                    kubelet=KubeletView(lambda: listed[-1], agent))
    gpu = DeviceState(UUID[0], 0, True, free_mib=25 * MIB)
    slicer.allocate(units_of(0, 20), [gpu])  # at 500: a list from before does not name it
    assert slicer.pending_mib([gpu]) == {UUID[0]: 20 * MIB}
    listed.append((frozenset(), 500.5))  # asked for within the margin: may not name it yet
    assert slicer.pending_mib([gpu]) == {UUID[0]: 20 * MIB}
    listed.append((frozenset(units_of(0, 20)), 502.0))  # the pod runs: its units are listed
    with pytest.raises(SliceRefused):
        slicer.allocate(units_of(0, 10, 20), [gpu])
    listed.append((frozenset(), 504.0))  # the pod deleted: the kubelet lists nothing
    assert slicer.pending_mib([gpu]) == {UUID[0]: 0}
    agent.t = 505.0
    slicer.allocate(units_of(0, 10, 20), [gpu])
    assert slicer.pending_mib([gpu]) == {UUID[0]: 10 * MIB}


def test_trace_slices() -> None:
    got = trace_slices(MULTI_TRACE, SharedGpus(indices=frozenset({0, 3})), MIB)
    assert got == [(0, u) for u in units_of(0)] + [(3, u) for u in units_of(3)]
    assert trace_slices(MULTI_TRACE, SharedGpus(), MIB) == []


# -- the plugins over gRPC -----------------------------------------------------------------




@pytest.fixture
def rig(folder: Path) -> Iterator[Rig]:
    rig = Rig(folder)
    rig.at(0.0)
    rig.kubelet.start()
    rig.set.start()
    assert rig.set.wait_registered(10), "the plugins did not register"
    yield rig
    for channel in rig.channels:
        channel.close()
    rig.set.stop(0)
    rig.kubelet.stop()


def all_units(gpus=range(4)) -> list[str]:
    return [u for g in gpus for u in units_of(g)]


def test_trace_units_are_known_before_the_first_reading(folder: Path) -> None:
    rig = Rig(folder)  # no tick yet
    shared = rig.set.shared_plugin
    assert shared is not None and shared.resource_name == SHARED_RESOURCE
    states = shared.devices()
    assert [d.id for d in states] == all_units()
    assert {d.reasons for d in states} == {("no-reading",)}
    assert [d.id for d in rig.set.plugins[None].devices()] == UUID[4:]


def test_two_resources_registered_never_the_same_gpu(rig: Rig) -> None:
    assert sorted(r.resource_name for r in rig.kubelet.requests) == [GPU_RESOURCE, SHARED_RESOURCE]
    assert len({r.endpoint for r in rig.kubelet.requests}) == 2
    whole = next(rig.stub(shared=False).ListAndWatch(api_pb2.Empty(), timeout=10))
    units = next(rig.stub().ListAndWatch(api_pb2.Empty(), timeout=10))
    assert [d.ID for d in whole.devices] == UUID[4:]
    assert [d.ID for d in units.devices] == all_units()  # 4 x 79 = 316
    assert {d.health for d in units.devices} == {"Healthy"}
    # a shared GPU cannot be had whole, a whole GPU's units do not exist
    with pytest.raises(grpc.RpcError) as err:
        rig.allocate([UUID[0]], shared=False)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        rig.allocate(units_of(4, 2))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown devices" in err.value.details()


def test_binpack_two_slices_then_out_of_band_memory_steers_them(rig: Rig) -> None:
    available = all_units()
    given: list[tuple[int, dict[str, str]]] = []
    for _ in range(4):  # four 30 GiB slices, each Allocate'd as the kubelet would
        ids = rig.preferred(available, 30)
        assert len(ids) == 30
        gpu = UUID.index(ids[0].split("::")[0])
        given.append((gpu, rig.allocate(ids)))
        available = [u for u in available if u not in ids]
    # GPU 1 (least live room that fits), then GPU 2 twice: GPU 1 keeps 49 units by the
    # kubelet's books but 19,639 MiB live; then GPU 0. GPU 3 (79 units, 9,399 MiB) never.
    assert [g for g, _ in given] == [1, 2, 2, 0]
    for gpu, envs in given:
        assert envs["NVIDIA_VISIBLE_DEVICES"] == UUID[gpu]
        assert envs[MPS_LIMIT_ENV] == "0=30720M"
        assert envs[LIMIT_ENV] == "30720"
    # a fifth: GPU 0 has 49 units and 50,359 MiB left; GPU 2 19 units: GPU 0
    assert rig.preferred(available, 30)[0].startswith(UUID[0])
    # a 10 GiB slice: GPU 3 has 9,399 MiB live, GPU 2 9,399 MiB after its two slices: GPU 1
    assert rig.preferred(available, 10)[0].startswith(UUID[1])


def test_out_of_band_memory_in_a_later_reading_steers_slices_away(rig: Rig) -> None:
    assert rig.preferred(all_units(), 15)[0].startswith(UUID[1])  # 50,359 MiB: least that fits
    rig.at(3.0)  # 60 GiB out of band on GPU 0: 19,639 MiB free, all 79 units still available
    assert rig.preferred(all_units(), 15)[0].startswith(UUID[0])  # now the least that fits
    assert rig.preferred(all_units(), 30)[0].startswith(UUID[1])  # no longer fits GPU 0
    with pytest.raises(grpc.RpcError) as err:
        rig.allocate(units_of(0, 30))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "19639 MiB free" in err.value.details()


def test_spread(folder: Path) -> None:
    rig = Rig(folder, placement_policy="spread")
    rig.at(0.0)
    gpus = rig.set.shared_plugin.gpu_states()
    first = rig.set.shared_plugin.slicer.preferred(gpus, all_units(), [], 30)
    assert first == units_of(0, 30)


def test_must_include_is_honoured(rig: Rig) -> None:
    must = [units_of(2)[40]]
    got = rig.preferred(all_units(), 4, must)
    assert got == [units_of(2)[40], *units_of(2, 3)]


def test_units_across_two_gpus_are_refused(rig: Rig) -> None:
    with pytest.raises(grpc.RpcError) as err:
        rig.allocate(units_of(0, 2) + units_of(2, 2))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    text = err.value.details()
    assert f"GPU 0 {UUID[0]}" in text and f"GPU 2 {UUID[2]}" in text and "span 2 GPUs" in text
    assert rig.set.shared_plugin.slicer.slices == {}  # nothing counted


def test_a_slice_the_live_memory_cannot_hold_is_refused(rig: Rig) -> None:
    with pytest.raises(grpc.RpcError) as err:
        rig.allocate(units_of(3, 30))  # 79 units free by the kubelet, 9,399 MiB by the GPU
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"GPU 3 {UUID[3]} has 9399 MiB free" in err.value.details()
    assert rig.allocate(units_of(3, 9))[LIMIT_ENV] == "9216"


@pytest.mark.parametrize(
    ("available", "size", "expected"),
    [
        pytest.param(lambda: all_units(), 0, [], id="size-0"),
        pytest.param(lambda: all_units(), 80, [], id="more-than-any-gpu-has"),
        pytest.param(lambda: units_of(0, 3) * 3 + ["GPU-nope::1", "nope", "x" * 10_000], 3,
                     lambda: units_of(0, 3), id="repeated-unknown-and-made-up-ids"),
        pytest.param(lambda: [], 2, [], id="nothing-available"),
    ],
)
def test_odd_preferred_requests_for_units(rig: Rig, available, size, expected) -> None:
    want = expected() if callable(expected) else expected
    assert rig.preferred(available(), size) == want
    assert rig.allocate(units_of(0, 1))[LIMIT_ENV] == "1024"  # still serving


def test_odd_allocate_requests_for_units(rig: Rig) -> None:
    resp = rig.stub().Allocate(
        api_pb2.AllocateRequest(container_requests=[api_pb2.ContainerAllocateRequest()]), timeout=5
    )
    assert dict(resp.container_responses[0].envs) == {}  # no device: an empty answer
    env = rig.allocate(units_of(0, 2) * 2)  # repeated: once each
    assert env[LIMIT_ENV] == "2048"
    with pytest.raises(grpc.RpcError) as err:
        rig.allocate([f"{UUID[0]}::79"])  # GPU 0's units are ::0 to ::78
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_units_follow_their_gpus_health(rig: Rig) -> None:
    stream = rig.stub().ListAndWatch(api_pb2.Empty(), timeout=30)
    assert {d.health for d in next(stream).devices} == {"Healthy"}
    rig.at(1.0)  # GPU 2 remap-pending
    sick = {d.ID for d in next(stream).devices if d.health != "Healthy"}
    assert sick == set(units_of(2))
    reasons = {s.reasons for s in rig.set.shared_plugin.devices() if s.id in sick}
    assert len(reasons) == 1 and reasons != {()}
    assert rig.preferred(all_units(), 30)[0].startswith(UUID[1])
    assert rig.preferred(all_units(), 60)[0].startswith(UUID[0])  # not GPU 2 (70,839 MiB)
    with pytest.raises(grpc.RpcError) as err:
        rig.allocate(units_of(2, 30))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert err.value.details().count(UUID[2]) == 1  # the GPU named once, not per unit
    rig.at(2.0)  # recovered
    assert {d.health for d in next(stream).devices} == {"Healthy"}
    stream.cancel()


def test_a_stale_reading_turns_every_unit_unhealthy(rig: Rig) -> None:
    assert all(s.healthy for s in rig.set.shared_plugin.devices())  # seen now
    rig.clock.t += 10.5
    states = rig.set.shared_plugin.devices()
    assert len(states) == 4 * UNITS and {s.reasons for s in states} == {(STALE_READING,)}
    rig.at(0.0)  # a fresh reading
    assert all(s.healthy for s in rig.set.shared_plugin.devices())


def test_units_appear_with_the_first_reading_without_a_trace(folder: Path) -> None:
    """On NVML no device is known before the first reading: the tick brings the units."""
    s = settings(device_plugin_dir=str(folder), shared_gpus="0-3")
    agent = Agent(s, TraceReader(MULTI_TRACE, at_s=0.0), NodeApi(None, dry_run=True))
    plugins = DevicePluginSet.from_settings(agent, s)
    assert plugins.shared_plugin is not None and plugins.shared_plugin.devices() == []
    agent.tick()
    assert [d.id for d in plugins.shared_plugin.devices()] == all_units()
    assert [d.id for d in plugins.plugins[None].devices()] == UUID[4:]


def test_mig_gpus_are_never_shared(folder: Path) -> None:
    mixed = MIG_MIXED_TRACE  # GPU 0 MIG, GPU 1 whole
    s = settings(trace=str(mixed), device_plugin_dir=str(folder), shared_gpus="all")
    doc = json.loads(mixed.read_text())
    whole_uuid = doc["devices"][1]["uuid"]
    agent = Agent(s, TraceReader(mixed, at_s=0.0), NodeApi(None, dry_run=True))
    plugins = DevicePluginSet.from_settings(agent, s)
    agent.tick()
    units = plugins.shared_plugin.devices()
    assert units and {u.id.split("::")[0] for u in units} == {whole_uuid}
    assert plugins.plugins[None].devices() == []
    assert "1g.10gb" in plugins.plugins


def test_no_shared_gpu_no_shared_plugin(folder: Path) -> None:
    s = settings(trace=str(MULTI_TRACE), device_plugin_dir=str(folder))
    plugins = DevicePluginSet.from_settings(CacheFeed(SnapshotCache()), s)
    assert plugins.shared_plugin is None
    assert [d.id for d in plugins.plugins[None].devices()] == UUID


def test_device_plugin_command_takes_the_sharing_flags() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "omaticaya_py", "device-plugin", "--shared-gpus", "0-3",
         "--share-policy", "pack"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 2
    assert "invalid setting --share-policy='pack'" in proc.stderr  # parsed, then refused
    assert "'binpack' or 'spread'" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_sharing_quick() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sharing.py"), "--quick"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "GetPreferredAllocation" in proc.stdout and "ListAndWatch" in proc.stdout
    assert "requested-only" in proc.stdout


@pytest.mark.parametrize(
    "refused",
    [
        pytest.param(units_of(0, 2) + units_of(1, 2), id="units-across-two-gpus"),
        pytest.param(units_of(4, 2), id="unknown-units"),
    ],
)
def test_a_refused_multi_container_allocate_books_no_slice(rig: Rig, refused: list[str]) -> None:
    """One AllocateRequest of two containers whose second is refused (the kubelet then fails
    the pod's admission: no container runs) takes back the first container's slice: it no
    longer counts against its GPU's live free memory (issue 38: it stayed in the book, and the
    next slice on that GPU was refused for memory nobody held)."""
    slicer = rig.set.shared_plugin.slicer
    assert slicer is not None and slicer.slices == {}
    with pytest.raises(grpc.RpcError) as err:
        rig.stub().Allocate(api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devicesIDs=units_of(2, 30)),
            api_pb2.ContainerAllocateRequest(devicesIDs=refused),
        ]), timeout=5)  # fmt: skip
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert slicer.slices == {}
    # and an init container's slice it superseded counts again
    rig.allocate(units_of(2, 20))
    before = dict(slicer.slices)
    with pytest.raises(grpc.RpcError):
        rig.stub().Allocate(api_pb2.AllocateRequest(container_requests=[
            api_pb2.ContainerAllocateRequest(devicesIDs=units_of(2, 10)),  # reuses its units
            api_pb2.ContainerAllocateRequest(devicesIDs=refused),
        ]), timeout=5)  # fmt: skip
    assert slicer.slices == before

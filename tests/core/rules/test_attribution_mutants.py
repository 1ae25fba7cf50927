"""``core.rules.attribution`` cases that mutation testing (``scripts/mutation``) found no test
pinned: a line that is no cgroup line before the pod's, a pod's containers in order (the pod's
own cgroup first), the pods the name lookups knew, the entry of an unread device, what the
holder uses and what is out-of-band as far as known (a GPU's, or its MIG devices' sum)."""

from __future__ import annotations

import pytest

from omaticaya_py.core.model.snapshot import GpuProcess, MigReading
from omaticaya_py.core.rules.attribution import (
    ContainerDevices,
    GpuAttribution,
    PodMemory,
    PodRef,
    attribute,
    gpu_out_of_band_mib,
    holder_memory_mib,
    out_of_band_mib,
    pod_from_cgroup,
)
from tests.helpers import gpu

UID = "8f2c6a3e-5b1d-4c7e-9a0f-2d4b6c8e1a3f"
CID = "4f1c9e2ab7d3e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e"
DIGIT_CID = "0" + CID[1:]  # sorts before "XXXX" and after ""
GPU0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"  # tests.helpers.gpu(0)'s


def holder(pod: str, *device_ids: str) -> ContainerDevices:
    return ContainerDevices("default", pod, "main", "nvidia.com/gpu", device_ids)


# --- cgroup files -------------------------------------------------------------------------------


def test_a_line_that_is_no_cgroup_line_is_skipped_not_the_end() -> None:
    text = f"garbage without colons\n0::/kubepods/besteffort/pod{UID}/{CID}\n"
    assert pod_from_cgroup(text) == PodRef(UID, CID)


# --- the join -----------------------------------------------------------------------------------


def test_a_pods_own_cgroup_comes_before_its_containers() -> None:
    """Sorted by pod UID, then container ID, a process in no container (``None``) first."""
    out = attribute(
        {GPU0: [GpuProcess(1, 10), GpuProcess(2, 20)]},
        {1: PodRef(UID, DIGIT_CID), 2: PodRef(UID, None)},
        [],
        container_names={DIGIT_CID: "main"},
    )
    assert out[GPU0].pods == (
        PodMemory(UID, None, None, None, None, 20, (2,)),
        PodMemory(UID, DIGIT_CID, None, None, "main", 10, (1,)),
    )


def test_named_pods_are_the_lookups_pods_or_none_without_a_lookup() -> None:
    procs = {GPU0: [GpuProcess(1, 10)]}
    named = attribute(
        procs, {1: PodRef(UID)}, [], pod_names={UID: ("ns", "a"), "other": ("ns", "b")}
    )
    assert named[GPU0].named_pods == frozenset({("ns", "a"), ("ns", "b")})
    assert attribute(procs, {1: PodRef(UID)}, [], pod_names={})[GPU0].named_pods == frozenset()
    assert attribute(procs, {1: PodRef(UID)}, [])[GPU0].named_pods is None


def test_an_unread_device_has_its_own_entry_not_read() -> None:
    a = holder("a", "GPU-unread")
    out = attribute({GPU0: []}, {}, [a], unread=["GPU-unread", GPU0])
    assert list(out) == [GPU0, "GPU-unread"]
    entry = out["GPU-unread"]
    assert entry.device_id == "GPU-unread"
    assert entry.read is False
    assert entry.holders == (a,)
    assert out[GPU0].read is True


# --- what is known ------------------------------------------------------------------------------

POD = PodMemory(UID, CID, "ns", "a", "main", 300, (1,))
POD2 = PodMemory(UID, None, "ns", "a", None, 200, (2,))

HOLDER_CASES = [
    # (id, attribution, the holder's memory)
    ("one holder, every process placed", GpuAttribution(GPU0, (holder("a"),), (POD, POD2)), 500),
    ("one holder, no process", GpuAttribution(GPU0, (holder("a"),)), 0),
    ("no holder", GpuAttribution(GPU0, (), (POD,)), None),
    ("two holders", GpuAttribution(GPU0, (holder("a"), holder("b")), (POD,)), None),
    ("a process not placed", GpuAttribution(GPU0, (holder("a"),), (POD,), unknown_pids=(7,)), None),
    ("not read", GpuAttribution(GPU0, (holder("a"),), read=False), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("att", "mib"), [c[1:] for c in HOLDER_CASES], ids=[c[0] for c in HOLDER_CASES]
)
def test_holder_memory_mib(att, mib) -> None:
    assert holder_memory_mib(att) == mib


OUT_OF_BAND_CASES = [
    # (id, attribution, out-of-band MiB as far as known)
    ("every process placed, none out-of-band", GpuAttribution(GPU0), 0),
    ("every process placed", GpuAttribution(GPU0, out_of_band_memory_mib=5), 5),
    ("some found, some not placed: a lower bound",
     GpuAttribution(GPU0, out_of_band_memory_mib=1, unknown_pids=(7,)), 1),
    ("none found, some not placed", GpuAttribution(GPU0, unknown_pids=(7,)), None),
    ("not read", GpuAttribution(GPU0, out_of_band_memory_mib=5, read=False), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("att", "mib"), [c[1:] for c in OUT_OF_BAND_CASES], ids=[c[0] for c in OUT_OF_BAND_CASES]
)
def test_out_of_band_mib(att, mib) -> None:
    assert out_of_band_mib(att) == mib


def _mig(index: int, uuid: str | None) -> MigReading:
    return MigReading(index=index, uuid=uuid)


def test_gpu_out_of_band_mib_of_a_whole_gpu() -> None:
    g = gpu(0)
    assert gpu_out_of_band_mib(g, {GPU0: GpuAttribution(GPU0, out_of_band_memory_mib=3)}) == 3
    assert gpu_out_of_band_mib(g, {GPU0: GpuAttribution(GPU0)}) == 0  # known: nothing
    assert gpu_out_of_band_mib(g, {GPU0: GpuAttribution(GPU0, unknown_pids=(7,))}) is None
    assert gpu_out_of_band_mib(g, {}) is None
    assert gpu_out_of_band_mib(gpu(0, uuid=None), {GPU0: GpuAttribution(GPU0)}) is None


def test_gpu_out_of_band_mib_of_a_mig_gpu_sums_its_known_devices() -> None:
    g = gpu(0, utilization_pct=None, mig_enabled=True,
            mig_devices=(_mig(0, "MIG-a"), _mig(1, "MIG-b"), _mig(2, "MIG-c"), _mig(3, None)))  # fmt: skip
    attribution = {
        GPU0: GpuAttribution(GPU0, out_of_band_memory_mib=1000),  # the parent's: not counted
        "MIG-a": GpuAttribution("MIG-a", out_of_band_memory_mib=4),
        "MIG-b": GpuAttribution("MIG-b", out_of_band_memory_mib=6),
        "MIG-c": GpuAttribution("MIG-c", unknown_pids=(7,)),  # not known
    }
    assert gpu_out_of_band_mib(g, attribution) == 10
    assert gpu_out_of_band_mib(g, {"MIG-c": attribution["MIG-c"]}) is None

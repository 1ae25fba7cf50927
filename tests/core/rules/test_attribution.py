"""Who uses each GPU: the cgroup rules (``core.rules.attribution.pod_from_cgroup``) on
``/proc/<pid>/cgroup`` as each runtime, driver and cgroup version writes it, the join of NVML
processes, cgroups and PodResources (``attribute``), and the /proc edge
(``sources.procs.read_pod_refs``) on this machine's own /proc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omaticaya_py.core.rules.attribution import (
    ContainerDevices,
    GpuAttribution,
    GpuProcess,
    PodMemory,
    PodRef,
    attribute,
    pod_from_cgroup,
)
from omaticaya_py.sources.procs import read_pod_refs

UID = "8f2c6a3e-5b1d-4c7e-9a0f-2d4b6c8e1a3f"
UID_ = UID.replace("-", "_")  # as the systemd driver spells it in slice names
STATIC_UID = "6b2d2b5b8c3e1f0a4d5e6f7a8b9c0d1e"  # a static pod's: hash of its manifest
CID = "4f1c9e2ab7d3e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e"
OUTER = "0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e"  # a kind node's


def _v1(path: str, *, others: str = "/") -> str:
    """A cgroup v1 file: the pod's path on the usual hierarchies, ``others`` on the rest."""
    return "\n".join(
        [
            f"12:pids:{path}",
            f"11:hugetlb:{path}",
            f"10:net_cls,net_prio:{path}",
            f"9:perf_event:{path}",
            f"8:cpu,cpuacct:{path}",
            f"7:blkio:{path}",
            f"6:freezer:{path}",
            f"5:rdma:{others}",
            f"4:cpuset:{path}",
            f"3:devices:{path}",
            f"2:memory:{path}",
            f"1:name=systemd:{path}",
            f"0::{others}",
        ]
    ) + "\n"


IN_POD = PodRef(UID, CID)

CASES: list[tuple[str, str, PodRef | None]] = [
    # (what, /proc/<pid>/cgroup, expected)
    ("v1 cgroupfs docker, Burstable", _v1(f"/kubepods/burstable/pod{UID}/{CID}"), IN_POD),
    ("v1 cgroupfs docker, Guaranteed", _v1(f"/kubepods/pod{UID}/{CID}"), IN_POD),
    ("v1 cgroupfs, static pod", _v1(f"/kubepods/besteffort/pod{STATIC_UID}/{CID}"), PodRef(STATIC_UID, CID)),
    (
        "v1 systemd containerd, Burstable",
        _v1(
            "/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope"
        ),
        IN_POD,
    ),
    (
        "v1 systemd containerd, Guaranteed",
        _v1(f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope"),
        IN_POD,
    ),
    (
        "v1 systemd docker, BestEffort",
        _v1(
            "/kubepods.slice/kubepods-besteffort.slice/"
            f"kubepods-besteffort-pod{UID_}.slice/docker-{CID}.scope"
        ),
        IN_POD,
    ),
    (
        "v2 systemd containerd, BestEffort",
        "0::/kubepods.slice/kubepods-besteffort.slice/"
        f"kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        IN_POD,
    ),
    (
        "v2 systemd CRI-O, Burstable",
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope\n",
        IN_POD,
    ),
    (
        "v2 systemd CRI-O with crun's inner cgroup",
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID_}.slice/crio-{CID}.scope/container\n",
        IN_POD,
    ),
    (
        "v2 systemd CRI-O conmon: the pod, no container",
        "0::/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope\n",
        PodRef(UID, None),
    ),
    ("v2 cgroupfs containerd", f"0::/kubepods/besteffort/pod{UID}/{CID}\n", IN_POD),
    ("v2 cgroupfs CRI-O", f"0::/kubepods/burstable/pod{UID}/crio-{CID}\n", IN_POD),
    ("v2 cgroupfs, the pod's own cgroup", f"0::/kubepods/burstable/pod{UID}\n", PodRef(UID, None)),
    (
        "kind node, inside (cgroup namespace)",
        "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        IN_POD,
    ),
    (
        "kind node, seen from the host",
        f"0::/system.slice/docker-{OUTER}.scope/kubelet.slice/kubelet-kubepods.slice/"
        "kubelet-kubepods-burstable.slice/"
        f"kubelet-kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        IN_POD,
    ),
    (
        "kind on cgroup v1, cgroupfs under the node's docker cgroup",
        _v1(f"/docker/{OUTER}/kubepods/burstable/pod{UID}/{CID}"),
        IN_POD,
    ),
    (
        "containerd.service: runc's slice:prefix:name spelling",
        f"0::/system.slice/containerd.service/kubepods-burstable-pod{UID_}.slice:cri-containerd:{CID}\n",
        IN_POD,
    ),
    (
        "v1 with some hierarchies elsewhere (the pod wins)",
        "5:memory:/process_api/9dbb7b2464169e9cc0732954a3a0afd3\n"
        f"4:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/\n",
        IN_POD,
    ),
    (
        "the line naming the container wins over the pod's own",
        f"2:memory:/kubepods/burstable/pod{UID}\n1:pids:/kubepods/burstable/pod{UID}/{CID}\n",
        IN_POD,
    ),
    # processes in no pod
    ("v1 host login session", _v1("/user.slice/user-1000.slice/session-2.scope"), None),
    ("v2 host service", "0::/system.slice/nvidia-persistenced.service\n", None),
    ("v2 docker container outside Kubernetes", f"0::/system.slice/docker-{CID}.scope\n", None),
    ("v2 kubelet itself", "0::/system.slice/kubelet.service\n", None),
    ("v1 root everywhere", _v1("/"), None),
    ("a pod-like folder outside kubepods", f"0::/batch/pod{UID}/{CID}\n", None),
    # not a cgroup file, or a broken one
    ("empty", "", None),
    ("garbage", "hello world\n\x00\xff::\n", None),
    ("no path field", "0:\n12:memory\n", None),
    ("a UID of the wrong length", f"0::/kubepods/burstable/pod{UID[:-1]}/{CID}\n", None),
    ("not hex", "0::/kubepods.slice/kubepods-podzzzzzzzz_zzzz_zzzz_zzzz_zzzzzzzzzzzz.slice\n", None),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pod_from_cgroup(text: str, expected: PodRef | None) -> None:
    assert pod_from_cgroup(text) == expected


def test_pod_uid_is_lower_case_with_dashes() -> None:
    ref = pod_from_cgroup(f"0::/kubepods.slice/kubepods-pod{UID_.upper()}.slice\n")
    assert ref == PodRef(UID, None)


# --- the join ---------------------------------------------------------------------------------

GPU_A = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"
GPU_B = "GPU-00000001-7fda-b7ae-a94e-630097a14ca4"
MIG_C = "MIG-3c0ea5a1-1d9e-5b0a-9b4f-2f6c1d0e7a21"
UID_B = "11111111-2222-4333-8444-555555555555"
CID_2 = "a" * 64


def test_attribute_joins_processes_cgroups_and_assignments() -> None:
    processes = {
        GPU_A: [
            GpuProcess(pid=100, used_memory_mib=1000),  # the pod holding the GPU
            GpuProcess(pid=101, used_memory_mib=24),  # same container
            GpuProcess(pid=200, used_memory_mib=500),  # on the host: out-of-band
            GpuProcess(pid=300, used_memory_mib=50),  # cgroup not readable: unknown
        ],
        GPU_B: [],
        MIG_C: [GpuProcess(pid=400, used_memory_mib=None), GpuProcess(pid=401, used_memory_mib=7)],
    }
    refs = {100: IN_POD, 101: IN_POD, 200: None, 400: PodRef(UID_B, CID_2), 401: PodRef(UID_B, None)}
    assignments = [
        ContainerDevices("ml", "train-0", "main", "nvidia.com/gpu", (GPU_A,)),
        ContainerDevices("ml", "serve-1", "model", "nvidia.com/mig-1g.10gb", (MIG_C, MIG_C)),
        ContainerDevices("ml", "train-0", "main", "example.com/nic", ("eth1",)),  # not a GPU
    ]
    got = attribute(
        processes,
        refs,
        assignments,
        pod_names={UID: ("ml", "train-0")},
        container_names={CID: "main"},
    )
    assert list(got) == [GPU_A, GPU_B, MIG_C]
    assert got[GPU_A] == GpuAttribution(
        device_id=GPU_A,
        holders=(assignments[0],),
        pods=(PodMemory(UID, CID, "ml", "train-0", "main", 1024, (100, 101)),),
        out_of_band_memory_mib=500,
        out_of_band_pids=(200,),
        unknown_memory_mib=50,
        unknown_pids=(300,),
    )
    assert got[GPU_B] == GpuAttribution(device_id=GPU_B)
    # a UID the name lookups do not know: keyed by UID and container ID only; no memory
    # figure counts 0; a device ID listed twice holds once
    assert got[MIG_C] == GpuAttribution(
        device_id=MIG_C,
        holders=(assignments[1],),
        pods=(
            PodMemory(UID_B, None, None, None, None, 7, (401,)),
            PodMemory(UID_B, CID_2, None, None, None, 0, (400,)),
        ),
    )


def test_attribute_without_kubelet_or_names() -> None:
    """No PodResources (socket absent) and no name lookups: memory by UID, out-of-band still."""
    got = attribute(
        {GPU_A: [GpuProcess(1, 10), GpuProcess(2, 20)]}, {1: IN_POD, 2: None}, []
    )
    assert got[GPU_A].holders == ()
    assert got[GPU_A].pods == (PodMemory(UID, CID, None, None, None, 10, (1,)),)
    assert (got[GPU_A].out_of_band_memory_mib, got[GPU_A].out_of_band_pids) == (20, (2,))


def test_attribute_two_containers_share_a_gpu() -> None:
    shared = [
        ContainerDevices("a", "p", "c1", "nvidia.com/gpu", (GPU_A, GPU_B)),
        ContainerDevices("b", "q", "c2", "nvidia.com/gpu", (GPU_A,)),
    ]
    got = attribute({GPU_A: [], GPU_B: []}, {}, shared)
    assert got[GPU_A].holders == tuple(shared)
    assert got[GPU_B].holders == (shared[0],)


# --- the /proc edge -----------------------------------------------------------------------------


def test_read_pod_refs_on_this_machine() -> None:
    own = Path("/proc/self/cgroup")
    if sys.platform != "linux" or not own.exists():
        pytest.skip("needs Linux /proc")
    if pod_from_cgroup(own.read_text()) is not None:
        pytest.skip("this test process runs in a pod")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its PID is gone
    got = read_pod_refs([os.getpid(), os.getpid(), 1, child.pid, 0, -5])
    assert got[os.getpid()] is None
    assert child.pid not in got and 0 not in got and -5 not in got
    assert set(got) <= {os.getpid(), 1, child.pid}


def test_read_pod_refs_skips_what_it_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{UID}/{CID}\n")
    (tmp_path / "11").mkdir()
    (tmp_path / "11" / "cgroup").write_text("0::/system.slice/sshd.service\n")
    (tmp_path / "12").mkdir()  # exited between the listing and the read: no cgroup file
    (tmp_path / "13" / "cgroup").mkdir(parents=True)  # not a file
    (tmp_path / "14").mkdir()
    (tmp_path / "14" / "cgroup").write_bytes(b"0::/kubepods/pod" + UID.encode() + b"/\xff\xfe\n")
    got = read_pod_refs([10, 11, 12, 13, 14, 99, True], proc_root=tmp_path)
    assert got == {10: IN_POD, 11: None, 14: PodRef(UID, None)}

"""GPU topology (issue 50) through the NVML test library: the raw NVML calls answer what a
trace of format version 3 says (NVLink state, far end and its type, P2P, NUMA node, CPU
affinity, NVLink fabric, PCI info, and MIG handles as nvml.h says), and ``NvmlReader`` reads it
once per ``nvmlInit`` into every snapshot's ``topology`` (PCIe roots and a NUMA fallback from a
fake sysfs tree), a failing NVLink call never failing the read. The recorder records the same
keys back. Real ``pynvml`` in a worker process (tests/nvml_worker.py); expected values are
written from the scenario here, not through the code under test.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest

from omaticaya_py.sources.trace_topology import TOPOLOGY_KEYS
from tests import nvmltestlib
from tests.helpers import DATA
from tests.nvmltestlib import (
    fake_sysfs,
    gpu,
    nvlink,
    nvml_worker_fixture,  # noqa: F401  (fixture)
    scenario,
    testlib_fixture,  # noqa: F401  (fixture)
    topology_scenario,
)

pytestmark = pytest.mark.skipif(
    nvmltestlib.testlib_unavailable_reason() is not None,
    reason=str(nvmltestlib.testlib_unavailable_reason()),
)

NOT_SUPPORTED = "NVMLError_NotSupported"
INVALID = "NVMLError_InvalidArgument"
MISMATCH = "NVMLError_ArgumentVersionMismatch"
ROOT = Path(__file__).resolve().parents[2]

# -- a two-socket PCIe server: an NVLink bridge pair (NV4, one switch), a PCIe switch pair ----

B0, B1, B2, B3 = "00000000:3B:00.0", "00000000:3C:00.0", "00000000:86:00.0", "00000000:87:00.0"
CPUS_8_TO_63 = 0xFFFF_FFFF_FFFF_FF00  # needs all 64 bits (a double holds 53)
CPUS_64_TO_71 = 0xFF


def _levels(mine: int) -> dict[str, int]:
    """PIX within a socket's pair (0-1, 2-3), SYS across the sockets."""
    return {str(p): (10 if p // 2 == mine // 2 else 50) for p in range(4) if p != mine}


def _p2p(mine: int) -> dict[str, int]:
    """P2P reads within a pair OK (0), across the sockets IOH_TOPOLOGY_NOT_SUPPORTED (3)."""
    return {str(p): (0 if p // 2 == mine // 2 else 3) for p in range(4) if p != mine}


PCIE_SERVER = [
    gpu(B0, topology=_levels(0), numa_node=0, cpu_affinity=[0xFF], pcie_root="pci0000:3a",
        nvlinks=[nvlink(k, B1) for k in range(4)], p2p_read=_p2p(0)),
    gpu(B1, topology=_levels(1), numa_node=0, cpu_affinity=[0xFF], pcie_root="pci0000:3a",
        nvlinks=[nvlink(k, B0) for k in (0, 1, 2, 3)] + [{"link": 4, "state": 0}],
        p2p_read=_p2p(1)),
    gpu(B2, topology=_levels(2), numa_node=1, cpu_affinity=[CPUS_8_TO_63, CPUS_64_TO_71],
        pcie_root="pci0000:85", p2p_read=_p2p(2)),
    # GPU 3: NVML knows no NUMA node (sysfs does), nor its CPU affinity
    gpu(B3, topology=_levels(3), pcie_root="pci0000:85", p2p_read=_p2p(3)),
]  # fmt: skip

# -- four GPUs on NVSwitches, three registered in one NVLink fabric, one still registering ----

CLUSTER = "6f1c2d3e-4a5b-4c6d-8e7f-0123456789ab"
SW = ("00000000:C1:00.0", "00000000:C2:00.0")


def _switched(i: int, state: int = 3) -> dict[str, Any]:
    return gpu(
        f"00000000:{0x18 + i:02X}:00.0",
        topology={str(p): 40 for p in range(4) if p != i},
        nvlinks=[nvlink(k, SW[k % 2], remote_type=2) for k in range(2)],
        fabric={"cluster_uuid": CLUSTER, "clique_id": 7, "state": state, "status": 0},
    )


NVSWITCH = [_switched(0), _switched(1), _switched(2), _switched(3, state=2)]


def _server(tmp_path: Path, gpus: list[dict[str, Any]] = PCIE_SERVER) -> tuple[Path, Path]:
    trace = topology_scenario(tmp_path / "topo.json", gpus, samples=3)
    return trace, fake_sysfs(tmp_path / "sys", trace, numa_nodes={3: 1})


def handle(i: int) -> dict[str, int]:
    return {"handle": i}


# -- the library: raw NVML calls -----------------------------------------------------------


def test_nvlink_calls_answer_the_trace_and_nvml_h_errors(nvml_worker, tmp_path: Path) -> None:  # noqa: F811
    trace, _ = _server(tmp_path)
    w = nvml_worker(trace, tmp_path / "pos", reader=False)
    w.call("nvmlInit")
    h0, h1, h2 = handle(0), handle(1), handle(2)
    assert [w.call("nvmlDeviceGetNvLinkState", h1, k) for k in range(5)] == [1, 1, 1, 1, 0]
    remote = w.call("nvmlDeviceGetNvLinkRemotePciInfo", h0, 2)
    src = json.loads(trace.read_text())["devices"][1]
    assert (remote["busId"], remote["busIdLegacy"]) == (B1, "0000:3C:00.0")
    assert (remote["domain"], remote["bus"], remote["device"]) == (0, 0x3C, 0)
    assert remote["pciDeviceId"] == src["pci_device_id"]  # the trace's GPU at that address
    assert (
        w.call("nvmlDeviceGetNvLinkRemoteDeviceType", h0, 3) == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    )
    # a link the trace does not list (the GPU lacks it), up to NVML_NVLINK_MAX_LINKS - 1
    for fn in ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo",
               "nvmlDeviceGetNvLinkRemoteDeviceType"):  # fmt: skip
        assert w.pynvml(fn, h0, 4) == {"error": NOT_SUPPORTED}, fn
        assert w.pynvml(fn, h2, 0) == {"error": NOT_SUPPORTED}, fn  # a GPU without NVLink
        assert w.pynvml(fn, h0, pynvml.NVML_NVLINK_MAX_LINKS - 1) == {"error": NOT_SUPPORTED}, fn
        assert w.pynvml(fn, h0, pynvml.NVML_NVLINK_MAX_LINKS) == {"error": INVALID}, fn
    assert w.pynvml("nvmlDeviceGetNvLinkRemoteDeviceType", h1, 4) == {"error": NOT_SUPPORTED}


def test_pci_numa_affinity_and_p2p_answer_the_trace(nvml_worker, tmp_path: Path) -> None:  # noqa: F811
    trace, _ = _server(tmp_path)
    w = nvml_worker(trace, tmp_path / "pos", reader=False)
    w.call("nvmlInit")
    pci = w.call("nvmlDeviceGetPciInfo", handle(2))
    assert (pci["busId"], pci["busIdLegacy"], pci["bus"]) == (B2, "0000:86:00.0", 0x86)
    assert [w.pynvml("nvmlDeviceGetNumaNodeId", handle(i)) for i in range(4)] == [
        {"ok": 0}, {"ok": 0}, {"ok": 1}, {"error": NOT_SUPPORTED}
    ]  # fmt: skip
    # every bit of a 64-bit word, the words past the recorded ones 0
    assert w.call("nvmlDeviceGetCpuAffinity", handle(2), 3) == [CPUS_8_TO_63, CPUS_64_TO_71, 0]
    assert w.call("nvmlDeviceGetCpuAffinity", handle(0), 1) == [0xFF]
    assert w.pynvml("nvmlDeviceGetCpuAffinity", handle(0), 0) == {"error": INVALID}
    assert w.pynvml("nvmlDeviceGetCpuAffinity", handle(3), 2) == {"error": NOT_SUPPORTED}
    read = 0  # NVML_P2P_CAPS_INDEX_READ (pynvml 13 spells the constant as a tuple)
    assert w.call("nvmlDeviceGetP2PStatus", handle(0), handle(1), read) == pynvml.NVML_P2P_STATUS_OK
    assert (
        w.call("nvmlDeviceGetP2PStatus", handle(1), handle(2), read)
        == pynvml.NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED
    )
    # the trace records reads only; an index past the enum is invalid (nvml.h)
    assert w.pynvml(
        "nvmlDeviceGetP2PStatus", handle(0), handle(1), pynvml.NVML_P2P_CAPS_INDEX_WRITE
    ) == {"error": NOT_SUPPORTED}
    assert w.pynvml(
        "nvmlDeviceGetP2PStatus", handle(0), handle(1), pynvml.NVML_P2P_CAPS_INDEX_UNKNOWN
    ) == {"error": INVALID}
    assert w.call("nvmlDeviceGetTopologyCommonAncestor", handle(0), handle(1)) == 10
    assert w.call("nvmlDeviceGetTopologyCommonAncestor", handle(3), handle(0)) == 50


def test_fabric_info_versions_and_absence(nvml_worker, tmp_path: Path) -> None:  # noqa: F811
    trace = topology_scenario(tmp_path / "switch.json", NVSWITCH)
    w = nvml_worker(trace, tmp_path / "pos", reader=False)
    w.call("nvmlInit")
    uuid = list(bytes.fromhex(CLUSTER.replace("-", "")))
    for version, size in ((2, 0x24), (3, 0x28)):
        got = w.raw("nvmlDeviceGetGpuFabricInfoV", 0, version=version)
        assert got["ret"] == pynvml.NVML_SUCCESS
        info = got["info"]
        assert info["version"] == (version << 24 | size)
        assert (info["clusterUuid"], info["cliqueId"], info["state"], info["status"]) == (
            uuid,
            7,
            3,
            0,
        )
    assert w.raw("nvmlDeviceGetGpuFabricInfoV", 3, version=2)["info"]["state"] == 2
    bad = w.raw("nvmlDeviceGetGpuFabricInfoV", 0, version=2 << 24 | 0x20)
    assert bad["ret"] == 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert (
        w.call("nvmlDeviceGetNvLinkRemoteDeviceType", handle(1), 1)
        == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    )
    plain = topology_scenario(tmp_path / "plain.json", [gpu(B0)])
    w2 = nvml_worker(plain, tmp_path / "pos2", reader=False)
    w2.call("nvmlInit")
    assert w2.raw("nvmlDeviceGetGpuFabricInfoV", 0, version=2)["ret"] == 3  # NOT_SUPPORTED


def test_mig_handles_answer_as_nvml_h_says(nvml_worker, tmp_path: Path) -> None:  # noqa: F811
    def place(devices: list[dict[str, Any]]) -> None:
        for i, d in enumerate(devices):
            d.update(numa_node=i, cpu_affinity=[1 << i], p2p_read={str(1 - i): 0},
                     nvlinks=[nvlink(0, devices[1 - i]["pci_bus_id"])],
                     fabric={"cluster_uuid": CLUSTER, "clique_id": 1, "state": 3, "status": 0})  # fmt: skip

    trace = scenario(tmp_path / "mig.json", nvmltestlib.sample(), devices=place)
    w = nvml_worker(trace, tmp_path / "pos", reader=False)
    w.call("nvmlInit")
    mig = {"mig": [0, 0]}
    assert w.call("nvmlDeviceGetNumaNodeId", handle(0)) == 0  # the parent answers
    for fn, args in [
        ("nvmlDeviceGetNvLinkState", (0,)),
        ("nvmlDeviceGetNvLinkRemotePciInfo", (0,)),
        ("nvmlDeviceGetNvLinkRemoteDeviceType", (0,)),
        ("nvmlDeviceGetNumaNodeId", ()),
        ("nvmlDeviceGetCpuAffinity", (1,)),
    ]:
        assert w.pynvml(fn, mig, *args) == {"error": NOT_SUPPORTED}, fn
    assert w.raw("nvmlDeviceGetGpuFabricInfoV", mig, version=2)["ret"] == 3  # NOT_SUPPORTED
    # nvml.h lists no NOT_SUPPORTED for these: a MIG handle is an invalid device there
    assert w.pynvml("nvmlDeviceGetPciInfo", mig) == {"error": INVALID}
    assert w.pynvml("nvmlDeviceGetP2PStatus", mig, handle(1), 0) == {"error": INVALID}
    assert w.pynvml("nvmlDeviceGetP2PStatus", handle(1), mig, 0) == {"error": INVALID}


# -- the reader --------------------------------------------------------------------------


def test_reader_topology_of_a_pcie_server_with_an_nvlink_bridge(
    nvml_worker, tmp_path: Path
) -> None:  # noqa: F811
    trace, sysfs = _server(tmp_path)
    w = nvml_worker(trace, tmp_path / "pos", watch_xid=False, sysfs_root=sysfs)
    snap = w.read()
    assert snap["error"] is None and snap["errors"] == []
    topo = w.topology()
    assert topo is not None and snap["topology"]["gpus"] == topo["gpus"]
    assert topo["matrix"] == [
        ["X", "NV4", "SYS", "SYS"],
        ["NV4", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "PIX"],
        ["SYS", "SYS", "PIX", "X"],
    ]
    assert topo["islands"] == {
        "0": "nvlink-0000:3b:00.0", "1": "nvlink-0000:3b:00.0",
        "2": "nvlink-0000:86:00.0", "3": "nvlink-0000:87:00.0",
    }  # fmt: skip
    facts = [
        (
            g["pci_bus_id"],
            g["numa_node"],
            g["pcie_root"],
            g["cpu_affinity"],
            g["nvswitch_links"],
            g["fabric"],
        )
        for g in topo["gpus"]
    ]
    assert facts == [
        ("0000:3b:00.0", 0, "pci0000:3a", "0-7", 0, None),
        ("0000:3c:00.0", 0, "pci0000:3a", "0-7", 0, None),
        ("0000:86:00.0", 1, "pci0000:85", "8-71", 0, None),
        ("0000:87:00.0", 1, "pci0000:85", None, 0, None),  # NUMA from sysfs
    ]
    pairs = {(a, b): (link["level"], link["nvlinks"], link["p2p"]) for a, b, link in topo["pairs"]}
    assert pairs[(0, 1)] == (10, 4, True)
    assert pairs[(1, 2)] == (50, 0, False)
    assert pairs[(2, 3)] == (10, 0, True)
    # a later look-up answers from the topology read at nvmlInit, without asking NVML again
    uuids = [g["uuid"] for g in topo["gpus"]]
    before = w.calls().get("nvmlDeviceGetTopologyCommonAncestor", 0)
    assert w.request({"cmd": "topology", "a": uuids[3], "b": uuids[0]})["level"] == 50
    assert w.calls().get("nvmlDeviceGetTopologyCommonAncestor", 0) == before


def test_reader_topology_on_nvswitches_and_a_gpu_outside_the_fabric(
    nvml_worker, tmp_path: Path
) -> None:  # noqa: F811
    trace = topology_scenario(tmp_path / "switch.json", NVSWITCH)
    w = nvml_worker(
        trace, tmp_path / "pos", watch_xid=False, sysfs_root=fake_sysfs(tmp_path / "sys", trace)
    )
    w.read()
    topo = w.topology()
    assert topo["matrix"] == [
        ["X", "NV2", "NV2", "NODE"],
        ["NV2", "X", "NV2", "NODE"],
        ["NV2", "NV2", "X", "NODE"],
        ["NODE", "NODE", "NODE", "X"],
    ]
    fabric = f"fabric-{CLUSTER}.7"
    assert topo["islands"] == {"0": fabric, "1": fabric, "2": fabric, "3": "nvlink-0000:1b:00.0"}
    assert [
        (g["nvswitch_links"], g["fabric"], g["pcie_root"], g["numa_node"]) for g in topo["gpus"]
    ] == [(2, f"{CLUSTER}.7", None, None)] * 3 + [(2, None, None, None)]


def test_topology_is_read_once_per_nvml_init(nvml_worker, tmp_path: Path) -> None:  # noqa: F811
    trace, sysfs = _server(tmp_path)
    w = nvml_worker(trace, tmp_path / "pos", watch_xid=False, sysfs_root=sysfs)
    topology_calls = (
        "nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemotePciInfo_v2",
        "nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetP2PStatus",
        "nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetCpuAffinity", "nvmlDeviceGetGpuFabricInfoV",
    )  # fmt: skip
    first = w.read()
    once = {k: n for k, n in w.calls().items() if k in topology_calls}
    # 36 links a GPU, the far end of 8 active links, 6 pairs one way, 12 P2P reads both ways
    assert once == {
        "nvmlDeviceGetNvLinkState": 4 * 36,
        "nvmlDeviceGetNvLinkRemotePciInfo_v2": 8,
        "nvmlDeviceGetNvLinkRemoteDeviceType": 8,
        "nvmlDeviceGetTopologyCommonAncestor": 6,
        "nvmlDeviceGetP2PStatus": 12,
        "nvmlDeviceGetNumaNodeId": 4,
        "nvmlDeviceGetCpuAffinity": 4,
        "nvmlDeviceGetGpuFabricInfoV": 4,
    }
    w.advance(1)
    later = [w.read() for _ in range(3)]
    assert {k: n for k, n in w.calls().items() if k in topology_calls} == once
    assert all(s["topology"] == first["topology"] for s in later)
    w.request({"cmd": "reinit"})
    assert w.topology() is None  # dropped with the session
    again = w.read()
    assert again["topology"] == first["topology"]
    assert {k: n for k, n in w.calls().items() if k in topology_calls} == {
        k: 2 * n for k, n in once.items()
    }


def test_a_gpu_lost_at_init_joins_the_topology_when_it_is_back(nvml_worker, tmp_path: Path) -> None:  # noqa: F811
    trace, sysfs = _server(tmp_path)
    doc = json.loads(trace.read_text())
    doc["samples"][0]["gpus"][1] = {
        "index": 1,
        "nvml_error": "NVMLError_GpuIsLost",
        "message": "lost",
    }
    trace.write_text(json.dumps(doc))
    w = nvml_worker(trace, tmp_path / "pos", watch_xid=False, sysfs_root=sysfs)
    w.read()
    assert [g["index"] for g in w.topology()["gpus"]] == [0, 2, 3]
    w.advance(1)
    w.read()
    back = w.topology()
    assert [g["index"] for g in back["gpus"]] == [0, 1, 2, 3]
    assert back["matrix"][0] == ["X", "NV4", "SYS", "SYS"]


def test_a_failing_nvlink_call_leaves_the_read_healthy_and_is_counted(
    nvml_worker, tmp_path: Path
) -> None:  # noqa: F811
    trace, sysfs = _server(tmp_path)
    w = nvml_worker(
        trace, tmp_path / "pos", watch_xid=False, sysfs_root=sysfs,
        faults={"nvmlDeviceGetNvLinkState": "NVMLError_Unknown"},
    )  # fmt: skip
    snap = w.read()
    assert snap["error"] is None and [g["error"] for g in snap["gpus"]] == [None] * 4
    assert w.errors() == {("nvmlDeviceGetNvLinkState", "NVMLError_Unknown"): 4 * 36}
    topo = w.topology()
    # no NVLink known: the bridge pair is its PCIe switch; the rest of the topology stays
    assert topo["matrix"][0] == ["X", "PIX", "SYS", "SYS"]
    assert [g["numa_node"] for g in topo["gpus"]] == [0, 0, 1, 1]
    w.advance(1)
    assert w.read()["error"] is None
    assert w.errors()[("nvmlDeviceGetNvLinkState", "NVMLError_Unknown")] == 4 * 36  # not again


def test_a_trace_without_topology_still_reads_levels(nvml_worker, tmp_path: Path) -> None:  # noqa: F811
    # format 1/2 traces: the library's default levels; nothing else known, no error counted
    w = nvml_worker(DATA / "multi-gpu-trace.json", tmp_path / "pos", watch_xid=False,
                    sysfs_root=tmp_path / "empty")  # fmt: skip
    snap = w.read()
    assert snap["errors"] == [] and len(snap["topology"]["gpus"]) == len(snap["gpus"])
    data = w.topology()
    assert {p[2]["level"] for p in data["pairs"]} == {50}
    assert {p[2]["nvlinks"] for p in data["pairs"]} == {0}
    assert all(g["pcie_root"] is None and g["numa_node"] is None for g in data["gpus"])


# -- the recorder ------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [PCIE_SERVER, NVSWITCH], ids=["pcie-server", "nvswitch"])
def test_recorder_records_the_version_3_keys_back(nvml_worker, tmp_path: Path, gpus) -> None:  # noqa: F811
    trace = topology_scenario(tmp_path / "topo.json", gpus)
    sysfs = fake_sysfs(tmp_path / "sys", trace)
    w = nvml_worker(trace, tmp_path / "pos", reader=False, sysfs_root=sysfs)
    w.request({"cmd": "record", "t": 0.0})
    w.request({"cmd": "record", "t": 1.0})
    doc = w.request({"cmd": "record_close"})["doc"]
    assert doc["format_version"] == 3
    keys = ("pci_bus_id", *TOPOLOGY_KEYS)
    src = json.loads(trace.read_text())["devices"]
    for got, want in zip(doc["devices"], src, strict=True):
        expected = {"pcie_root": None, **{k: want[k] for k in keys if k in want}}  # null: none
        assert {k: got[k] for k in keys if k in got} == expected


def test_recorder_over_a_trace_without_topology_records_the_default_levels_only(
    nvml_worker,
    tmp_path: Path,  # noqa: F811
) -> None:
    trace = scenario(tmp_path / "plain.json", nvmltestlib.sample())
    w = nvml_worker(trace, tmp_path / "pos", reader=False, sysfs_root=tmp_path / "none")
    w.request({"cmd": "record", "t": 0.0})
    doc = w.request({"cmd": "record_close"})["doc"]
    # the library answers its default levels, so `topology` is recorded, and nothing else
    assert doc["format_version"] == 3
    assert [
        sorted(k for k in d if k in ("topology", "nvlinks", "numa_node", "fabric"))
        for d in doc["devices"]
    ] == [["topology"], ["topology"]]


# -- the reader and the replay of the same trace -----------------------------------------

TOPO_TRACES = [
    DATA / "hgx-h100-topo-trace.json",
    DATA / "pcie-nvlink-bridge-topo-trace.json",
    DATA / "workstation-4gpu-topo-trace.json",
]


@pytest.mark.parametrize("trace", TOPO_TRACES, ids=lambda p: p.name)
def test_reader_over_the_library_and_replay_give_one_topology(
    nvml_worker, tmp_path: Path, trace: Path
) -> None:  # noqa: F811
    if not trace.exists():
        pytest.skip(f"{trace.name} not written yet")
    from omaticaya_py.sources.replay import TraceReader

    replayed = TraceReader(trace, at_s=0.0).read().topology
    assert replayed is not None
    w = nvml_worker(
        trace, tmp_path / "pos", watch_xid=False, sysfs_root=fake_sysfs(tmp_path / "sys", trace)
    )
    w.read()
    got = w.topology()
    assert got == {
        "matrix": replayed.matrix(),
        "islands": {str(k): v for k, v in replayed.islands().items()},
        "gpus": [dataclasses.asdict(g) for g in replayed.gpus],
        "pairs": [
            [a, b, dataclasses.asdict(link)] for (a, b), link in sorted(replayed.pairs.items())
        ],
    }


def test_bench_topology_read_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "topology_read.py"), "--quick"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "nvmlDeviceGetNvLinkState" in done.stdout

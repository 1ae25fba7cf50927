"""The DRA plugin's pure decisions (omaticaya_py/dra/prepare.py, healthreport.py): a ResourceClaim's
JSON + the node's devices -> what its containers get, or the reason it is refused; the CDI spec
checked against the CDI format's rules (tags.cncf.io/container-device-interface v1.1.1, what
containerd 2.4 vendors); the health report."""

from __future__ import annotations

import copy
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from omaticaya_py.core.allocation.mps import Layout, SliceRequest, slice_id
from omaticaya_py.core.model.sharing import Sharing, parse_shared_gpus
from omaticaya_py.core.publish.dra import DraDevice, device_name, inventory
from omaticaya_py.core.rules.health import assess
from omaticaya_py.dra import healthreport
from omaticaya_py.dra.prepare import (
    CDI_KIND,
    CDI_VERSION,
    ClaimRef,
    DevNode,
    NodeFacts,
    PendingSlice,
    Refused,
    capacity_mib,
    cdi_file_name,
    cdi_spec,
    claim_slice_id,
    decide,
    slices_pending,
)
from tests.dra.dra_prepare_support import (  # the names moved out, for this file's tests
    _DEVICE,  # noqa: F401
    _VENDOR,  # noqa: F401
    _VERSIONS,  # noqa: F401
    check_cdi,  # noqa: F401
)
from tests.helpers import gpu, lost, snapshot

NODE = "gpu-node-1"
UID = "0b5a1c9e-3f1d-4d7e-9a52-2b8c1f0e7d61"
REF = ClaimRef("team-a", "one-gpu", UID)
G0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"
G1 = "GPU-00000001-7fda-b7ae-a94e-630097a14ca4"
G2 = "GPU-00000002-7fda-b7ae-a94e-630097a14ca4"
MIG = "MIG-11111111-2222-3333-4444-555555555555"
LAYOUT = Layout(Path("/run/omaticaya/mps"), Path("/run/omaticaya-mps-state"))

DEVICES = (
    DraDevice("gpu-0", 0, None, G0, G0, None, False, 81559, 80896),
    DraDevice("gpu-1", 1, None, G1, G1, None, False, 81559, 0, reasons=("xid-79",)),
    DraDevice("gpu-2", 2, None, G2, G2, None, True, 79 * 1024, 79872, unit_mib=1024),
    DraDevice("gpu-3-mig-1", 3, 1, MIG, "GPU-00000003-7fda-b7ae-a94e-630097a14ca4", "1g.10gb",
              False, 9856, 9728),
)
NODES = {n: DevNode(n, "c", 195, m) for n, m in
         (("nvidia0", 0), ("nvidia2", 2), ("nvidia3", 3), ("nvidiactl", 255))} | {
    "nvidia-uvm": DevNode("nvidia-uvm", "c", 508, 0),
    "nvidia-uvm-tools": DevNode("nvidia-uvm-tools", "c", 508, 1),
}
CONTROL = [NODES["nvidiactl"], NODES["nvidia-uvm"], NODES["nvidia-uvm-tools"]]


def facts(**kw: Any) -> NodeFacts:
    base: dict[str, Any] = {"pool": NODE, "dev_root": Path("/dev"), "nodes": NODES,
                            "minors": {G2: 2}}
    base.update(kw)
    return NodeFacts(**base)


MPS_UP = {"mps": LAYOUT, "mps_up": {G2: (True, "")}}


def result(device: str = "gpu-0", request: str = "gpu", **kw: Any) -> dict[str, Any]:
    return {"request": request, "driver": "gpu.omaticaya.io", "pool": NODE, "device": device, **kw}


def claim(*results: dict[str, Any], config: list[dict[str, Any]] | None = None,
          uid: str = UID) -> dict[str, Any]:
    devices: dict[str, Any] = {"results": list(results)}
    if config is not None:
        devices["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"namespace": REF.namespace, "name": REF.name, "uid": uid},
            "status": {"allocation": {"devices": devices}}}


def opaque(params: Any, requests: list[str] | None = None, source: str = "FromClaim",
           driver: str = "gpu.omaticaya.io") -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": params}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def cfg(**kw: Any) -> dict[str, Any]:
    return {"apiVersion": "gpu.omaticaya.io/v1alpha1", "kind": "GpuConfig", **kw}


SLICE = result("gpu-2", consumedCapacity={"memory": "20Gi"}, shareID="8c6e5a4e-share")


# -- what a container gets -------------------------------------------------------------------


def test_whole_gpu() -> None:
    prepared = decide(claim(result("gpu-0")), REF, DEVICES, facts())
    (d,) = prepared.devices
    assert (d.request_names, d.pool, d.device, d.uuid, d.share_id, d.mib) == (
        ("gpu",), NODE, "gpu-0", G0, None, None)
    assert d.cdi_name == f"{UID}-gpu-0"
    assert d.cdi_id == f"gpu.omaticaya.io/claim={UID}-gpu-0"
    assert d.edits.env == (f"NVIDIA_VISIBLE_DEVICES={G0}",)
    assert list(d.edits.nodes) == [NODES["nvidia0"], *CONTROL]
    assert d.edits.mounts == ()


def test_mig_device_names_its_mig_uuid_and_the_parent_gpu_node() -> None:
    (d,) = decide(claim(result("gpu-3-mig-1")), REF, DEVICES, facts()).devices
    assert d.edits.env == (f"NVIDIA_VISIBLE_DEVICES={MIG}",)
    assert list(d.edits.nodes) == [NODES["nvidia3"], *CONTROL]


def test_the_minor_comes_from_the_driver_not_the_index() -> None:
    """/proc/driver/nvidia/gpus/*/information says GPU 0 is /dev/nvidia3."""
    (d,) = decide(claim(result("gpu-0")), REF, DEVICES, facts(minors={G0: 3})).devices
    assert d.edits.nodes[0] == NODES["nvidia3"]


def test_missing_device_nodes_are_left_out() -> None:
    (d,) = decide(claim(result("gpu-0")), REF, DEVICES, facts(nodes={})).devices
    assert d.edits.nodes == ()
    assert d.edits.env == (f"NVIDIA_VISIBLE_DEVICES={G0}",)


def test_two_gpus_of_one_request_each_carry_the_request_list() -> None:
    devices = (*DEVICES[:1], DraDevice("gpu-4", 4, None, "GPU-4", "GPU-4", None, False, 1, 1))
    prepared = decide(claim(result("gpu-0"), result("gpu-4")), REF, devices, facts())
    assert [d.edits.env for d in prepared.devices] == [("NVIDIA_VISIBLE_DEVICES=" + G0 + ",GPU-4",)] * 2


def test_devices_of_different_requests_keep_their_own_lists() -> None:
    devices = (*DEVICES[:1], DraDevice("gpu-4", 4, None, "GPU-4", "GPU-4", None, False, 1, 1))
    prepared = decide(claim(result("gpu-0", request="a"), result("gpu-4", request="b")), REF,
                      devices, facts())
    assert [d.edits.env for d in prepared.devices] == [
        (f"NVIDIA_VISIBLE_DEVICES={G0}",), ("NVIDIA_VISIBLE_DEVICES=GPU-4",)]
    assert [d.request_names for d in prepared.devices] == [("a",), ("b",)]


def test_shared_slice_under_mps_is_a_client_of_its_own_daemon() -> None:
    """Issue 47: the slice's container is the client of a daemon of the slice's own (named by
    the claim and the device), whose default limit is the slice: the request for it goes with
    the prepared device."""
    (d,) = decide(claim(SLICE), REF, DEVICES, facts(**MPS_UP)).devices
    sid = claim_slice_id(UID, "gpu-2")
    assert sid == slice_id(f"claim:{UID}:gpu-2") != claim_slice_id("another-claim", "gpu-2")
    pipe = f"/run/omaticaya/mps/slices/{sid}/pipe"
    assert d.daemon == SliceRequest(sid, G2, 2, 20480, "dra", f"claim:{UID}:gpu-2", None)
    assert d.mib == 20480 and d.share_id == "8c6e5a4e-share"
    assert d.edits.env == (
        f"NVIDIA_VISIBLE_DEVICES={G2}",
        f"CUDA_MPS_PIPE_DIRECTORY={pipe}",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
        "OMATICAYA_GPU_MEMORY_LIMIT_MIB=20480",
    )
    assert [(m.host_path, m.container_path, m.read_only) for m in d.edits.mounts] == [
        (pipe, pipe, False), (f"/run/omaticaya/mps/slices/{sid}/shm", "/dev/shm", False)]
    assert list(d.edits.nodes) == [NODES["nvidia2"], *CONTROL]


@pytest.mark.parametrize(
    ("major", "driver_env"),
    [(None, ()), (580, ()),
     (615, ("NVIDIA_GPU_MEMORY_REQUEST=20480", "NVIDIA_GPU_MEMORY_LIMIT=20480"))],
)  # fmt: skip
def test_from_r615_a_slice_gets_the_drivers_per_container_limit(major, driver_env) -> None:
    """Issue 47, item 1: on driver r615 and newer the CDI spec also asks the driver's
    per-container limit (the sum of the container's processes), with or without MPS."""
    for extra in ({}, MPS_UP):
        (d,) = decide(claim(SLICE), REF, DEVICES, facts(driver_major=major, **extra)).devices
        got = tuple(e for e in d.edits.env if e.startswith("NVIDIA_GPU_MEMORY_"))
        assert got == driver_env


def test_thread_share_and_the_opaque_thread_percentage() -> None:
    (d,) = decide(claim(SLICE), REF, DEVICES, facts(thread_share=True, **MPS_UP)).devices
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=26" in d.edits.env  # 20 of 79 units, rounded up
    (d,) = decide(claim(SLICE, config=[opaque(cfg(mpsActiveThreadPercentage=50))]), REF, DEVICES,
                  facts(thread_share=True, **MPS_UP)).devices
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50" in d.edits.env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=26" not in d.edits.env


def test_claim_config_wins_over_class_config_and_applies_by_request() -> None:
    config = [opaque(cfg(mpsActiveThreadPercentage=10), source="FromClaim"),
              opaque(cfg(mpsActiveThreadPercentage=90), source="FromClass"),
              opaque(cfg(mpsActiveThreadPercentage=70), requests=["other"]),
              opaque({"anything": True}, driver="other.example.com")]
    (d,) = decide(claim(SLICE, config=config), REF, DEVICES, facts(**MPS_UP)).devices
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10" in d.edits.env


def test_a_config_without_options_is_accepted_for_a_whole_gpu() -> None:
    (d,) = decide(claim(result("gpu-0"), config=[opaque(cfg())]), REF, DEVICES, facts()).devices
    assert d.device == "gpu-0"


def test_shared_slice_without_enforcement_has_the_limit_in_its_env_only() -> None:
    (d,) = decide(claim(SLICE), REF, DEVICES, facts()).devices
    assert d.edits.env == (f"NVIDIA_VISIBLE_DEVICES={G2}", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
                           "OMATICAYA_GPU_MEMORY_LIMIT_MIB=20480")
    assert d.edits.mounts == ()


def test_other_drivers_results_are_not_ours() -> None:
    other = {"request": "nic", "driver": "nic.example.com", "pool": "x", "device": "eth0"}
    assert decide(claim(other), REF, None, facts()).devices == ()
    (d,) = decide(claim(other, result("gpu-0")), REF, DEVICES, facts()).devices
    assert d.device == "gpu-0"


@pytest.mark.parametrize(("quantity", "mib"), [("20Gi", 20480), ("20480Mi", 20480), ("1Gi", 1024),
                                               ("21474836480", 20480)])
def test_capacity_mib(quantity: str, mib: int) -> None:
    assert capacity_mib(quantity) == mib


# -- every refusal ---------------------------------------------------------------------------

REFUSALS = [
    ("uid mismatch", claim(result(), uid="another"), {}, DEVICES,
     r"has UID 'another', not 0b5a.*deleted and created again"),
    ("not allocated", {"metadata": {"uid": UID}, "status": {}}, {}, DEVICES, r"is not allocated"),
    ("no status", {"metadata": {"uid": UID}}, {}, DEVICES, r"is not allocated"),
    ("another node's pool", claim(result(pool="gpu-node-2")), {}, DEVICES,
     r"allocated from pool 'gpu-node-2', not this node's \(gpu-node-1\)"),
    ("unknown device name", claim(result("nic-0")), {}, DEVICES, r"device 'nic-0': unknown"),
    ("device not in the reading", claim(result("gpu-7")), {}, DEVICES, r"gpu-7: not in the node's reading"),
    ("no reading", claim(result()), {}, None, r"no reading of the GPUs yet"),
    ("unhealthy", claim(result("gpu-1")), {}, DEVICES, r"gpu-1 is unhealthy: xid-79"),
    ("twice in one claim", claim(result("gpu-0", request="a"), result("gpu-0", request="b")), {},
     DEVICES, r"gpu-0 is allocated twice in one claim \(requests a and b\)"),
    ("slice not whole units", claim(result("gpu-2", consumedCapacity={"memory": "1536Mi"})), MPS_UP,
     DEVICES, r"1536Mi \(1536 MiB\) is not a whole number of 1024 MiB units"),
    ("slice not whole MiB", claim(result("gpu-2", consumedCapacity={"memory": "1000k"})), MPS_UP,
     DEVICES, r"not a whole positive number of MiB"),
    ("slice not a quantity", claim(result("gpu-2", consumedCapacity={"memory": "lots"})), MPS_UP,
     DEVICES, r"not a quantity: 'lots'"),
    ("slice without capacity", claim(result("gpu-2")), MPS_UP, DEVICES,
     r"consumed no memory capacity"),
    ("mps daemon down", claim(SLICE), {"mps": LAYOUT, "mps_up": {G2: (False, "mps-daemon-down")}},
     DEVICES, r"gpu-2: its MPS daemon is not up \(mps-daemon-down\)"),
    ("mps state missing", claim(SLICE), {"mps": LAYOUT}, DEVICES, r"not up \(mps-state-missing\)"),
    ("mps slice beside another device", claim(SLICE, result("gpu-0")), MPS_UP, DEVICES,
     r"MPS slice of gpu-2 must be its claim's only device"),
    ("config wrong apiVersion", claim(result(), config=[opaque({"apiVersion": "v1", "kind": "GpuConfig"})]),
     {}, DEVICES, r"config\[0\]\.opaque\.parameters\.apiVersion: expected gpu.omaticaya.io/v1alpha1"),
    ("config wrong kind", claim(result(), config=[opaque(cfg(kind="MigConfig"))]), {}, DEVICES,
     r"config\[0\]\.opaque\.parameters\.kind: expected GpuConfig; got 'MigConfig'"),
    ("config unknown field", claim(result(), config=[opaque(cfg(sharing="timeSlicing"))]), {},
     DEVICES, r"config\[0\]\.opaque\.parameters\.sharing: unknown field"),
    ("config not an object", claim(result(), config=[opaque("x")]), {}, DEVICES,
     r"config\[0\]\.opaque\.parameters: expected an object"),
    ("threads out of range", claim(SLICE, config=[opaque(cfg(mpsActiveThreadPercentage=0))]),
     MPS_UP, DEVICES, r"mpsActiveThreadPercentage: expected an integer from 1 to 100; got 0"),
    ("threads not an integer", claim(SLICE, config=[opaque(cfg(mpsActiveThreadPercentage="50"))]),
     MPS_UP, DEVICES, r"mpsActiveThreadPercentage: expected an integer from 1 to 100; got '50'"),
    ("threads for a whole gpu", claim(result(), config=[opaque(cfg(mpsActiveThreadPercentage=50))]),
     {}, DEVICES, r"config\[0\]\.opaque\.parameters\.mpsActiveThreadPercentage: only for a shared "
     r"GPU under MPS; gpu-0 is not one"),
    ("threads without mps", claim(SLICE, config=[opaque(cfg(mpsActiveThreadPercentage=50))]), {},
     DEVICES, r"only for a shared GPU under MPS; gpu-2 is not one"),
]


@pytest.mark.parametrize(("doc", "extra", "devices", "reason"),
                         [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refused(doc: dict[str, Any], extra: dict[str, Any], devices: Any, reason: str) -> None:
    with pytest.raises(Refused, match=reason):
        decide(doc, REF, devices, facts(**extra))


def test_no_reading_says_why() -> None:
    with pytest.raises(Refused, match="stale-reading: 40s"):
        decide(claim(result()), REF, None, facts(), no_reading="stale-reading: 40s old")


def test_decide_does_not_change_the_claim() -> None:
    doc = claim(SLICE, config=[opaque(cfg(mpsActiveThreadPercentage=50))])
    before = copy.deepcopy(doc)
    decide(doc, REF, DEVICES, facts(**MPS_UP))
    assert doc == before


# -- a slice must fit its GPU's live free memory less the slices pending there -----------------

OTHER = "7d3f0c1a-0000-4000-8000-000000000001"


def shared(free_mib: int | None) -> tuple[DraDevice, ...]:
    """The node's devices with gpu-2 (shared, 79 units of 1 GiB) at ``free_mib`` free."""
    return (*DEVICES[:2], DraDevice("gpu-2", 2, None, G2, G2, None, True, 79 * 1024, free_mib,
                                    unit_mib=1024), DEVICES[3])  # fmt: skip


def pending(*slices: tuple[str, int]) -> dict[str, tuple[PendingSlice, ...]]:
    """gpu-2's pending slices: (claim UID, MiB) each, prepared at t=0 on 80 GiB free."""
    return {G2: tuple(PendingSlice(uid, mib, 0.0, 81920) for uid, mib in slices)}


NO_ROOM = "device gpu-2: GPU 2 {g} has {free} MiB free by its live reading, {pending} MiB of it prepared for slices not in use yet: a slice of {mib} MiB does not fit"

# (case, free MiB of gpu-2, its pending slices, the slice asked, extra facts, refusal or None)
LIVE_ROOM = [
    ("20 GiB on 10 GiB free", 10240, (), "20Gi", {}, NO_ROOM.format(g=G2, free=10240, pending=0, mib=20480)),
    ("20 GiB on 10 GiB free, under MPS", 10240, (), "20Gi", MPS_UP,
     NO_ROOM.format(g=G2, free=10240, pending=0, mib=20480)),
    ("fits exactly", 20480, (), "20Gi", {}, None),
    ("fits with room to spare", 79872, (), "20Gi", MPS_UP, None),
    ("one unit short", 19456, (), "20Gi", {},
     NO_ROOM.format(g=G2, free=19456, pending=0, mib=20480)),
    ("another claim's pending slice counts", 30720, ((OTHER, 20480),), "20Gi", {},
     NO_ROOM.format(g=G2, free=30720, pending=20480, mib=20480)),
    ("pending slices add up", 40960, ((OTHER, 10240), ("third", 20480)), "20Gi", {},
     NO_ROOM.format(g=G2, free=40960, pending=30720, mib=20480)),
    ("fits beside the pending", 40960, ((OTHER, 20480),), "20Gi", {}, None),
    ("the same claim prepared again: its own slice does not count", 20480, ((UID, 20480),), "20Gi",
     {}, None),
    ("its own does not count, another's does", 30720, ((UID, 20480), (OTHER, 20480)), "20Gi", {},
     NO_ROOM.format(g=G2, free=30720, pending=20480, mib=20480)),
    ("free memory unknown: not refused (as Allocate)", None, ((OTHER, 20480),), "20Gi", {}, None),
    ("a pending slice on another GPU does not count", 20480, (), "20Gi",
     {"pending": {G0: (PendingSlice(OTHER, 20480, 0.0, 81920),)}}, None),
]


@pytest.mark.parametrize(("free", "slices", "quantity", "extra", "reason"),
                         [c[1:] for c in LIVE_ROOM], ids=[c[0] for c in LIVE_ROOM])
def test_a_slice_fits_the_gpus_live_free_memory_less_the_pending(
        free: int | None, slices: tuple[tuple[str, int], ...], quantity: str, extra: dict[str, Any],
        reason: str | None) -> None:
    doc = claim(result("gpu-2", consumedCapacity={"memory": quantity}))
    f = facts(**{"pending": pending(*slices), **extra})
    if reason is None:
        (d,) = decide(doc, REF, shared(free), f).devices
        assert d.mib == capacity_mib(quantity)
    else:
        with pytest.raises(Refused) as refused:
            decide(doc, REF, shared(free), f)
        assert str(refused.value) == reason


def test_a_whole_gpu_is_not_judged_by_its_free_memory() -> None:
    """Only a slice has a size to fit: a whole GPU's free memory says nothing of the claim."""
    devices = (DraDevice("gpu-0", 0, None, G0, G0, None, False, 81559, 0),)
    (d,) = decide(claim(result("gpu-0")), REF, devices, facts()).devices
    assert d.device == "gpu-0"


def test_every_slice_of_a_claim_is_judged_on_its_own_gpu() -> None:
    """Without MPS a claim may hold slices of two shared GPUs: the second one is refused."""
    g4 = "GPU-00000004-7fda-b7ae-a94e-630097a14ca4"
    devices = (*shared(79872), DraDevice("gpu-4", 4, None, g4, g4, None, True, 79 * 1024, 8192,
                                         unit_mib=1024))  # fmt: skip
    doc = claim(result("gpu-2", consumedCapacity={"memory": "8Gi"}),
                result("gpu-4", request="b", consumedCapacity={"memory": "10Gi"}))
    with pytest.raises(Refused, match=r"device gpu-4: GPU 4 .* 8192 MiB free .* 0 MiB .* a slice "
                       r"of 10240 MiB does not fit"):
        decide(doc, REF, devices, facts())


def slice_at(mib: int, baseline: int | None, at_s: float = 0.0, uid: str = OTHER) -> PendingSlice:
    return PendingSlice(uid, mib, at_s, baseline)


# (case, the book, free MiB now, now_s, the slices still pending); settle_s 60
STILL_PENDING = [
    ("not shown yet", [slice_at(20480, 40960)], 40960, 10.0, [slice_at(20480, 40960)]),
    ("shown: the free memory dropped by it", [slice_at(20480, 40960)], 20480, 10.0, []),
    ("a drop short of it does not show it", [slice_at(20480, 40960)], 21504, 10.0,
     [slice_at(20480, 40960)]),
    ("aged out after settle_s", [slice_at(20480, 40960)], 40960, 60.0, []),
    ("the first of two shown, the second kept rebased",
     [slice_at(10240, 40960), slice_at(10240, 40960, 1.0, UID)], 30720, 10.0,
     [slice_at(10240, 30720, 1.0, UID)]),
    ("a later one is not shown before an earlier", [slice_at(10240, 40960), slice_at(10240, 30720, 1.0)],
     35840, 10.0, [slice_at(10240, 40960), slice_at(10240, 30720, 1.0)]),
    ("free memory unknown: every one counts", [slice_at(20480, 40960)], None, 10.0,
     [slice_at(20480, 40960)]),
    ("baseline unknown: counts until settle_s", [slice_at(20480, None)], 0, 10.0,
     [slice_at(20480, None)]),
]


@pytest.mark.parametrize(("book", "free_now", "now_s", "kept"),
                         [c[1:] for c in STILL_PENDING], ids=[c[0] for c in STILL_PENDING])
def test_slices_pending(book: list[PendingSlice], free_now: int | None, now_s: float,
                        kept: list[PendingSlice]) -> None:
    assert list(slices_pending(book, free_now, now_s, 60.0)) == kept


# -- the devices from a reading: the publisher's rule ----------------------------------------


def test_devices_from_a_real_reading() -> None:
    snap = snapshot(gpu(0), lost(1), gpu(2))
    devices = inventory(snap, assess(snap), Sharing(parse_shared_gpus("2"), 1024), 1024, 0.0)
    assert [d.name for d in devices] == [device_name(G0), device_name(G1), device_name(G2)]
    (d,) = decide(claim(result(device_name(G0))), REF, devices, facts()).devices
    assert d.uuid == G0
    with pytest.raises(Refused, match=f"{device_name(G1)} is unhealthy: lost"):
        decide(claim(result(device_name(G1))), REF, devices, facts())
    (s,) = decide(claim({**SLICE, "device": device_name(G2)}), REF, devices, facts(**MPS_UP)).devices
    assert s.mib == 20480


# -- the CDI spec ----------------------------------------------------------------------------





def test_cdi_spec_is_valid_cdi() -> None:
    prepared = decide(claim(SLICE), REF, DEVICES, facts(**MPS_UP))
    spec = cdi_spec(prepared, Path("/host/dev"))
    check_cdi(spec)
    assert spec["cdiVersion"] == CDI_VERSION == "0.6.0"
    assert spec["kind"] == CDI_KIND == "gpu.omaticaya.io/claim"
    (dev,) = spec["devices"]
    assert dev["name"] == f"{UID}-gpu-2"
    assert dev["containerEdits"]["deviceNodes"][0] == {
        "path": "/dev/nvidia2", "hostPath": "/host/dev/nvidia2", "type": "c", "major": 195, "minor": 2}
    assert dev["containerEdits"]["mounts"][1] == {
        "hostPath": f"/run/omaticaya/mps/slices/{claim_slice_id(UID, 'gpu-2')}/shm",
        "containerPath": "/dev/shm",
        "options": ["rw", "nosuid", "nodev", "bind"]}
    assert cdi_file_name(UID) == f"gpu.omaticaya.io-claim_{UID}.json"


def test_cdi_spec_of_whole_gpus_and_mig_is_valid_cdi() -> None:
    prepared = decide(claim(result("gpu-0"), result("gpu-3-mig-1")), REF, DEVICES, facts())
    spec = cdi_spec(prepared, Path("/dev"))
    check_cdi(spec)
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-0", f"{UID}-gpu-3-mig-1"]


# -- the health report -----------------------------------------------------------------------


def test_health_report() -> None:
    report = healthreport.report(DEVICES, known={"gpu-5", "gpu-0"})
    assert [(h.device, h.status, h.message) for h in report] == [
        ("gpu-0", healthreport.HEALTHY, ""),
        ("gpu-1", healthreport.UNHEALTHY, "xid-79"),
        ("gpu-2", healthreport.HEALTHY, ""),
        ("gpu-3-mig-1", healthreport.HEALTHY, ""),
        ("gpu-5", healthreport.UNKNOWN, "not in the reading"),
    ]


def test_health_report_without_a_reading_is_unknown() -> None:
    a, b = device_name("GPU-0000000a-7fda"), device_name("GPU-0000000b-7fda")
    report = healthreport.report(None, known={f"{b}-mig-1", b, f"{a}-mig-10", f"{a}-mig-2"},
                                 why_unknown="NVML cannot be read")  # fmt: skip
    assert [(h.device, h.status, h.message) for h in report] == [
        (f"{a}-mig-2", healthreport.UNKNOWN, "NVML cannot be read"),  # by GPU, then MIG index
        (f"{a}-mig-10", healthreport.UNKNOWN, "NVML cannot be read"),
        (b, healthreport.UNKNOWN, "NVML cannot be read"),
        (f"{b}-mig-1", healthreport.UNKNOWN, "NVML cannot be read"),
    ]


# -- the generated modules -------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None, reason="grpcio-tools (the test extra) missing"
)
def test_generated_modules_match_the_protos() -> None:
    # the interpreter running the tests, not the checkout's .venv (a copy of the tree, as
    # scripts/mutation runs in, has none)
    done = subprocess.run([str(REPO_ROOT / "scripts" / "gen-dra-proto"), "--check"],
                          env={**os.environ, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_grpc_service_names_are_the_kubelets() -> None:
    """The kubelet dials these exact paths (k8s.io/kubelet v0.37.2 api_grpc.pb.go)."""
    from omaticaya_py.dra.health.v1 import api_pb2 as h1
    from omaticaya_py.dra.health.v1alpha1 import api_pb2 as h0
    from omaticaya_py.dra.pluginregistration import api_pb2 as reg
    from omaticaya_py.dra.v1 import api_pb2 as dra

    assert [m.DESCRIPTOR.services_by_name[n].full_name for m, n in (
        (dra, "DRAPlugin"), (reg, "Registration"), (h1, "DRAResourceHealth"), (h0, "DRAResourceHealth"))] == [
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin", "pluginregistration.Registration",
        "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
    assert dra.Device.DESCRIPTOR.fields_by_name["share_id"].number == 5

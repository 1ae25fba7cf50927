"""Derive the MIG traces (format version 2) from the real H100 recording.

    python tests/data/make_mig_traces.py        # rewrites h100-mig-trace.json, mig-mixed-trace.json

Static facts, timings, temperatures, power and the load's memory come from `h100-trace.json`
(one H100 80GB HBM3, nvidia-ml-py 13.610, driver 580.159). The MIG layouts, slice counts,
multiprocessor and engine counts and instance memory sizes are those NVIDIA documents for the
H100 80GB (MIG user guide, "H100 MIG profiles": 1g.10gb = 1/8 of memory, 9.75 GiB, 16 SMs;
2g.20gb = 2/8, 19.62 GiB, 32 SMs; 3g.40gb = 4/8, 39.50 GiB, 60 SMs). With MIG on, NVML reports
no utilisation (NotSupported), so every MIG sample records it that way. Deterministic: the same
input gives byte-identical output, and tests check the files are current.
"""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path

HERE = Path(__file__).parent
MIB = 1 << 20
NOT_SUPPORTED = {"nvml_error": "NVMLError_NotSupported", "message": "Not Supported"}
IDLE_USED_MIB = 13  # what an empty MIG device reports used on an H100

#: profile -> nvmlDeviceAttributes_t of a MIG device of that profile on an H100 80GB
PROFILES = {
    "1g.10gb": dict(mp=16, ce=1, dec=1, jpg=1, slices=1, mib=9984),
    "2g.20gb": dict(mp=32, ce=2, dec=2, jpg=2, slices=2, mib=20096),
    "3g.40gb": dict(mp=60, ce=3, dec=3, jpg=3, slices=3, mib=40448),
}


def _attributes(profile: str) -> dict[str, int]:
    p = PROFILES[profile]
    return {
        "multiprocessor_count": p["mp"],
        "shared_copy_engine_count": p["ce"],
        "shared_decoder_count": p["dec"],
        "shared_encoder_count": 0,
        "shared_jpeg_count": p["jpg"],
        "shared_ofa_count": 0,
        "gpu_instance_slice_count": p["slices"],
        "compute_instance_slice_count": p["slices"],
        "memory_size_mb": p["mib"],
    }


def _mig_uuid(parent_uuid: str, gi: int) -> str:
    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"{parent_uuid}/gi/{gi}/ci/0"))


def _mig_devices(device: dict, layout: list[tuple[str, int]]) -> list[dict]:
    return [
        {
            "index": slot,
            "uuid": _mig_uuid(device["uuid"], gi),
            "name": f"{device['name']} MIG {profile}",
            "gpu_instance_id": gi,
            "compute_instance_id": 0,
            "attributes": _attributes(profile),
        }
        for slot, (profile, gi) in enumerate(layout)
    ]


def _mig_memory(profile: str, used_bytes: int) -> dict[str, int]:
    total = PROFILES[profile]["mib"] * MIB
    used = min(IDLE_USED_MIB * MIB + used_bytes, total)
    return {"total": total, "used": used, "free": total - used}


def _load_bytes(reading: dict) -> int:
    """Memory the recorded load held (v2 `used` excludes the driver's reservation)."""
    v2 = reading.get("memory_v2_bytes") or {}
    return int(v2.get("used", 0)) if "nvml_error" not in v2 else 0


def _mig_parent(reading: dict) -> dict:
    out = copy.deepcopy(reading)
    out["utilization_pct"] = dict(NOT_SUPPORTED)
    return out


def _header(src: dict, devices: list[dict], source: str) -> dict:
    return {
        "format_version": 2,
        "source": source,
        "driver_version": src["driver_version"],
        "nvml_version": src["nvml_version"],
        "cuda_driver_version": src["cuda_driver_version"],
        "device_count": len(devices),
        "devices": devices,
        "interval_s": src["interval_s"],
        "phases": src["phases"],
    }


def h100_mig(src: dict) -> dict:
    """One H100, MIG on: 3g.40gb + 2g.20gb + 2g.20gb; the recorded load runs in the 3g.40gb."""
    layout = [("3g.40gb", 2), ("2g.20gb", 3), ("2g.20gb", 5)]
    device = copy.deepcopy(src["devices"][0])
    device["mig_mode"] = [1, 1]
    device["max_mig_device_count"] = 7
    device["mig_devices"] = _mig_devices(device, layout)
    samples = []
    for s in src["samples"]:
        g = s["gpus"][0]
        parent = _mig_parent(g)
        load = _load_bytes(g)
        parent["mig_devices"] = [
            {
                "index": slot,
                "memory_bytes": _mig_memory(profile, load if slot == 0 else 0),
                "compute_processes": copy.deepcopy(g["compute_processes"]) if slot == 0 else [],
            }
            for slot, (profile, _) in enumerate(layout)
        ]
        samples.append({"t": s["t"], "gpus": [parent]})
    doc = _header(src, [device], "derived from h100-trace.json: MIG 3g.40gb+2g.20gb+2g.20gb")
    doc["samples"] = samples
    return doc


def mig_mixed(src: dict) -> dict:
    """Two H100s: GPU 0 in seven 1g.10gb (a 6 GiB load in MIG device 3), GPU 1 whole (the
    recorded load). MIG device 5 cannot be read for t in [8, 11); Xid 79 on GPU 0 at t >= 20."""
    layout = [("1g.10gb", gi) for gi in range(7, 14)]
    gpu0 = copy.deepcopy(src["devices"][0])
    gpu0["mig_mode"] = [1, 1]
    gpu0["max_mig_device_count"] = 7
    gpu0["mig_devices"] = _mig_devices(gpu0, layout)
    gpu1 = copy.deepcopy(src["devices"][0])
    gpu1.update(
        index=1,
        uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, gpu0["uuid"] + "/1")),
        pci_bus_id="00000000:00:07.0",
        mig_mode=[0, 0],
    )
    samples = []
    xid_sent = False
    for s in src["samples"]:
        g = s["gpus"][0]
        load = min(_load_bytes(g), 6 << 30)
        parent = _mig_parent(g)
        parent["mig_devices"] = []
        for slot, (profile, _) in enumerate(layout):
            if slot == 5 and 8.0 <= s["t"] < 11.0:
                parent["mig_devices"].append(
                    {"index": slot, "nvml_error": "NVMLError_Unknown", "message": "Unknown Error"}
                )
                continue
            parent["mig_devices"].append(
                {
                    "index": slot,
                    "memory_bytes": _mig_memory(profile, load if slot == 3 else 0),
                    "compute_processes": copy.deepcopy(g["compute_processes"]) if slot == 3 else [],
                }
            )
        whole = copy.deepcopy(g)
        whole["index"] = 1
        sample = {"t": s["t"], "gpus": [parent, whole]}
        if s["t"] >= 20.0 and not xid_sent:
            sample["xid_events"] = [{"index": 0, "xid": 79}]
            xid_sent = True
        samples.append(sample)
    doc = _header(
        src, [gpu0, gpu1], "derived from h100-trace.json: GPU 0 MIG 7x1g.10gb, GPU 1 whole"
    )
    doc["samples"] = samples
    return doc


TRACES = {"h100-mig-trace.json": h100_mig, "mig-mixed-trace.json": mig_mixed}


def render_all() -> dict[str, str]:
    """file name -> the JSON text it must hold."""
    src = json.loads((HERE / "h100-trace.json").read_text())
    return {name: json.dumps(make(src), indent=1) + "\n" for name, make in TRACES.items()}


if __name__ == "__main__":
    for name, text in render_all().items():
        (HERE / name).write_text(text)
        print(f"wrote {HERE / name} ({len(text)} bytes)")

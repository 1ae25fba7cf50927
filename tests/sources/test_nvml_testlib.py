"""The NVML test library (tests/nvml/) through the real, unmodified ``pynvml`` and the real
``NvmlReader``, in subprocesses (``tests.nvmltestlib.NvmlWorker``): the test library is never
loaded into the pytest process, whose NVML stays the real one on a GPU machine.

Expected values are computed from the trace JSON here, not through omaticaya's TraceReader.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pynvml
import pytest

from omaticaya_py.core.model.snapshot import ARCHITECTURES
from tests.helpers import DATA
from tests.helpers import FAULTS_TRACE as FAULTS
from tests.helpers import H100_TRACE as H100
from tests.helpers import MULTI_TRACE as MULTI
from tests.nvmltestlib import (  # noqa: F401  (fixtures: testlib, nvml_worker)
    build_testlib,
    nvml_worker_fixture,
    testlib_fixture,
)
from tests.waiting import wait_for

MIB = 1024 * 1024
NOT_SUPPORTED = {"nvml_error": "NVMLError_NotSupported", "message": "Not Supported"}


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def reading(trace: dict[str, Any], index: int, gpu: int) -> dict[str, Any]:
    return next(g for g in trace["samples"][index]["gpus"] if g["index"] == gpu)


def handle(i: int) -> dict[str, int]:
    return {"handle": i}


# -- a tiny trace for utilisation and MIG --------------------------------------------------


def _gpu_reading(index: int, util: Any, mig: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {
        "index": index,
        "memory_bytes": {"total": 80 * 1024 * MIB, "used": 1024 * MIB, "free": 79 * 1024 * MIB},
        "utilization_pct": util,
        "temperature_c": 40 + index,
        "power_mw": 100000,
        "performance_state": 0,
        "ecc_uncorrected_volatile": 0,
        "ecc_corrected_volatile": 3,
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0},
        "compute_processes": [],
    }
    if mig is not None:
        r["mig_devices"] = mig
    return r


def _device(index: int, mig: bool) -> dict[str, Any]:
    d: dict[str, Any] = {
        "index": index,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-{index:08d}-0000-0000-0000-000000000000",
        "serial": f"16538230547{index}",
        "architecture": 9,
        "cuda_compute_capability": [9, 0],
        "mig_mode": [1, 1] if mig else [0, 0],
    }
    if mig:
        d["max_mig_device_count"] = 7
        d["mig_devices"] = [
            {
                "index": slot,
                "uuid": f"MIG-{slot:08d}-aaaa-bbbb-cccc-dddddddddddd",
                "name": f"NVIDIA H100 80GB HBM3 MIG {'3g.40gb' if slot == 0 else '2g.20gb'}",
                "gpu_instance_id": 2 + slot,
                "compute_instance_id": 0,
                "attributes": {
                    "multiprocessor_count": 60 if slot == 0 else 32,
                    "shared_copy_engine_count": 3,
                    "shared_decoder_count": 3,
                    "shared_encoder_count": 0,
                    "shared_jpeg_count": 3,
                    "shared_ofa_count": 0,
                    "gpu_instance_slice_count": 3 if slot == 0 else 2,
                    "compute_instance_slice_count": 3 if slot == 0 else 2,
                    "memory_size_mb": 40448 if slot == 0 else 20096,
                },
            }
            for slot in (0, 2)  # slot 1 empty
        ]
    return d


def _mig_readings(k: int) -> list[dict[str, Any]]:
    return [
        {
            "index": 0,
            "memory_bytes": {
                "total": 40448 * MIB,
                "used": (100 + k) * MIB,
                "free": (40348 - k) * MIB,
            },
            "compute_processes": [{"pid": 4242, "usedGpuMemory": (80 + k) * MIB}],
        },
        {"index": 2, "nvml_error": "NVMLError_Unknown", "message": "Unknown Error"}
        if k == 3
        else {
            "index": 2,
            "memory_bytes": {"total": 20096 * MIB, "used": 13 * MIB, "free": 20083 * MIB},
            "compute_processes": [],
        },
    ]


UTILS = [10, 20, 35, 55, 80, 5]


def make_trace(path: Path) -> Path:
    """Version 2: GPU 0 with MIG (slots 0 and 2), GPU 1 whole with the utilisations UTILS."""
    doc = {
        "format_version": 2,
        "source": "synthetic, tests/sources/test_nvml_testlib.py",
        "driver_version": "580.159.04",
        "nvml_version": "13.580.159.04",
        "cuda_driver_version": 13000,
        "device_count": 2,
        "devices": [_device(0, True), _device(1, False)],
        "interval_s": 1.0,
        "samples": [
            {
                "t": float(k),
                "gpus": [
                    _gpu_reading(0, NOT_SUPPORTED, _mig_readings(k)),
                    _gpu_reading(1, {"gpu": u, "memory": u // 2}),
                ],
            }
            for k, u in enumerate(UTILS)
        ],
    }
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def sample_file(tmp_path: Path) -> Path:
    return tmp_path / "sample"


# -- the library itself ---------------------------------------------------------------------


def _pointer_names(wrapper: str, source: str, seen: set[str] | None = None) -> set[str]:
    """The C symbols pynvml's wrapper ``wrapper`` resolves, following wrappers it calls."""
    seen = seen if seen is not None else set()
    if wrapper in seen:
        return set()
    seen.add(wrapper)
    m = re.search(rf"^def {wrapper}\(.*?(?=^\S)", source, re.S | re.M)
    assert m, wrapper
    body = m.group(0)
    names = set(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', body))
    for callee in set(re.findall(r"\b(nvml\w+)\(", body)) - {wrapper}:
        if re.search(rf"^def {callee}\(", source, re.M):
            names |= _pointer_names(callee, source, seen)
    return names


def test_exports_every_symbol_the_reader_resolves(testlib: Path) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) to list the library's symbols")
    out = subprocess.run(
        [nm, "-D", "--defined-only", str(testlib / "libnvidia-ml.so.1")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.strip()}
    reader_dir = Path(__file__).resolve().parents[2] / "omaticaya_py" / "sources" / "nvml"
    reader_src = "".join(p.read_text() for p in sorted(reader_dir.glob("*.py")))
    pynvml_src = Path(pynvml.__file__).read_text()
    wrappers = {
        w
        for w in re.findall(r"pynvml\.(nvml[A-Z]\w+)", reader_src)
        if re.search(rf"^def {w}\(", pynvml_src, re.M)
    }
    needed: set[str] = set()
    for w in wrappers:
        needed |= _pointer_names(w, pynvml_src)
    assert "nvmlInitWithFlags" in needed and "nvmlEventSetWait_v2" in needed
    assert needed - exported == set()
    soname = (
        subprocess.run(
            ["readelf", "-d", str(testlib / "libnvidia-ml.so.1")], capture_output=True, text=True
        ).stdout
        if shutil.which("readelf")
        else "libnvidia-ml.so.1"
    )
    assert "libnvidia-ml.so.1" in soname


def test_build_is_cached(testlib: Path) -> None:
    assert build_testlib() == testlib
    assert (testlib / "libnvidia-ml.so.1").is_file()


def test_uninitialized_refcount_and_error_strings(nvml_worker, sample_file: Path) -> None:
    w = nvml_worker(H100, sample_file, reader=False)
    assert w.pynvml("nvmlDeviceGetCount") == {"error": "NVMLError_Uninitialized"}
    assert w.pynvml("nvmlSystemGetDriverVersion") == {"error": "NVMLError_Uninitialized"}
    assert w.call("nvmlInit") is None
    assert w.call("nvmlInit") is None
    assert w.call("nvmlDeviceGetCount") == 1
    assert w.call("nvmlShutdown") is None
    assert w.call("nvmlDeviceGetCount") == 1  # refcounted: one init left
    assert w.call("nvmlShutdown") is None
    assert w.pynvml("nvmlDeviceGetCount") == {"error": "NVMLError_Uninitialized"}
    assert w.pynvml("nvmlShutdown") == {"error": "NVMLError_Uninitialized"}
    # nvmlErrorString answers without init, with NVML's strings
    for code, text in [
        (1, "Uninitialized"),
        (3, "Not Supported"),
        (15, "GPU is lost"),
        (999, "Unknown Error"),
    ]:
        assert w.call("nvmlErrorString", code) == text


def test_no_trace_is_a_machine_without_driver(nvml_worker) -> None:
    w = nvml_worker(None, reader=False)
    assert w.pynvml("nvmlInit") == {"error": "NVMLError_DriverNotLoaded"}
    assert w.pynvml("nvmlDeviceGetCount") == {"error": "NVMLError_Uninitialized"}


def test_structs_round_trip_trace_values(nvml_worker, sample_file: Path) -> None:
    trace = load(MULTI)
    k = 7
    w = nvml_worker(MULTI, sample_file, reader=False)
    w.advance(k)
    w.call("nvmlInit")
    assert w.call("nvmlSystemGetDriverVersion") == trace["driver_version"]
    assert w.call("nvmlSystemGetNVMLVersion") == trace["nvml_version"]
    assert w.call("nvmlSystemGetCudaDriverVersion_v2") == trace["cuda_driver_version"]
    assert w.call("nvmlSystemGetCudaDriverVersion") == trace["cuda_driver_version"]
    assert w.call("nvmlDeviceGetCount") == trace["device_count"]
    for dev in trace["devices"]:
        i = dev["index"]
        r = reading(trace, k, i)
        h = handle(i)
        assert w.call("nvmlDeviceGetIndex", h) == i
        assert w.call("nvmlDeviceGetName", h) == dev["name"]
        assert w.call("nvmlDeviceGetUUID", h) == dev["uuid"]
        assert w.call("nvmlDeviceGetSerial", h) == dev["serial"]
        assert w.call("nvmlDeviceGetArchitecture", h) == dev["architecture"]
        assert w.call("nvmlDeviceGetCudaComputeCapability", h) == dev["cuda_compute_capability"]
        mem = w.call("nvmlDeviceGetMemoryInfo", h)  # {total, free, used}
        assert mem == r["memory_bytes"]
        mem2 = w.call("nvmlDeviceGetMemoryInfo", h, pynvml.nvmlMemory_v2)
        assert mem2 == r["memory_v2_bytes"]
        assert w.call("nvmlDeviceGetUtilizationRates", h) == r["utilization_pct"]
        assert (
            w.call("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU) == r["temperature_c"]
        )
        assert w.call("nvmlDeviceGetPowerUsage", h) == r["power_mw"]
        assert w.call("nvmlDeviceGetTotalEnergyConsumption", h) == r["total_energy_mj"]
        assert w.call("nvmlDeviceGetPerformanceState", h) == r["performance_state"]
        assert w.call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM) == r["clock_sm_mhz"]
        assert w.call("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM) == r["clock_mem_mhz"]
        assert w.call("nvmlDeviceGetCurrentClocksEventReasons", h) == r["clocks_event_reasons"]
        assert w.pynvml("nvmlDeviceGetFanSpeed", h) == {"error": "NVMLError_NotSupported"}
        for etype, ctype, key in [
            (1, 0, "ecc_uncorrected_volatile"),
            (0, 0, "ecc_corrected_volatile"),
            (1, 1, "ecc_uncorrected_aggregate"),
        ]:
            assert w.call("nvmlDeviceGetTotalEccErrors", h, etype, ctype) == r[key]
        assert w.pynvml("nvmlDeviceGetTotalEccErrors", h, 0, 1) == {
            "error": "NVMLError_NotSupported"
        }
        rows = r["remapped_rows"]
        assert w.call("nvmlDeviceGetRemappedRows", h) == [
            rows["correctable"],
            rows["uncorrectable"],
            rows["pending"],
            rows["failure"],
        ]
        assert w.pynvml("nvmlDeviceGetRetiredPages", h, 1) == {"error": "NVMLError_NotSupported"}
        procs = w.call("nvmlDeviceGetComputeRunningProcesses", h)
        assert [(p["pid"], p["usedGpuMemory"]) for p in procs] == [
            (p["pid"], p["usedGpuMemory"]) for p in r["compute_processes"]
        ]
        assert all(p["gpuInstanceId"] == p["computeInstanceId"] == 0xFFFFFFFF for p in procs)
        # handles: stable, and the same by UUID
        assert w.call("nvmlDeviceGetHandleByUUID", dev["uuid"]) == w.call(
            "nvmlDeviceGetHandleByIndex", i
        )
        assert w.call("nvmlDeviceIsMigDeviceHandle", h) == 0
        assert w.call("nvmlDeviceGetMigMode", h) == dev["mig_mode"]
        assert w.call("nvmlDeviceGetTopologyCommonAncestor", h, h) == pynvml.NVML_TOPOLOGY_INTERNAL
    assert w.call("nvmlDeviceGetTopologyCommonAncestor", handle(0), handle(1)) == 50
    assert w.pynvml("nvmlDeviceGetHandleByUUID", "GPU-nope") == {"error": "NVMLError_NotFound"}


def test_handles_stable_across_shutdown(nvml_worker, sample_file: Path) -> None:
    w = nvml_worker(MULTI, sample_file, reader=False)
    w.call("nvmlInit")
    before = [w.call("nvmlDeviceGetHandleByIndex", i) for i in range(8)]
    assert len({h["address"] for h in before}) == 8
    w.call("nvmlShutdown")
    w.call("nvmlInit")
    assert [w.call("nvmlDeviceGetHandleByIndex", i) for i in range(8)] == before


def test_two_call_protocols_and_short_buffers(nvml_worker, sample_file: Path) -> None:
    trace = load(MULTI)
    w = nvml_worker(MULTI, sample_file, reader=False)
    w.advance(3)
    w.call("nvmlInit")
    name = trace["devices"][1]["name"]
    assert w.raw("nvmlDeviceGetName", 1, length=len(name)) == {"ret": 7, "value": ""}
    assert w.raw("nvmlDeviceGetName", 1, length=len(name) + 1) == {"ret": 0, "value": name}
    uuid = trace["devices"][1]["uuid"]
    assert w.raw("nvmlDeviceGetUUID", 1, length=10)["ret"] == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert w.raw("nvmlDeviceGetUUID", 1, length=96) == {"ret": 0, "value": uuid}
    n = len(reading(trace, 3, 1)["compute_processes"])
    assert n >= 1
    fn = "nvmlDeviceGetComputeRunningProcesses_v3"
    assert w.raw(fn, 1, count=None) == {"ret": pynvml.NVML_ERROR_INSUFFICIENT_SIZE, "count": n}
    assert w.raw(fn, 1, count=n - 1) == {"ret": pynvml.NVML_ERROR_INSUFFICIENT_SIZE, "count": n}
    assert w.raw(fn, 1, count=n + 3) == {"ret": 0, "count": n}
    empty = next(g["index"] for g in trace["samples"][3]["gpus"] if not g["compute_processes"])
    assert w.raw(fn, empty, count=None) == {"ret": 0, "count": 0}


def test_samples_newer_than_last_seen(nvml_worker, sample_file: Path) -> None:
    trace = load(H100)
    k = 10
    w = nvml_worker(H100, sample_file, reader=False)
    w.advance(k)
    w.call("nvmlInit")
    vtype, samples = w.call(
        "nvmlDeviceGetSamples", handle(0), pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0
    )
    assert vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert [s["sampleValue"]["uiVal"] for s in samples] == [
        reading(trace, i, 0)["utilization_pct"]["gpu"] for i in range(k + 1)
    ]
    stamps = [s["timeStamp"] for s in samples]
    base = stamps[0] - round(trace["samples"][0]["t"] * 1e6)
    assert stamps == [base + round(trace["samples"][i]["t"] * 1e6) for i in range(k + 1)]
    last = stamps[-1]
    assert w.pynvml("nvmlDeviceGetSamples", handle(0), 1, last) == {"error": "NVMLError_NotFound"}
    _, fresh = w.call("nvmlDeviceGetSamples", handle(0), 1, stamps[-3])
    assert [s["timeStamp"] for s in fresh] == stamps[-2:]
    w.advance(k + 2)
    _, newer = w.call("nvmlDeviceGetSamples", handle(0), 1, last)
    assert [s["sampleValue"]["uiVal"] for s in newer] == [
        reading(trace, i, 0)["utilization_pct"]["gpu"] for i in (k + 1, k + 2)
    ]


def test_every_error_name_maps_to_its_code(nvml_worker, tmp_path: Path, sample_file: Path) -> None:
    codes = {
        name: getattr(pynvml, name)
        for name in dir(pynvml)
        if name.startswith("NVML_ERROR_") and isinstance(getattr(pynvml, name), int)
    }
    classes = [type(pynvml.NVMLError(code)).__name__ for code in codes.values()]
    classes.append("NVMLError_SomethingNew")  # unknown -> NVML_ERROR_UNKNOWN
    doc = json.loads(make_trace(tmp_path / "t.json").read_text())
    template = doc["samples"][0]
    doc["samples"] = []
    for k, cls in enumerate(classes):
        s = json.loads(json.dumps(template))
        s["t"] = float(k)
        s["gpus"][1]["power_mw"] = {"nvml_error": cls, "message": "x"}
        doc["samples"].append(s)
    trace = tmp_path / "errors.json"
    trace.write_text(json.dumps(doc))
    w = nvml_worker(trace, sample_file, reader=False)
    w.call("nvmlInit")
    for k, cls in enumerate(classes):
        w.advance(k)
        expected = cls if cls != "NVMLError_SomethingNew" else "NVMLError_Unknown"
        assert w.pynvml("nvmlDeviceGetPowerUsage", handle(1)) == {"error": expected}, cls
        assert w.call("nvmlDeviceGetTemperature", handle(1), 0) == 41  # other fields unharmed


def test_event_set_delivers_xid_once(nvml_worker, sample_file: Path) -> None:
    w = nvml_worker(FAULTS, sample_file, reader=False)
    w.call("nvmlInit")
    w.create_event_set("s")
    for i in range(4):
        w.call(
            "nvmlDeviceRegisterEvents",
            handle(i),
            pynvml.nvmlEventTypeXidCriticalError,
            {"event_set": "s"},
        )
    assert w.pynvml("nvmlEventSetWait_v2", {"event_set": "s"}, 50) == {"error": "NVMLError_Timeout"}
    w.advance(20)  # passes Xid 13 (sample 5, GPU 1) and lands on Xid 79 (sample 20, GPU 2)
    first = w.call("nvmlEventSetWait_v2", {"event_set": "s"}, 5000)
    second = w.call("nvmlEventSetWait_v2", {"event_set": "s"}, 5000)
    assert (first["eventData"], second["eventData"]) == (13, 79)
    assert first["device"] == w.call("nvmlDeviceGetHandleByIndex", 1)
    assert second["device"] == w.call("nvmlDeviceGetHandleByIndex", 2)
    assert second["eventType"] == pynvml.nvmlEventTypeXidCriticalError
    assert second["gpuInstanceId"] == second["computeInstanceId"] == 0xFFFFFFFF
    assert w.pynvml("nvmlEventSetWait_v2", {"event_set": "s"}, 50) == {"error": "NVMLError_Timeout"}
    assert w.call("nvmlEventSetFree", {"event_set": "s"}) is None


@pytest.mark.parametrize("how", ["free", "shutdown"])
def test_event_wait_woken_by_free_or_shutdown(nvml_worker, sample_file: Path, how: str) -> None:
    w = nvml_worker(FAULTS, sample_file, reader=False)
    answer = w.request({"cmd": "wake", "how": how})
    assert answer["waiter"] == "NVMLError_Uninitialized"
    assert answer["waited_s"] < 25  # woken, not timed out (the wait asked for 30 s)
    assert w.pynvml("nvmlDeviceGetCount") == {"error": "NVMLError_Uninitialized"}


# -- the reader on the test library ---------------------------------------------------------


def expected_gpu(trace: dict[str, Any], k: int, gpu: int, since: int) -> dict[str, Any]:
    """The GpuReading fields the reader should give at sample k, utilisation averaged over the
    samples (since, k]."""
    dev = next(d for d in trace["devices"] if d["index"] == gpu)
    r = reading(trace, k, gpu)
    utils = [reading(trace, i, gpu)["utilization_pct"]["gpu"] for i in range(since + 1, k + 1)]

    def value(key: str) -> Any:
        v = r.get(key)
        return None if isinstance(v, dict) and "nvml_error" in v else v

    power = value("power_mw")
    return {
        "index": gpu,
        "uuid": dev["uuid"],
        "product": dev["name"],
        "architecture": ARCHITECTURES.get(dev["architecture"]),
        "compute_major": dev["cuda_compute_capability"][0],
        "compute_minor": dev["cuda_compute_capability"][1],
        "memory_total_mib": r["memory_bytes"]["total"] // MIB,
        "memory_used_mib": r["memory_bytes"]["used"] // MIB,
        "memory_free_mib": r["memory_bytes"]["free"] // MIB,
        "utilization_pct": sum(utils) / len(utils),
        "memory_utilization_pct": float(r["utilization_pct"]["memory"]),
        "temperature_c": value("temperature_c"),
        "power_w": power / 1000.0 if power is not None else None,
        "performance_state": value("performance_state"),
        "ecc_uncorrected_volatile": value("ecc_uncorrected_volatile"),
        "ecc_corrected_volatile": value("ecc_corrected_volatile"),
        "remapped_rows_pending": bool(r["remapped_rows"]["pending"]),
        "remapped_rows_failure": bool(r["remapped_rows"]["failure"]),
        "process_count": len(r["compute_processes"]),
        "error": None,
    }


def test_reader_reading_equals_trace(nvml_worker, sample_file: Path) -> None:
    trace = load(MULTI)
    w = nvml_worker(MULTI, sample_file, watch_xid=False)
    w.advance(4)
    snap = w.read()
    assert snap["error"] is None
    assert snap["driver_version"] == trace["driver_version"]
    assert snap["cuda_driver_version"] == [13, 0]
    assert len(snap["gpus"]) == trace["device_count"]
    for g in snap["gpus"]:
        exp = expected_gpu(trace, 4, g["index"], since=-1)
        assert {k: g[k] for k in exp} == exp, g["index"]
    w.advance(9)
    snap = w.read()
    for g in snap["gpus"]:
        exp = expected_gpu(trace, 9, g["index"], since=4)
        assert {k: g[k] for k in exp} == exp, g["index"]
    assert snap["errors"] == []  # fan speed / retired pages NotSupported: not counted


def test_reader_not_supported_fields_absent_not_counted(nvml_worker, sample_file: Path) -> None:
    trace = load(FAULTS)
    assert reading(trace, 1, 0)["power_mw"]["nvml_error"] == "NVMLError_NotSupported"
    w = nvml_worker(FAULTS, sample_file, watch_xid=False)
    w.advance(1)
    snap = w.read()
    gpu0 = snap["gpus"][0]
    assert gpu0["power_w"] is None and gpu0["error"] is None
    assert gpu0["temperature_c"] == reading(trace, 1, 0)["temperature_c"]
    assert snap["gpus"][1]["power_w"] == reading(trace, 1, 1)["power_mw"] / 1000.0
    assert snap["errors"] == []


def test_reader_gpu_lost_mid_run_and_back(nvml_worker, sample_file: Path) -> None:
    w = nvml_worker(FAULTS, sample_file, watch_xid=False)
    w.advance(23)
    assert [g["error"] for g in w.read()["gpus"]] == [None] * 4
    w.advance(24)
    snap = w.read()
    assert snap["error"] is None
    assert [g["error"] for g in snap["gpus"]] == [None, None, None, "NVMLError_GpuIsLost"]
    assert snap["gpus"][3]["uuid"] == "GPU-00000003-7fda-b7ae-a94e-630097a14ca4"
    assert snap["gpus"][3]["memory_used_mib"] is None
    # counted once, by the read's first call: its MIG mode, asked on every read (issue 48)
    assert snap["errors"] == [["nvmlDeviceGetMigMode", "NVMLError_GpuIsLost", 1]]
    w.advance(28)
    assert [g["error"] for g in w.read()["gpus"]] == [None] * 4


def test_reader_driver_gone_and_back_without_restart(nvml_worker, sample_file: Path) -> None:
    trace = load(FAULTS)
    w = nvml_worker(FAULTS, sample_file, watch_xid=True)
    w.advance(31)
    assert w.read()["error"] is None
    w.advance(32)
    gone = w.read()
    assert gone["error"] == "NVMLError_DriverNotLoaded" and gone["gpus"] == []
    w.advance(33)
    assert w.read()["error"] == "NVMLError_DriverNotLoaded"  # nvmlInit fails too
    back = next(i for i, s in enumerate(trace["samples"]) if i > 33 and "gpus" in s and s["gpus"])
    w.advance(back)
    snap = w.read()
    assert snap["error"] is None
    assert [g["error"] for g in snap["gpus"]] == [None] * 4
    assert snap["gpus"][0]["temperature_c"] == reading(trace, back, 0)["temperature_c"]


def test_reader_xid_from_watcher_thread(nvml_worker, sample_file: Path) -> None:
    w = nvml_worker(FAULTS, sample_file, watch_xid=True)
    assert w.read()["xid_events"] == []
    w.advance(20)
    seen: list[dict[str, Any]] = []

    def got_79() -> bool:
        seen.extend(w.read()["xid_events"])
        return any(e["xid"] == 79 for e in seen)

    wait_for("Xid 79 on the watcher", got_79, 20)
    assert {(e["index"], e["xid"]) for e in seen} == {(1, 13), (2, 79)}
    assert w.read()["xid_events"] == []  # delivered once


def test_reader_utilisation_mean_since_previous_read(
    nvml_worker, tmp_path: Path, sample_file: Path
) -> None:
    trace = make_trace(tmp_path / "t.json")
    w = nvml_worker(trace, sample_file, watch_xid=False)
    first = w.read()["gpus"][1]
    assert first["utilization_pct"] == UTILS[0]
    w.advance(4)
    assert w.read()["gpus"][1]["utilization_pct"] == sum(UTILS[1:5]) / 4
    # nothing newer: the reader falls back to nvmlDeviceGetUtilizationRates (the current value)
    assert w.read()["gpus"][1]["utilization_pct"] == UTILS[4]
    w.advance(5)
    assert w.read()["gpus"][1]["utilization_pct"] == UTILS[5]


def test_wall_clock_mode_moves_through_the_trace(nvml_worker) -> None:
    trace = load(H100)
    w = nvml_worker(H100, None, speed=20.0, reader=False)
    w.call("nvmlInit")
    temps = {r["temperature_c"] for s in trace["samples"] for r in s["gpus"]}
    assert len(temps) > 1
    first = w.call("nvmlDeviceGetTemperature", handle(0), 0)
    wait_for("the temperature to change", lambda: w.call("nvmlDeviceGetTemperature", handle(0), 0) != first, 30)


# -- MIG ------------------------------------------------------------------------------------


def test_mig_functions(nvml_worker, tmp_path: Path, sample_file: Path) -> None:
    path = make_trace(tmp_path / "mig.json")
    doc = load(path)
    w = nvml_worker(path, sample_file, reader=False)
    w.advance(1)
    w.call("nvmlInit")
    gpu = handle(0)
    assert w.call("nvmlDeviceGetMigMode", gpu) == [1, 1]
    assert w.call("nvmlDeviceGetMaxMigDeviceCount", gpu) == 7
    assert w.pynvml("nvmlDeviceGetMigDeviceHandleByIndex", gpu, 1) == {
        "error": "NVMLError_NotFound"
    }
    assert w.pynvml("nvmlDeviceGetMigDeviceHandleByIndex", gpu, 7) == {
        "error": "NVMLError_InvalidArgument"
    }
    assert w.pynvml("nvmlDeviceGetMigDeviceHandleByIndex", handle(1), 0) == {
        "error": "NVMLError_NotSupported"
    }
    parent = w.call("nvmlDeviceGetHandleByIndex", 0)
    for facts in doc["devices"][0]["mig_devices"]:
        mig = {"mig": [0, facts["index"]]}
        addr = w.call("nvmlDeviceGetMigDeviceHandleByIndex", gpu, facts["index"])
        assert w.call("nvmlDeviceGetMigDeviceHandleByIndex", gpu, facts["index"]) == addr
        assert w.call("nvmlDeviceGetHandleByUUID", facts["uuid"]) == addr
        assert w.call("nvmlDeviceIsMigDeviceHandle", mig) == 1
        assert w.call("nvmlDeviceGetIndex", mig) == facts["index"]
        assert w.call("nvmlDeviceGetGpuInstanceId", mig) == facts["gpu_instance_id"]
        assert w.call("nvmlDeviceGetComputeInstanceId", mig) == facts["compute_instance_id"]
        assert w.call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", mig) == parent
        assert w.call("nvmlDeviceGetName", mig) == facts["name"]
        assert w.call("nvmlDeviceGetUUID", mig) == facts["uuid"]
        a = facts["attributes"]
        assert w.call("nvmlDeviceGetAttributes_v2", mig) == {
            "multiprocessorCount": a["multiprocessor_count"],
            "sharedCopyEngineCount": a["shared_copy_engine_count"],
            "sharedDecoderCount": a["shared_decoder_count"],
            "sharedEncoderCount": a["shared_encoder_count"],
            "sharedJpegCount": a["shared_jpeg_count"],
            "sharedOfaCount": a["shared_ofa_count"],
            "gpuInstanceSliceCount": a["gpu_instance_slice_count"],
            "computeInstanceSliceCount": a["compute_instance_slice_count"],
            "memorySizeMB": a["memory_size_mb"],
        }
        r = next(m for m in reading(doc, 1, 0)["mig_devices"] if m["index"] == facts["index"])
        assert w.call("nvmlDeviceGetMemoryInfo", mig) == r["memory_bytes"]
        procs = w.call("nvmlDeviceGetComputeRunningProcesses", mig)
        assert [(p["pid"], p["usedGpuMemory"]) for p in procs] == [
            (p["pid"], p["usedGpuMemory"]) for p in r["compute_processes"]
        ]
        assert all(p["gpuInstanceId"] == facts["gpu_instance_id"] for p in procs)
        for fn, args in [
            ("nvmlDeviceGetTemperature", (0,)),
            ("nvmlDeviceGetPowerUsage", ()),
            ("nvmlDeviceGetRemappedRows", ()),
            ("nvmlDeviceGetTotalEccErrors", (1, 0)),
            ("nvmlDeviceGetUtilizationRates", ()),
        ]:
            assert w.pynvml(fn, mig, *args) == {"error": "NVMLError_NotSupported"}, fn
    # the parent with MIG on: no utilisation, no samples; non-MIG handles
    assert w.pynvml("nvmlDeviceGetUtilizationRates", gpu) == {"error": "NVMLError_NotSupported"}
    assert w.pynvml("nvmlDeviceGetSamples", gpu, 1, 0) == {"error": "NVMLError_NotSupported"}
    assert w.call("nvmlDeviceGetTemperature", gpu, 0) == 40
    assert w.pynvml("nvmlDeviceGetAttributes_v2", gpu) == {"error": "NVMLError_NotSupported"}
    assert w.pynvml("nvmlDeviceGetGpuInstanceId", gpu) == {"error": "NVMLError_NotSupported"}
    assert w.pynvml("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", gpu) == {
        "error": "NVMLError_InvalidArgument"
    }
    # a MIG device that cannot be read in one sample
    w.advance(3)
    assert w.pynvml("nvmlDeviceGetMemoryInfo", {"mig": [0, 2]}) == {"error": "NVMLError_Unknown"}
    assert w.call("nvmlDeviceGetMemoryInfo", {"mig": [0, 0]})["used"] == 103 * MIB


@pytest.mark.parametrize("name", ["h100-mig-trace.json", "mig-mixed-trace.json"])
def test_shipped_mig_traces(nvml_worker, sample_file: Path, name: str) -> None:
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{name} not written yet")
    doc = load(path)
    k = len(doc["samples"]) // 2
    w = nvml_worker(path, sample_file, reader=False)
    w.advance(k)
    w.call("nvmlInit")
    for dev in doc["devices"]:
        h = handle(dev["index"])
        if dev.get("mig_mode", [0, 0])[0] != 1:
            assert w.pynvml("nvmlDeviceGetMigDeviceHandleByIndex", h, 0) == {
                "error": "NVMLError_NotSupported"
            }
            continue
        assert w.call("nvmlDeviceGetMaxMigDeviceCount", h) == dev["max_mig_device_count"]
        parent = reading(doc, k, dev["index"])
        for facts in dev["mig_devices"]:
            mig = {"mig": [dev["index"], facts["index"]]}
            assert w.call("nvmlDeviceGetUUID", mig) == facts["uuid"]
            r = next(m for m in parent["mig_devices"] if m["index"] == facts["index"])
            if "nvml_error" in r:
                assert w.pynvml("nvmlDeviceGetMemoryInfo", mig) == {"error": r["nvml_error"]}
            else:
                assert w.call("nvmlDeviceGetMemoryInfo", mig) == r["memory_bytes"]

"""``omaticaya record`` through the real ``pynvml`` against the NVML test library (the same code
that runs on a GPU node; the library serves a recorded trace by wall-clock time, sped up): the
trace it writes has the source's static facts and NVML's answers, errors where they happened,
Xid events, and replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omaticaya_py.sources.replay import TraceReader, load_trace
from tests import nvmltestlib
from tests.helpers import FAULTS_TRACE as FAULTS
from tests.helpers import MIG_MIXED_TRACE as MIG_MIXED
from tests.sources.record_support import (  # the names moved out, for this file's tests
    record,  # noqa: F401
)

pytestmark = pytest.mark.skipif(
    nvmltestlib.testlib_unavailable_reason() is not None,
    reason=str(nvmltestlib.testlib_unavailable_reason()),
)


def test_records_static_facts_readings_mig_errors_and_xids(tmp_path: Path) -> None:
    # 3 s at 10x: trace time 0..30 s covers MIG device 5 unreadable (8-11 s) and the Xid (20 s)
    done, out = record(tmp_path, MIG_MIXED, "--duration", "3s", "--interval", "100ms", speed=10)
    assert done.returncode == 0, done.stderr
    assert "recorded" in done.stdout and "2 GPUs" in done.stdout
    src = json.loads(MIG_MIXED.read_text())
    doc = json.loads(out.read_text())
    # version 3: each GPU's place is recorded (here the library's default common ancestors)
    assert load_trace(out).format_version == 3
    assert [d["topology"] for d in doc["devices"]] == [{"1": 50}, {"0": 50}]
    assert [d["pci_bus_id"] for d in doc["devices"]] == [d["pci_bus_id"] for d in src["devices"]]
    assert (doc["driver_version"], doc["cuda_driver_version"]) == (
        src["driver_version"],
        src["cuda_driver_version"],
    )
    for got, want in zip(doc["devices"], src["devices"], strict=True):
        for key in ("index", "name", "uuid", "architecture", "cuda_compute_capability", "mig_mode"):
            assert got[key] == want[key], key
    assert doc["devices"][0]["mig_devices"] == src["devices"][0]["mig_devices"]
    assert "mig_devices" not in doc["devices"][1]
    # every recorded reading is one the source trace holds (the library answered from it)
    source_memory = {
        (g["index"], json.dumps(g["memory_bytes"], sort_keys=True))
        for s in src["samples"]
        for g in s["gpus"]
    }
    samples = doc["samples"]
    assert len(samples) >= 20
    for s in samples:
        for g in s["gpus"]:
            assert (g["index"], json.dumps(g["memory_bytes"], sort_keys=True)) in source_memory
        assert s["gpus"][0]["utilization_pct"]["nvml_error"] == "NVMLError_NotSupported"
        assert isinstance(s["gpus"][1]["utilization_pct"]["gpu"], int)
        assert s["gpus"][0]["fan_speed_pct"]["nvml_error"] == "NVMLError_NotSupported"
    mig5 = [s["gpus"][0]["mig_devices"][5] for s in samples]
    assert {"index": 5, "nvml_error": "NVMLError_Unknown"}.items() <= next(
        m for m in mig5 if "nvml_error" in m
    ).items()
    assert any("memory_bytes" in m for m in mig5)
    xids = [x for s in samples for x in s.get("xid_events", [])]
    assert xids == [{"index": 0, "xid": 79}]
    # and it replays: the agent reads the recorded MIG devices
    snap = TraceReader(out, at_s=samples[-1]["t"]).read()
    assert [m.profile for m in snap.gpus[0].mig_devices] == ["1g.10gb"] * 7


def test_records_the_driver_gone_and_back_and_a_lost_gpu(tmp_path: Path) -> None:
    # faults trace at 10x for 4.5 s: trace time 0..45 s; GPU 3 lost 24-27 s, driver 32-34 s
    done, out = record(tmp_path, FAULTS, "--duration", "4500ms", "--interval", "100ms", speed=10)
    assert done.returncode == 0, done.stderr
    samples = json.loads(out.read_text())["samples"]
    gone = [i for i, s in enumerate(samples) if s.get("nvml_error") == "NVMLError_DriverNotLoaded"]
    assert gone, "no sample saw the driver gone"
    assert any("gpus" in s for s in samples[gone[-1] + 1 :]), (
        "no reading after the driver came back"
    )
    lost = [g for s in samples for g in s.get("gpus", []) if g.get("nvml_error")]
    assert lost and all(
        g == {"index": 3, **g} and g["nvml_error"] == "NVMLError_GpuIsLost" for g in lost
    )


def test_without_nvml_it_writes_the_errors_and_exits_1(tmp_path: Path) -> None:
    done, out = record(tmp_path, None, "--duration", "300ms", "--interval", "100ms")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"omaticaya: NVML gave no reading (NVMLError_DriverNotLoaded); the errors are in {out}"
    ]
    samples = json.loads(out.read_text())["samples"]
    assert samples and all(s["nvml_error"] == "NVMLError_DriverNotLoaded" for s in samples)


@pytest.mark.parametrize(
    ("args", "flag"),
    [(("--duration", "soon"), "--duration"), (("--interval", "10ms"), "--interval")],
)
def test_a_bad_duration_is_one_line_and_exit_2(tmp_path: Path, args, flag) -> None:
    done, out = record(tmp_path, MIG_MIXED, *args)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"omaticaya: {flag}: ") and "Go duration" in line
    assert not out.exists()

"""``NvmlReader`` on what real NVML does beyond one healthy GPU, through real ``pynvml`` and the
NVML test library (tests/nvml), in a worker process: a GPU lost before the reader started, MIG
devices that cannot be read, Xid events on a MIG GPU named by UUID, GPUs that cannot report every
event type, and the topology between two GPUs. The library basics are in test_nvml_testlib.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import nvmltestlib
from tests.helpers import DATA
from tests.helpers import FAULTS_TRACE as FAULTS
from tests.helpers import MIG_MIXED_TRACE as MIG_MIXED
from tests.nvmltestlib import NvmlWorker
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(
    nvmltestlib.testlib_unavailable_reason() is not None,
    reason=str(nvmltestlib.testlib_unavailable_reason()),
)



def index_at(trace: Path, t: float) -> int:
    """The sample index current at trace time ``t``."""
    samples = json.loads(trace.read_text())["samples"]
    return max(i for i, s in enumerate(samples) if s["t"] <= t)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[callable]:
    started: list[NvmlWorker] = []

    def start(trace: Path, at_s: float, **kw) -> NvmlWorker:
        sample_file = tmp_path / f"sample-{len(started)}"
        sample_file.write_text(f"{index_at(trace, at_s)}\n")
        w = NvmlWorker(trace, sample_file, **kw)
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()


def test_a_gpu_lost_before_the_first_read_is_that_gpus_error_only(worker) -> None:
    w = worker(FAULTS, 25.0)  # GPU 3 is off the bus from 24 to 27 s
    snap = w.read()
    assert snap["error"] is None
    assert [g["error"] for g in snap["gpus"]] == [None, None, None, "NVMLError_GpuIsLost"]
    assert snap["gpus"][3]["uuid"] is None  # never read: no fact is invented
    w.advance(index_at(FAULTS, 28.0))
    back = w.read()["gpus"][3]
    assert back["error"] is None
    assert back["uuid"] == "GPU-00000003-7fda-b7ae-a94e-630097a14ca4"
    assert back["memory_free_mib"] is not None


def test_an_unreadable_mig_device_is_its_own_error_and_counted(worker) -> None:
    w = worker(MIG_MIXED, 9.0)  # MIG device 5 of GPU 0 cannot be read from 8 to 11 s
    snap = w.read()
    migs = snap["gpus"][0]["mig_devices"]
    assert [m["error"] for m in migs] == [None] * 5 + ["NVMLError_Unknown", None]
    assert all(m["profile"] == "1g.10gb" for m in migs if m["error"] is None)
    assert snap["gpus"][1]["mig_enabled"] is False and snap["gpus"][1]["mig_devices"] == []
    assert w.errors()[("nvmlDeviceGetUUID", "NVMLError_Unknown")] == 1
    w.advance(index_at(MIG_MIXED, 12.0))
    assert [m["error"] for m in w.read()["gpus"][0]["mig_devices"]] == [None] * 7


def test_an_xid_on_a_mig_gpu_names_the_parent_by_uuid(worker) -> None:
    w = worker(MIG_MIXED, 19.0)
    assert w.read()["xid_events"] == []
    w.advance(index_at(MIG_MIXED, 21.0))  # Xid 79 on GPU 0 at t=20
    events = wait_for("an Xid event", lambda: w.read()["xid_events"], 20)
    assert [(e["index"], e["xid"], e["uuid"]) for e in events] == [
        (0, 79, json.loads(MIG_MIXED.read_text())["devices"][0]["uuid"])
    ]


def test_xid_events_still_arrive_where_a_gpu_cannot_report_ecc_events(worker, tmp_path) -> None:
    doc = json.loads(MIG_MIXED.read_text())
    for device in doc["devices"]:
        device["supported_event_types"] = 0x8  # nvmlEventTypeXidCriticalError alone
    trace = tmp_path / "xid-only.json"
    trace.write_text(json.dumps(doc))
    w = worker(trace, 19.0)
    w.read()
    w.advance(index_at(trace, 21.0))
    assert wait_for("an Xid event", lambda: w.read()["xid_events"], 20)[0]["xid"] == 79
    assert not any(call == "nvmlDeviceRegisterEvents" for call, _ in w.errors())


def test_topology_between_two_gpus_and_unknown_uuids(worker) -> None:
    w = worker(FAULTS, 1.0, watch_xid=False)
    w.read()
    a, b = (f"GPU-{i:08d}-7fda-b7ae-a94e-630097a14ca4" for i in (0, 1))
    # the test library answers NVML_TOPOLOGY_SYSTEM (50) between two GPUs of a trace that
    # records no topology; the reader's topology (read at nvmlInit) holds it in both orders
    assert w.request({"cmd": "topology", "a": a, "b": b})["level"] == 50
    assert w.request({"cmd": "topology", "a": b, "b": a})["level"] == 50
    assert w.request({"cmd": "topology", "a": a, "b": "GPU-unknown"})["level"] is None


def _derived(tmp_path: Path, source: Path, change) -> Path:
    doc = json.loads(source.read_text())
    change(doc)
    path = tmp_path / f"derived-{source.name}"
    path.write_text(json.dumps(doc))
    return path


def test_a_field_that_fails_is_absent_and_counted_not_a_gpu_fault(worker, tmp_path) -> None:
    unknown = {"nvml_error": "NVMLError_Unknown", "message": "Unknown Error"}

    def change(doc):
        gpu = doc["samples"][0]["gpus"][0]
        gpu["temperature_c"] = dict(unknown)
        gpu["utilization_pct"] = dict(unknown)

    trace = _derived(tmp_path, DATA / "h100-trace.json", change)
    w = worker(trace, 0.0)
    (g,) = w.read()["gpus"]
    assert g["error"] is None and g["memory_free_mib"] is not None
    assert g["temperature_c"] is None and g["utilization_pct"] is None
    errors = w.errors()
    assert errors[("nvmlDeviceGetTemperature", "NVMLError_Unknown")] == 1
    assert errors[("nvmlDeviceGetUtilizationRates", "NVMLError_Unknown")] == 1


def test_a_mig_device_with_impossible_attributes_has_no_profile(worker, tmp_path) -> None:
    def change(doc):
        doc["devices"][0]["mig_devices"][1]["attributes"]["gpu_instance_slice_count"] = 0

    trace = _derived(tmp_path, DATA / "h100-mig-trace.json", change)
    w = worker(trace, 15.0)
    migs = w.read()["gpus"][0]["mig_devices"]
    assert [m["profile"] for m in migs] == ["3g.40gb", None, "2g.20gb"]
    assert migs[1]["error"] is None and migs[1]["memory_free_mib"] is not None

"""``omaticaya record`` when NVML fails while it records, through the real ``pynvml`` against the
NVML test library: a field NotSupported or failing, a GPU lost between two calls of a sample or
already when recording starts, the driver gone in the middle of a sample, an Xid during the
interval (also from a GPU without ECC events, or one that just fell off the bus), event calls
that fail. Each scenario is a small trace stepped sample by sample (a sample file) under a
``Recorder`` in a worker process; the command's exit status and one line are checked end to end.
What the recorder writes is the trace itself: each test reads it back."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import nvmltestlib
from tests.nvmltestlib import (
    MIG_MIXED,
    fault,
    nvml_worker_fixture,  # noqa: F401  (fixture)
    sample,
    scenario,
    testlib_fixture,  # noqa: F401  (fixture)
)
from tests.sources.record_faults_support import (  # the names moved out, for this file's tests
    record_steps,  # noqa: F401
)
from tests.sources.record_support import record

pytestmark = pytest.mark.skipif(
    nvmltestlib.testlib_unavailable_reason() is not None,
    reason=str(nvmltestlib.testlib_unavailable_reason()),
)

SOURCE = json.loads(MIG_MIXED.read_text())
BASE = SOURCE["samples"][0]["gpus"]
NOT_SUPPORTED = "NVMLError_NotSupported"
LOST = "NVMLError_GpuIsLost"
GONE = "NVMLError_DriverNotLoaded"




@pytest.fixture
def recorder(tmp_path: Path, nvml_worker) -> Callable[..., tuple[list, dict, int]]:  # noqa: F811
    """``recorder(*samples, devices=..., faults=...)``: record the scenario step by step."""

    def run(*samples: dict[str, Any], devices=None, faults=None):
        trace = scenario(tmp_path / "scenario.json", *samples, devices=devices)
        worker = nvml_worker(trace, tmp_path / "pos", reader=False, faults=faults)
        return record_steps(worker, len(samples), tmp_path)

    return run


def without_mig_mode_and_slot_6(devices: list[dict[str, Any]]) -> None:
    """GPU 1 answers NotSupported to nvmlDeviceGetMigMode (a GPU before Ampere); GPU 0's MIG
    slot 6 is empty (nvmlDeviceGetMigDeviceHandleByIndex: NotFound)."""
    del devices[1]["mig_mode"]
    devices[0]["mig_devices"] = [m for m in devices[0]["mig_devices"] if m["index"] != 6]


def test_a_field_nvml_cannot_give_is_that_fields_error_and_the_rest_is_read(recorder) -> None:
    fields = {
        "temperature_c": fault("NVMLError_Unknown"),
        "power_mw": None,  # absent: NotSupported
        "memory_bytes": fault(NOT_SUPPORTED),
        "memory_v2_bytes": None,
    }
    samples, doc, readings = recorder(sample(gpu1=fields), devices=without_mig_mode_and_slot_6)
    assert readings == 1
    gpu0, gpu1 = samples[0]["gpus"]
    assert {k: v["nvml_error"] for k, v in gpu1.items() if k in fields} == {
        "temperature_c": "NVMLError_Unknown",
        "power_mw": NOT_SUPPORTED,
        "memory_bytes": NOT_SUPPORTED,
        "memory_v2_bytes": NOT_SUPPORTED,
    }
    # every other field is what NVML answered, as the source recorded it
    assert {k: v for k, v in gpu1.items() if k not in fields} == {
        k: v for k, v in BASE[1].items() if k not in fields
    }
    assert "mig_devices" not in gpu1 and "mig_mode" not in doc["devices"][1]
    assert [m["index"] for m in gpu0["mig_devices"]] == [0, 1, 2, 3, 4, 5]
    assert [m["index"] for m in doc["devices"][0]["mig_devices"]] == [0, 1, 2, 3, 4, 5]
    assert gpu0["memory_bytes"] == BASE[0]["memory_bytes"]


def test_a_gpu_lost_between_two_calls_of_a_sample_is_that_gpus_error(recorder) -> None:
    samples, _, readings = recorder(
        sample(),
        sample(gpu1={"temperature_c": fault(LOST)}),  # memory read, then off the bus
        sample(gpu1={"memory_v2_bytes": fault(LOST)}),
        sample(),
    )
    assert readings == 4
    assert [[g.get("nvml_error") for g in s["gpus"]] for s in samples] == [
        [None, None],
        [None, LOST],
        [None, LOST],
        [None, None],
    ]
    assert samples[1]["gpus"][1].keys() == {"index", "nvml_error", "message"}  # nothing half-read
    assert samples[3]["gpus"][1]["memory_bytes"] == BASE[1]["memory_bytes"]


def test_the_driver_gone_in_the_middle_of_a_sample_is_that_samples_error(recorder) -> None:
    samples, doc, readings = recorder(
        sample(),
        sample(gpu1={"power_mw": fault(GONE)}),  # GPU 0 read, then the driver went
        sample(),
        sample(gpu0={"mig": {3: fault(GONE)}}),  # while reading a MIG device
        sample(gpu1={"memory_v2_bytes": fault(GONE)}),
        sample(error=GONE),  # nvmlInit fails
        sample(),
    )
    assert [s.get("nvml_error") for s in samples] == [None, GONE, None, GONE, GONE, GONE, None]
    assert all("gpus" not in s for s in samples if "nvml_error" in s)  # no half sample
    assert readings == 3
    assert samples[6]["gpus"][0]["mig_devices"] == samples[0]["gpus"][0]["mig_devices"]
    assert [d["uuid"] for d in doc["devices"]] == [d["uuid"] for d in SOURCE["devices"]]


@pytest.mark.parametrize("error", [LOST, "NVMLError_Unknown"])
def test_a_gpu_nvml_cannot_read_when_recording_starts_is_that_gpus_error_only(
    recorder, error: str
) -> None:
    # GpuIsLost: no handle (nvmlDeviceGetHandleByIndex fails); Unknown: a handle, no facts
    samples, doc, readings = recorder(
        sample(gpu1=fault(error)),
        sample(gpu1=fault(error)),
        sample(),
        sample(xids=((1, 94),)),
    )
    assert readings == 4
    assert [[g.get("nvml_error") for g in s["gpus"]] for s in samples] == [
        [None, error],
        [None, error],
        [None, None],
        [None, None],
    ]
    assert samples[0]["gpus"][0]["memory_bytes"] == BASE[0]["memory_bytes"]
    assert samples[2]["gpus"][1]["memory_bytes"] == BASE[1]["memory_bytes"]
    # its facts are read once it answers, and its Xids are watched from then on
    for key in ("name", "uuid", "architecture", "cuda_compute_capability", "mig_mode"):
        assert doc["devices"][1][key] == SOURCE["devices"][1][key], key
    assert samples[3]["xid_events"] == [{"index": 1, "xid": 94}]


def test_xids_of_the_interval_are_recorded_for_each_gpu_that_sent_them(recorder) -> None:
    def gpu1_without_ecc_events(devices: list[dict[str, Any]]) -> None:
        devices[1]["supported_event_types"] = 0x8  # nvmlEventTypeXidCriticalError only

    samples, _, _ = recorder(
        sample(),
        sample(xids=((0, 13), (1, 31))),
        sample(gpu0=fault(LOST), xids=((0, 79),)),  # fell off the bus: no UUID to name it by
        sample(),
        devices=gpu1_without_ecc_events,
    )
    assert [s.get("xid_events") for s in samples] == [
        None,
        [{"index": 0, "xid": 13}, {"index": 1, "xid": 31}],
        [{"index": 0, "xid": 79}],
        None,
    ]
    assert samples[2]["gpus"][0]["nvml_error"] == LOST


@pytest.mark.parametrize(
    "faults",
    [
        {"nvmlEventSetCreate": "NVMLError_Unknown"},
        {"nvmlDeviceRegisterEvents": "NVMLError_Unknown"},
        {"nvmlEventSetWait_v2": "NVMLError_Unknown"},
    ],
    ids=["set-create", "register", "wait"],
)
def test_event_calls_that_fail_cost_the_xids_not_the_readings(recorder, faults) -> None:
    samples, _, readings = recorder(sample(), sample(xids=((0, 79),)), sample(), faults=faults)
    assert readings == 3
    assert [s.get("xid_events") for s in samples] == [None, None, None]
    assert all(g.get("nvml_error") is None for s in samples for g in s["gpus"])


def record_command(tmp_path: Path, trace: Path, faults: dict[str, str] | None = None):
    """``omaticaya record`` for 300 ms every 100 ms over ``trace`` (its first sample: no
    sample file moves it); the finished process and the output path."""
    pos = tmp_path / "pos"
    pos.write_text("0\n")
    return record(
        tmp_path, trace, "--duration", "300ms", "--interval", "100ms",
        speed=None, sample_file=pos, faults=faults,
    )  # fmt: skip


def test_a_node_with_a_gpu_lost_throughout_is_recorded_and_exits_0(testlib, tmp_path) -> None:  # noqa: F811
    # nvmlShutdown and nvmlEventSetFree failing at the end change nothing either
    trace = scenario(tmp_path / "scenario.json", sample(gpu1=fault(LOST)))
    done, out = record_command(
        tmp_path, trace, {"nvmlShutdown": "NVMLError_Unknown", "nvmlEventSetFree": "NVMLError_Unknown"}
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("recorded ") and " samples of 2 GPUs every 0.1s to " in done.stdout
    doc = json.loads(out.read_text())
    assert doc["devices"][1] == {"index": 1, "nvml_error": LOST, "message": "GPU is lost"}
    assert doc["devices"][0]["uuid"] == SOURCE["devices"][0]["uuid"]
    assert len(doc["samples"]) >= 3
    for s in doc["samples"]:
        assert s["gpus"][0]["memory_bytes"] == BASE[0]["memory_bytes"]
        assert s["gpus"][1]["nvml_error"] == LOST


def test_nvml_init_failing_throughout_is_one_line_and_exit_1(testlib, tmp_path) -> None:  # noqa: F811
    trace = scenario(tmp_path / "scenario.json", sample())
    done, out = record_command(tmp_path, trace, {"nvmlInitWithFlags": "NVMLError_LibRmVersionMismatch"})
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "omaticaya: NVML gave no reading (NVMLError_LibRmVersionMismatch); "
        f"the errors are in {out}"
    ]
    samples = json.loads(out.read_text())["samples"]
    assert samples and {s["nvml_error"] for s in samples} == {"NVMLError_LibRmVersionMismatch"}

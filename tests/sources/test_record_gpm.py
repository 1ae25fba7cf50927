"""The recorder's GPM (issue 40): per GPU per sample the ``gpm`` object, the metrics between the
previous sample and this one, as the NVML test library serves them back; a GPU without GPM and
a MIG GPU record none; failures are recorded where they happened; the recording replays."""

from __future__ import annotations

from pathlib import Path

import pytest

from omaticaya_py.sources.replay import TraceReader
from tests import nvmltestlib
from tests.nvmltestlib import (
    fault,
    gpm,
    nvml_worker_fixture,  # noqa: F401  (fixture)
    sample,
    scenario,
    testlib_fixture,  # noqa: F401  (fixture)
)
from tests.sources.record_faults_support import record_steps

pytestmark = pytest.mark.skipif(
    nvmltestlib.testlib_unavailable_reason() is not None,
    reason=str(nvmltestlib.testlib_unavailable_reason()),
)

FIELDS = ("sm_active_pct", "tensor_active_pct", "dram_bw_pct", "graphics_pct", "sm_occupancy_pct")


def metrics(sm: float) -> dict:
    return gpm(
        sm_active_pct=sm,
        tensor_active_pct=sm / 2,
        dram_bw_pct=sm / 4,
        graphics_pct=99.0,
        sm_occupancy_pct=sm / 5,
    )


def test_records_gpm_between_samples_and_it_replays(tmp_path: Path, nvml_worker) -> None:
    trace = scenario(
        tmp_path / "src.json",
        *(
            sample(gpu0={"gpm": metrics(80.0)}, gpu1={"gpm": metrics(sm)})
            for sm in (10.0, 20.0, 40.0)
        ),
    )
    worker = nvml_worker(trace, tmp_path / "pos", reader=False)
    samples, doc, readings = record_steps(worker, 3, tmp_path)
    assert readings == 3
    g1 = [s["gpus"][1]["gpm"] for s in samples]
    assert g1[0] == {"supported": True}  # the first sample: no interval yet
    assert {k: g1[1][k] for k in FIELDS} == {k: metrics(20.0)[k] for k in FIELDS}
    assert {k: g1[2][k] for k in FIELDS} == {k: metrics(40.0)[k] for k in FIELDS}
    assert all("gpm" not in s["gpus"][0] for s in samples)  # GPU 0 is in MIG mode
    out = tmp_path / "recorded.json"
    snap = TraceReader(out, at_s=2.0, window_s=0.5).read()
    assert snap.gpus[1].sm_active_pct == 40.0 == snap.gpus[1].utilization_pct
    assert snap.gpus[1].tensor_active_pct == 20.0 and snap.gpus[1].dram_bw_pct == 10.0


def test_a_gpu_without_gpm_records_none(tmp_path: Path, nvml_worker) -> None:
    trace = scenario(
        tmp_path / "src.json",
        sample(gpu1={"gpm": gpm(supported=False)}),
        sample(gpu1={"gpm": gpm(supported=False)}),
    )
    samples, _, _ = record_steps(nvml_worker(trace, tmp_path / "pos", reader=False), 2, tmp_path)
    assert all("gpm" not in g for s in samples for g in s["gpus"])


def test_failures_are_recorded_where_they_happened(tmp_path: Path, nvml_worker) -> None:
    g = metrics(30.0)
    g["tensor_active_pct"] = fault("NVMLError_Unknown")
    trace = scenario(
        tmp_path / "src.json",
        sample(gpu1={"gpm": g}),
        sample(gpu1={"gpm": g}),
        sample(gpu1=fault("NVMLError_GpuIsLost")),
        sample(gpu1={"gpm": g}),
        sample(gpu1={"gpm": g}),
    )
    worker = nvml_worker(trace, tmp_path / "pos", reader=False)
    samples, _, readings = record_steps(worker, 5, tmp_path)
    assert readings == 5
    got = [s["gpus"][1] for s in samples]
    assert got[1]["gpm"]["sm_active_pct"] == 30.0
    assert got[1]["gpm"]["tensor_active_pct"]["nvml_error"] == "NVMLError_Unknown"
    assert got[2]["nvml_error"] == "NVMLError_GpuIsLost"
    assert got[3]["gpm"] == {"supported": True}  # back: a new interval starts
    assert got[4]["gpm"]["sm_active_pct"] == 30.0


def test_a_failing_metrics_call_is_each_metrics_error(tmp_path: Path, nvml_worker) -> None:
    trace = scenario(
        tmp_path / "src.json", *(sample(gpu1={"gpm": metrics(50.0)}) for _ in range(3))
    )
    worker = nvml_worker(
        trace, tmp_path / "pos", reader=False, faults={"nvmlGpmMetricsGet": "NVMLError_Unknown"}
    )
    samples, _, readings = record_steps(worker, 3, tmp_path)
    assert readings == 3
    assert {samples[2]["gpus"][1]["gpm"][k]["nvml_error"] for k in FIELDS} == {"NVMLError_Unknown"}


RECORD_FAULTS = [
    # (id, {function: fault}, what GPU 1's third sample records)
    ("support-not-supported", {"nvmlGpmQueryDeviceSupport": "NVMLError_NotSupported"}, "none"),
    ("support-fails", {"nvmlGpmQueryDeviceSupport": "NVMLError_Unknown"}, "error"),
    ("sample-get-not-supported", {"nvmlGpmSampleGet": "NVMLError_NotSupported@2"}, "none"),
    ("sample-get-fails", {"nvmlGpmSampleGet": "NVMLError_Unknown@2"}, "error"),
    ("sample-get-lost", {"nvmlGpmSampleGet": "NVMLError_GpuIsLost@2"}, "lost"),
    ("free-fails", {"nvmlGpmSampleFree": "NVMLError_Unknown"}, "metrics"),
]


@pytest.mark.parametrize(
    ("faults", "third"), [c[1:] for c in RECORD_FAULTS], ids=[c[0] for c in RECORD_FAULTS]
)
def test_every_gpm_failure_is_recorded_never_a_crash(tmp_path: Path, nvml_worker, faults,
                                                     third) -> None:  # fmt: skip
    """Each way a GPM call can fail while recording (GPU 1; GPU 0 is in MIG mode and has none):
    NotSupported records no ``gpm`` (as a GPU without it), another error records the error,
    a lost GPU records its error; every sample is still written."""
    trace = scenario(
        tmp_path / "src.json", *(sample(gpu1={"gpm": metrics(60.0)}) for _ in range(4))
    )
    worker = nvml_worker(trace, tmp_path / "pos", reader=False, faults=faults)
    samples, _, readings = record_steps(worker, 4, tmp_path)
    assert readings == 4
    got = samples[2]["gpus"][1]
    if third == "none":
        assert "gpm" not in got
    elif third == "error":
        assert "nvml_error" in str(got.get("gpm", got))
    elif third == "lost":
        assert "GpuIsLost" in str(got)
    else:
        assert got["gpm"]["sm_active_pct"] == 60.0

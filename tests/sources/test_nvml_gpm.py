"""``NvmlReader``'s GPM path (issue 40) through real ``pynvml`` and the NVML test library in a
worker process: SM activity as utilisation where GPM is supported (``nvmlDeviceGetSamples`` not
called), the first read's instantaneous rates, a GPU without GPM, faults of the GPM calls, a
re-init and a lost GPU."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import nvmltestlib
from tests.helpers import DATA
from tests.nvmltestlib import NvmlWorker, fault, gpm

pytestmark = pytest.mark.skipif(
    nvmltestlib.testlib_unavailable_reason() is not None,
    reason=str(nvmltestlib.testlib_unavailable_reason()),
)

H100 = DATA / "h100-trace.json"


def h100(path: Path, *samples: tuple[float, int, dict[str, Any] | None]) -> Path:
    """A one-GPU H100 trace: per sample ``(t, classic utilisation %, gpm object or None)``;
    a ``gpm`` of ``{"nvml_error": X}`` at the reading level makes the GPU lost there."""
    doc = json.loads(H100.read_text())
    doc.pop("phases", None)
    doc["interval_s"] = 1.0
    base = doc["samples"][0]["gpus"][0]
    out = []
    for t, util, g in samples:
        reading = copy.deepcopy(base)
        reading["utilization_pct"] = {"gpu": util, "memory": 7}
        if g is not None and "lost" in g:
            reading = {"index": 0, **fault("NVMLError_GpuIsLost")}
        elif g is not None:
            reading["gpm"] = g
        out.append({"t": t, "gpus": [reading]})
    doc["samples"] = out
    path.write_text(json.dumps(doc))
    return path


def weighted(times: list[float], values: list[float], a: int, b: int) -> float:
    """The library's mean over samples a+1..b, each weighted by t[k] - t[k-1]."""
    w = [times[k] - times[k - 1] for k in range(a + 1, b + 1)]
    return sum(wk * values[k] for wk, k in zip(w, range(a + 1, b + 1), strict=True)) / sum(w)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Callable[..., NvmlWorker]]:
    started: list[NvmlWorker] = []

    def start(trace: Path, index: int = 0, **kw: Any) -> NvmlWorker:
        sample_file = tmp_path / f"sample-{len(started)}"
        sample_file.write_text(f"{index}\n")
        w = NvmlWorker(trace, sample_file, watch_xid=False, **kw)
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()


def calls(w: NvmlWorker) -> dict[str, int]:
    return w.request({"cmd": "calls"})["calls"]


TIMES = [0.0, 1.0, 3.0, 4.0, 6.0]
SM = [5.0, 20.0, 30.0, 90.0, 60.0]
TENSOR = [1.0, 2.0, 4.0, 8.0, 16.0]
DRAM = [0.0, 10.0, 10.0, 40.0, 190.0]  # the mean over 2..4 is 140: clamped to 100


def gpm_trace(tmp_path: Path) -> Path:
    return h100(
        tmp_path / "gpm.json",
        *(
            (t, 97, gpm(sm_active_pct=s, tensor_active_pct=x, dram_bw_pct=d, graphics_pct=99.0))
            for t, s, x, d in zip(TIMES, SM, TENSOR, DRAM, strict=True)
        ),
    )


def test_gpm_gpu_utilisation_is_sm_activity_and_samples_are_not_read(worker, tmp_path) -> None:
    w = worker(gpm_trace(tmp_path))
    first = w.read()["gpus"][0]
    # first read after nvmlInit: no earlier GPM sample -> the instantaneous rates, GPM absent
    assert first["utilization_pct"] == 97.0
    assert first["sm_active_pct"] is None and first["tensor_active_pct"] is None
    assert first["dram_bw_pct"] is None
    w.advance(2)
    g = w.read()["gpus"][0]
    assert g["sm_active_pct"] == pytest.approx(weighted(TIMES, SM, 0, 2))
    assert g["utilization_pct"] == g["sm_active_pct"]
    assert g["tensor_active_pct"] == pytest.approx(weighted(TIMES, TENSOR, 0, 2))
    assert g["dram_bw_pct"] == pytest.approx(10.0)
    assert g["memory_utilization_pct"] == 7.0
    w.advance(4)
    g = w.read()["gpus"][0]
    assert g["sm_active_pct"] == pytest.approx(weighted(TIMES, SM, 2, 4))
    assert g["utilization_pct"] == g["sm_active_pct"]
    assert weighted(TIMES, DRAM, 2, 4) > 100.0 and g["dram_bw_pct"] == 100.0
    c = calls(w)
    assert "nvmlDeviceGetSamples" not in c
    assert c["nvmlGpmQueryDeviceSupport"] == 1
    assert c["nvmlGpmSampleAlloc"] == 2
    assert c["nvmlGpmSampleGet"] == 3
    assert c["nvmlGpmMetricsGet"] == 2
    assert c["nvmlDeviceGetUtilizationRates"] == 3
    assert w.errors() == {}


def test_a_trace_without_gpm_reads_samples_as_before(worker, tmp_path) -> None:
    trace = h100(tmp_path / "plain.json", (0.0, 10, None), (1.0, 40, None), (2.0, 60, None))
    w = worker(trace)
    w.read()
    w.advance(2)
    g = w.read()["gpus"][0]
    assert g["utilization_pct"] == pytest.approx(50.0)  # mean of the two new samples
    assert (g["sm_active_pct"], g["tensor_active_pct"], g["dram_bw_pct"]) == (None,) * 3
    c = calls(w)
    assert c["nvmlDeviceGetSamples"] == 2
    assert c["nvmlGpmQueryDeviceSupport"] == 1
    assert "nvmlGpmSampleAlloc" not in c and "nvmlGpmMetricsGet" not in c


def test_gpm_not_supported_uses_the_samples_path(worker, tmp_path) -> None:
    trace = h100(
        tmp_path / "nogpm.json",
        (0.0, 10, gpm(supported=False)),
        (1.0, 40, gpm(supported=False)),
        (2.0, 60, gpm(supported=False)),
    )
    w = worker(trace)
    w.read()
    w.advance(2)
    g = w.read()["gpus"][0]
    assert g["utilization_pct"] == pytest.approx(50.0)
    assert g["sm_active_pct"] is None
    c = calls(w)
    assert c["nvmlDeviceGetSamples"] == 2 and "nvmlGpmSampleGet" not in c


def test_mig_gpu_has_no_gpm(worker, tmp_path) -> None:
    trace = nvmltestlib.scenario(
        tmp_path / "mig.json",
        nvmltestlib.sample(
            gpu0={"gpm": gpm(sm_active_pct=50.0)}, gpu1={"gpm": gpm(sm_active_pct=20.0)}
        ),
        nvmltestlib.sample(
            gpu0={"gpm": gpm(sm_active_pct=50.0)}, gpu1={"gpm": gpm(sm_active_pct=30.0)}
        ),
    )
    w = worker(trace)
    w.read()
    w.advance(1)
    g0, g1 = w.read()["gpus"]
    assert g0["mig_enabled"] is True and g0["sm_active_pct"] is None
    assert g0["utilization_pct"] is None
    assert g1["sm_active_pct"] == 30.0 == g1["utilization_pct"]
    assert calls(w)["nvmlGpmQueryDeviceSupport"] == 1  # GPU 1 only


def test_a_failing_metric_is_absent(worker, tmp_path) -> None:
    trace = h100(
        tmp_path / "metric.json",
        (0.0, 10, gpm(sm_active_pct=5.0, tensor_active_pct=fault("NVMLError_Unknown"))),
        (1.0, 40, gpm(sm_active_pct=25.0, tensor_active_pct=fault("NVMLError_Unknown"))),
    )
    w = worker(trace)
    w.read()
    w.advance(1)
    g = w.read()["gpus"][0]
    assert g["sm_active_pct"] == 25.0 == g["utilization_pct"]
    assert g["tensor_active_pct"] is None and g["dram_bw_pct"] is None  # absent from the trace


@pytest.mark.parametrize("call", ["nvmlGpmMetricsGet", "nvmlGpmSampleGet"])
def test_gpm_faults_give_absent_fields_and_the_samples_path(worker, tmp_path, call) -> None:
    trace = h100(
        tmp_path / "fault.json",
        *((float(t), 10 * (t + 1), gpm(sm_active_pct=77.0)) for t in range(4)),
    )
    # the first read's SampleGet succeeds (1 call), then every call fails
    w = worker(
        trace,
        faults={call: "NVMLError_Unknown@1" if call == "nvmlGpmSampleGet" else "NVMLError_Unknown"},
    )
    w.read()
    for index in (1, 2):
        w.advance(index)
        snap = w.read()
        g = snap["gpus"][0]
        assert snap["error"] is None and g["error"] is None
        assert g["sm_active_pct"] is None and g["tensor_active_pct"] is None
        assert g["utilization_pct"] is not None and g["utilization_pct"] != 77.0
    assert calls(w)["nvmlDeviceGetSamples"] == 2
    assert w.errors()[(call, "NVMLError_Unknown")] == 2


def test_a_reinit_frees_the_samples_and_starts_again(worker, tmp_path) -> None:
    w = worker(gpm_trace(tmp_path))
    w.read()
    w.advance(1)
    assert w.read()["gpus"][0]["sm_active_pct"] == 20.0
    w.request({"cmd": "reinit"})
    c = calls(w)
    assert c["nvmlGpmSampleFree"] == 2 == c["nvmlGpmSampleAlloc"]
    w.advance(2)
    g = w.read()["gpus"][0]
    assert g["sm_active_pct"] is None and g["utilization_pct"] == 97.0  # first read again
    w.advance(3)
    assert w.read()["gpus"][0]["sm_active_pct"] == 90.0
    c = calls(w)
    assert c["nvmlGpmQueryDeviceSupport"] == 2 and c["nvmlGpmSampleAlloc"] == 4
    assert w.errors() == {}


def test_a_gpu_lost_between_samples_is_its_error_and_gpm_starts_again(worker, tmp_path) -> None:
    trace = h100(
        tmp_path / "lost.json",
        (0.0, 10, gpm(sm_active_pct=10.0)),
        (1.0, 20, {"lost": True}),
        (2.0, 30, gpm(sm_active_pct=30.0)),
        (3.0, 40, gpm(sm_active_pct=40.0)),
        (4.0, 50, gpm(sm_active_pct=50.0)),
    )
    w = worker(trace)
    w.read()
    w.advance(1)
    assert w.read()["gpus"][0]["error"] == "NVMLError_GpuIsLost"
    assert calls(w)["nvmlGpmSampleFree"] == 2
    w.advance(3)
    g = w.read()["gpus"][0]
    assert g["error"] is None and g["sm_active_pct"] is None  # no kept sample: rates
    assert g["utilization_pct"] == 40.0
    w.advance(4)
    g = w.read()["gpus"][0]
    assert g["sm_active_pct"] == 50.0 == g["utilization_pct"]


FAULT_CASES = [
    # (id, {function: fault}, what the second read must show)
    ("support-query-fails", {"nvmlGpmQueryDeviceSupport": "NVMLError_Unknown"}, "samples"),
    ("support-query-lost", {"nvmlGpmQueryDeviceSupport": "NVMLError_GpuIsLost"}, "lost"),
    ("alloc-not-supported", {"nvmlGpmSampleAlloc": "NVMLError_NotSupported"}, "samples"),
    ("sample-get-not-supported", {"nvmlGpmSampleGet": "NVMLError_NotSupported@1"}, "samples"),
    ("sample-get-lost", {"nvmlGpmSampleGet": "NVMLError_GpuIsLost@1"}, "lost"),
    ("sample-get-driver-gone", {"nvmlGpmSampleGet": "NVMLError_DriverNotLoaded@1"}, "library"),
    ("metrics-not-supported", {"nvmlGpmMetricsGet": "NVMLError_NotSupported"}, "samples"),
    ("metrics-lost", {"nvmlGpmMetricsGet": "NVMLError_GpuIsLost"}, "lost"),
]


@pytest.mark.parametrize(
    ("faults", "shows"), [c[1:] for c in FAULT_CASES], ids=[c[0] for c in FAULT_CASES]
)
def test_every_gpm_failure_is_a_reading_never_a_crash(worker, tmp_path, faults, shows) -> None:
    """Each way a GPM call can fail, on the second read (the first read's calls succeed where
    the fault says ``@1``): NotSupported and other errors fall back to the samples path (GPM
    absent), a lost GPU is that GPU's error, a gone driver is the node's; the next read after
    a lost GPU starts GPM again."""
    trace = h100(
        tmp_path / "faults.json",
        *((float(t), 10 * (t + 1), gpm(sm_active_pct=77.0)) for t in range(4)),
    )
    w = worker(trace, faults=faults)
    w.read()
    w.advance(1)
    snap = w.read()
    g = snap["gpus"][0] if snap["gpus"] else None
    if shows == "samples":
        assert snap["error"] is None and g is not None and g["error"] is None
        assert g["sm_active_pct"] is None and g["utilization_pct"] not in (None, 77.0)
    elif shows == "lost":
        assert g is not None and g["error"] == "NVMLError_GpuIsLost"
    else:
        assert snap["error"] == "NVMLError_DriverNotLoaded" or (
            g is not None and g["error"] is not None
        )


def test_a_sample_that_cannot_be_freed_is_left_to_the_library(worker, tmp_path) -> None:
    """``nvmlGpmSampleFree`` failing at a re-init frees what it can and reads on."""
    w = worker(gpm_trace(tmp_path), faults={"nvmlGpmSampleFree": "NVMLError_Unknown"})
    w.read()
    w.advance(1)
    assert w.read()["gpus"][0]["sm_active_pct"] == 20.0
    w.request({"cmd": "reinit"})
    w.advance(2)
    w.read()
    w.advance(3)
    assert w.read()["gpus"][0]["sm_active_pct"] == 90.0

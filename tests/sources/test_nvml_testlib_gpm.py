"""GPM (GPU Performance Monitoring) in the NVML test library (tests/nvml/), through the real,
unmodified ``pynvml`` in a subprocess: the test library is never loaded into the pytest
process. Each test runs a short script (``PRELUDE`` + its body) under ``testlib_env`` and reads
the JSON it prints.

Expected means are computed here from the trace each test writes (``tests.nvmltestlib``'s
``scenario``/``sample``/``gpm``): a GPM value recorded at sample k describes (t[k-1], t[k]];
``nvmlGpmMetricsGet`` between GPM samples taken while samples a < b were current is the mean of
samples a+1 .. b weighted by t[k] - t[k-1]; taken in one trace sample, that sample's value.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest

from tests.helpers import H100_TRACE as H100
from tests.nvmltestlib import (  # noqa: F401  (fixture: testlib)
    ROOT,
    fault,
    gpm,
    sample,
    scenario,
    testlib_fixture,
)
from tests.nvmltestlib import (
    testlib_env as env_for,
)

GRAPHICS = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
SM = pynvml.NVML_GPM_METRIC_SM_UTIL
OCCUPANCY = pynvml.NVML_GPM_METRIC_SM_OCCUPANCY
TENSOR = pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL
DRAM = pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL
KEYS = {
    GRAPHICS: "graphics_pct",
    SM: "sm_active_pct",
    OCCUPANCY: "sm_occupancy_pct",
    TENSOR: "tensor_active_pct",
    DRAM: "dram_bw_pct",
}
FIVE = [GRAPHICS, SM, OCCUPANCY, TENSOR, DRAM]
SUCCESS = pynvml.NVML_SUCCESS
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED

PRELUDE = r'''
import ctypes, json, os, sys
import pynvml

out = {}

def step(i):
    """Move the trace: write the sample file (atomically)."""
    p = os.environ["NVML_TESTLIB_SAMPLE_FILE"]
    with open(p + ".tmp", "w") as f:
        f.write(f"{i}\n")
    os.replace(p + ".tmp", p)

def attempt(fn, *args):
    try:
        return {"ok": fn(*args)}
    except pynvml.NVMLError as exc:
        return {"error": type(exc).__name__}

def name(fn, *args):
    """None on success, else the pynvml exception class name."""
    r = attempt(fn, *args)
    return r.get("error")

def taken(h):
    s = pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(h, s)
    return s

def metrics(s1, s2, ids, version=pynvml.NVML_GPM_METRICS_GET_VERSION, num=None):
    """{"ret": [[metricId, nvmlReturn, value, shortName], ...]} or {"error": name}."""
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version = version
    mg.numMetrics = len(ids) if num is None else num
    mg.sample1 = s1
    mg.sample2 = s2
    for i, m in enumerate(ids):
        mg.metrics[i].metricId = m
        mg.metrics[i].value = -1.0
        mg.metrics[i].nvmlReturn = 12345
    try:
        pynvml.nvmlGpmMetricsGet(mg)
    except pynvml.NVMLError as exc:
        return {"error": type(exc).__name__}
    return {"ret": [[mg.metrics[i].metricId, mg.metrics[i].nvmlReturn, mg.metrics[i].value,
                     mg.metrics[i].metricInfo.shortName] for i in range(len(ids))]}

def support(h, version=pynvml.NVML_GPM_SUPPORT_VERSION):
    """nvmlGpmQueryDeviceSupport with any version: [ret, isSupportedDevice]."""
    st = pynvml.c_nvmlGpmSupport_t()
    st.version = version
    st.isSupportedDevice = 77
    fn = pynvml._nvmlGetFunctionPointer("nvmlGpmQueryDeviceSupport")
    return [fn(h, ctypes.byref(st)), st.isSupportedDevice]

pynvml.nvmlInit()
'''


def run(
    trace: Path,
    body: str,
    sample_file: Path,
    faults: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run PRELUDE + body (which fills ``out``) in a subprocess that loaded the test library."""
    if not sample_file.exists():
        sample_file.write_text("0\n")
    script = PRELUDE + body + "\nprint(json.dumps(out))\n"
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=str(ROOT),
        env=env_for(trace, sample_file, faults=faults),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def sample_file(tmp_path: Path) -> Path:
    return tmp_path / "sample"


def busy(**over: Any) -> dict[str, Any]:
    values = {
        "sm_active_pct": 94.9,
        "graphics_pct": 98.4,
        "sm_occupancy_pct": 41.0,
        "tensor_active_pct": 92.1,
        "dram_bw_pct": 23.5,
    }
    values.update(over)
    return gpm(**{k: v for k, v in values.items() if v is not None})


# A trace with uneven sample durations: t = 0, 1, 3, 3.5, 6 (durations 1, 2, 0.5, 2.5).
TIMES = [0.0, 1.0, 3.0, 3.5, 6.0]
READINGS = [
    busy(sm_active_pct=0.0, graphics_pct=0.0, sm_occupancy_pct=0.0, tensor_active_pct=0.0),
    busy(sm_active_pct=10.0, graphics_pct=100.0, sm_occupancy_pct=5.0, dram_bw_pct=1.0),
    busy(sm_active_pct=50.0, graphics_pct=90.0, sm_occupancy_pct=25.0, dram_bw_pct=2.0),
    busy(sm_active_pct=80.0, graphics_pct=80.0, sm_occupancy_pct=60.0, dram_bw_pct=40.0),
    busy(sm_active_pct=0.8, graphics_pct=99.6, sm_occupancy_pct=1.0, dram_bw_pct=0.5),
]


def uneven(path: Path) -> Path:
    return scenario(path, *(sample(gpu1={"gpm": g}) for g in READINGS), times=TIMES)


def mean(a: int, b: int, key: str) -> float:
    """The time-weighted mean of samples a+1 .. b (a == b: sample b)."""
    if a == b:
        return float(READINGS[b][key])
    total = sum(READINGS[k][key] * (TIMES[k] - TIMES[k - 1]) for k in range(a + 1, b + 1))
    return total / (TIMES[b] - TIMES[a])


def by_id(answer: dict[str, Any]) -> dict[int, tuple[int, float]]:
    assert "ret" in answer, answer
    return {m: (r, v) for m, r, v, _ in answer["ret"]}


def test_support_query(testlib: Path, tmp_path: Path, sample_file: Path) -> None:
    trace = scenario(
        tmp_path / "t.json",
        sample(gpu1={"gpm": busy()}),
        sample(gpu1={"gpm": None}),
        sample(gpu1={"gpm": gpm(supported=False)}),
        sample(gpu1={"gpm": fault("NVMLError_Unknown")}),
    )
    out = run(
        trace,
        """
h = pynvml.nvmlDeviceGetHandleByIndex(1)
out["pynvml"] = pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice
out["raw"] = support(h)
out["v2"] = support(h, 2)
out["v0"] = support(h, 0)
out["mig"] = name(pynvml.nvmlGpmQueryDeviceSupport,
                  pynvml.nvmlDeviceGetMigDeviceHandleByIndex(pynvml.nvmlDeviceGetHandleByIndex(0), 0))
out["later"] = []
for i in (1, 2, 3):
    step(i)
    out["later"].append(support(h))
pynvml.nvmlShutdown()
out["uninit"] = name(pynvml.nvmlGpmQueryDeviceSupport, h)
""",
        sample_file,
    )
    assert out["pynvml"] == 1
    assert out["raw"] == [SUCCESS, 1]
    assert out["v2"][0] == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert out["v0"][0] == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    assert out["mig"] == "NVMLError_NotSupported"
    # no gpm object, "supported": false -> 0; "gpm": {"nvml_error": X} -> X
    assert out["later"] == [[SUCCESS, 0], [SUCCESS, 0], [pynvml.NVML_ERROR_UNKNOWN, 77]]
    assert out["uninit"] == "NVMLError_Uninitialized"


def test_metrics_are_time_weighted_means_between_two_samples(
    testlib: Path, tmp_path: Path, sample_file: Path
) -> None:
    trace = uneven(tmp_path / "t.json")
    ids = [*FIVE, pynvml.NVML_GPM_METRIC_NVDEC_0_UTIL, pynvml.NVML_GPM_METRIC_MAX, 0]
    out = run(
        trace,
        f"""
ids = {ids!r}
h = pynvml.nvmlDeviceGetHandleByIndex(1)
s0 = taken(h)
step(2)
s2 = taken(h)
step(4)
s4 = taken(h)
s4b = taken(h)
out["0-2"] = metrics(s0, s2, ids)
out["0-4"] = metrics(s0, s4, ids)
out["2-4"] = metrics(s2, s4, ids)
out["4-2"] = metrics(s4, s2, ids)
out["same-sample"] = metrics(s4, s4b, ids)
out["same-buffer"] = metrics(s4, s4, ids)
out["none"] = metrics(s0, s4, [])
out["sm-only"] = metrics(s0, s4, [{SM}])
step(1)
s1 = taken(h)
out["0-1"] = metrics(s0, s1, ids)
for s in (s0, s1, s2, s4, s4b):
    pynvml.nvmlGpmSampleFree(s)
""",
        sample_file,
    )
    for a, b in [(0, 2), (0, 4), (2, 4), (0, 1)]:
        got = by_id(out[f"{a}-{b}"])
        for metric, key in KEYS.items():
            assert got[metric] == (SUCCESS, pytest.approx(mean(a, b, key), abs=1e-9)), (a, b, key)
        assert got[pynvml.NVML_GPM_METRIC_NVDEC_0_UTIL] == (NOT_SUPPORTED, 0.0)
        assert got[pynvml.NVML_GPM_METRIC_MAX] == (pynvml.NVML_ERROR_INVALID_ARGUMENT, 0.0)
        assert got[0] == (pynvml.NVML_ERROR_INVALID_ARGUMENT, 0.0)
    # spelled out once: SM activity from t=0 to t=6 = (10*1 + 50*2 + 80*0.5 + 0.8*2.5) / 6
    assert by_id(out["0-4"])[SM][1] == pytest.approx((10 + 100 + 40 + 2.0) / 6)
    assert out["4-2"] == out["2-4"]  # order of the two samples does not matter
    # two buffers taken while one trace sample was current: that sample's value
    same = by_id(out["same-sample"])
    for metric, key in KEYS.items():
        assert same[metric] == (SUCCESS, READINGS[4][key])
    assert out["same-buffer"] == {"error": "NVMLError_InvalidArgument"}
    assert out["none"] == {"ret": []}
    assert by_id(out["sm-only"]) == {SM: (SUCCESS, pytest.approx(mean(0, 4, "sm_active_pct")))}
    assert all(short is None for *_, short in out["0-4"]["ret"])  # metricInfo left NULL


def test_version_mismatch_and_num_metrics_bound(
    testlib: Path, tmp_path: Path, sample_file: Path
) -> None:
    trace = uneven(tmp_path / "t.json")
    out = run(
        trace,
        f"""
h = pynvml.nvmlDeviceGetHandleByIndex(1)
s0 = taken(h)
step(1)
s1 = taken(h)
out["v2"] = metrics(s0, s1, [{SM}], version=2)
out["v0"] = metrics(s0, s1, [{SM}], version=0)
out["max"] = metrics(s0, s1, [{SM}], num=pynvml.NVML_GPM_METRIC_MAX)
out["over"] = metrics(s0, s1, [{SM}], num=pynvml.NVML_GPM_METRIC_MAX + 1)
""",
        sample_file,
    )
    assert out["v2"] == {"error": "NVMLError_ArgumentVersionMismatch"}
    assert out["v0"] == {"error": "NVMLError_ArgumentVersionMismatch"}
    assert by_id(out["max"])[SM] == (SUCCESS, READINGS[1]["sm_active_pct"])
    assert out["over"] == {"error": "NVMLError_InvalidArgument"}


def test_unsupported_gpu(testlib: Path, tmp_path: Path, sample_file: Path) -> None:
    # an existing trace without gpm: no GPM anywhere, and nothing else changed
    out = run(
        H100,
        """
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out["support"] = pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice
s = pynvml.nvmlGpmSampleAlloc()
out["get"] = name(pynvml.nvmlGpmSampleGet, h, s)
out["never-filled"] = metrics(s, pynvml.nvmlGpmSampleAlloc(), [2])
out["name"] = pynvml.nvmlDeviceGetName(h)
""",
        sample_file,
    )
    assert out["support"] == 0
    assert out["get"] == "NVMLError_NotSupported"
    assert out["never-filled"] == {"error": "NVMLError_InvalidArgument"}
    assert out["name"] == json.loads(H100.read_text())["devices"][0]["name"]

    # GPM missing in a sample between the two, or one field missing: per metric NotSupported
    trace = scenario(
        tmp_path / "t.json",
        sample(gpu1={"gpm": busy()}),
        sample(gpu1={"gpm": busy(dram_bw_pct=None)}),
        sample(gpu1={"gpm": busy(tensor_active_pct=fault("NVMLError_Unknown"))}),
        sample(gpu1={"gpm": None}),
        sample(gpu1={"gpm": gpm(supported=False)}),
        sample(gpu1={"gpm": busy()}),
    )
    out = run(
        trace,
        f"""
ids = {FIVE!r}
h = pynvml.nvmlDeviceGetHandleByIndex(1)
s0 = taken(h)
step(2)
s2 = taken(h)
out["0-2"] = metrics(s0, s2, ids)
step(3)
out["get-3"] = name(pynvml.nvmlGpmSampleGet, h, pynvml.nvmlGpmSampleAlloc())
step(4)
out["get-4"] = name(pynvml.nvmlGpmSampleGet, h, pynvml.nvmlGpmSampleAlloc())
step(5)
s5 = taken(h)
out["2-5"] = metrics(s2, s5, ids)
""",
        sample_file,
    )
    got = by_id(out["0-2"])
    assert got[DRAM] == (NOT_SUPPORTED, 0.0)
    assert got[TENSOR] == (pynvml.NVML_ERROR_UNKNOWN, 0.0)
    assert got[SM] == (SUCCESS, pytest.approx(94.9))
    assert out["get-3"] == "NVMLError_NotSupported"
    assert out["get-4"] == "NVMLError_NotSupported"
    assert {r for r, _ in by_id(out["2-5"]).values()} == {NOT_SUPPORTED}


def test_freed_and_foreign_samples(testlib: Path, tmp_path: Path, sample_file: Path) -> None:
    trace = scenario(
        tmp_path / "t.json",
        sample(gpu0={"gpm": busy()}, gpu1={"gpm": busy()}),
        sample(gpu0={"gpm": busy()}, gpu1={"gpm": busy()}),
    )
    out = run(
        trace,
        f"""
h = pynvml.nvmlDeviceGetHandleByIndex(1)
s0 = taken(h)
step(1)
s1 = taken(h)
out["ok"] = metrics(s0, s1, [{SM}])
out["free"] = name(pynvml.nvmlGpmSampleFree, s1)
out["after-free"] = metrics(s0, s1, [{SM}])
out["free-twice"] = name(pynvml.nvmlGpmSampleFree, s1)
out["get-freed"] = name(pynvml.nvmlGpmSampleGet, h, s1)
out["free-null"] = name(pynvml.nvmlGpmSampleFree, pynvml.c_nvmlGpmSample_t())
out["get-null"] = name(pynvml.nvmlGpmSampleGet, h, pynvml.c_nvmlGpmSample_t())
other = taken(pynvml.nvmlDeviceGetHandleByIndex(0))
out["two-gpus"] = metrics(s0, other, [{SM}])
out["alloc-null"] = pynvml._nvmlGetFunctionPointer("nvmlGpmSampleAlloc")(None)
""",
        sample_file,
    )
    assert by_id(out["ok"])[SM][0] == SUCCESS
    assert out["free"] is None
    assert out["after-free"] == {"error": "NVMLError_InvalidArgument"}
    assert out["free-twice"] == "NVMLError_InvalidArgument"
    assert out["get-freed"] == "NVMLError_InvalidArgument"
    assert out["free-null"] == "NVMLError_InvalidArgument"
    assert out["get-null"] == "NVMLError_InvalidArgument"
    assert out["two-gpus"] == {"error": "NVMLError_InvalidArgument"}
    assert out["alloc-null"] == pynvml.NVML_ERROR_INVALID_ARGUMENT


def test_sample_from_before_a_reinit(testlib: Path, tmp_path: Path, sample_file: Path) -> None:
    trace = uneven(tmp_path / "t.json")
    out = run(
        trace,
        f"""
h = pynvml.nvmlDeviceGetHandleByIndex(1)
pynvml.nvmlInit()  # refcount 2: one shutdown keeps the session, and the samples
s0 = taken(h)
pynvml.nvmlShutdown()
step(1)
s1 = taken(h)
out["nested"] = metrics(s0, s1, [{SM}])
pynvml.nvmlShutdown()  # the session ends
out["down"] = metrics(s0, s1, [{SM}])
out["alloc-down"] = name(pynvml.nvmlGpmSampleAlloc)
out["get-down"] = name(pynvml.nvmlGpmSampleGet, h, s1)
pynvml.nvmlInit()
step(2)
s2 = taken(h)
out["stale"] = metrics(s0, s2, [{SM}])
step(3)
s3 = taken(h)
out["fresh"] = metrics(s2, s3, [{SM}])
out["refill"] = name(pynvml.nvmlGpmSampleGet, h, s0)  # a stale buffer filled again is good
out["refilled"] = metrics(s2, s0, [{SM}])
out["free-stale"] = name(pynvml.nvmlGpmSampleFree, s1)
""",
        sample_file,
    )
    assert by_id(out["nested"])[SM] == (SUCCESS, READINGS[1]["sm_active_pct"])
    assert out["down"] == {"error": "NVMLError_Uninitialized"}
    assert out["alloc-down"] == "NVMLError_Uninitialized"
    assert out["get-down"] == "NVMLError_Uninitialized"
    assert out["stale"] == {"error": "NVMLError_InvalidArgument"}
    assert by_id(out["fresh"])[SM] == (SUCCESS, READINGS[3]["sm_active_pct"])
    assert out["refill"] is None
    assert by_id(out["refilled"])[SM] == (SUCCESS, READINGS[3]["sm_active_pct"])
    assert out["free-stale"] is None


def test_gpu_lost_between_samples(testlib: Path, tmp_path: Path, sample_file: Path) -> None:
    trace = scenario(
        tmp_path / "t.json",
        sample(gpu1={"gpm": busy()}),
        sample(gpu1=fault("NVMLError_GpuIsLost")),
        sample(gpu1={"gpm": busy()}),
        sample(gpu1={"gpm": busy()}),
        sample(error="NVMLError_DriverNotLoaded"),
        sample(gpu1={"gpm": busy()}),
    )
    out = run(
        trace,
        f"""
h = pynvml.nvmlDeviceGetHandleByIndex(1)
s0 = taken(h)
step(1)
out["get-lost"] = name(pynvml.nvmlGpmSampleGet, h, pynvml.nvmlGpmSampleAlloc())
out["support-lost"] = name(pynvml.nvmlGpmQueryDeviceSupport, h)
step(2)
s2 = taken(h)
out["across-loss"] = metrics(s0, s2, [{SM}])
step(3)
s3 = taken(h)
out["after"] = metrics(s2, s3, [{SM}])
step(5)
s5 = taken(h)
out["across-driver-gone"] = metrics(s3, s5, [{SM}])
""",
        sample_file,
    )
    assert out["get-lost"] == "NVMLError_GpuIsLost"
    assert out["support-lost"] == "NVMLError_GpuIsLost"
    assert out["across-loss"] == {"error": "NVMLError_GpuIsLost"}
    assert by_id(out["after"])[SM] == (SUCCESS, pytest.approx(94.9))
    assert out["across-driver-gone"] == {"error": "NVMLError_DriverNotLoaded"}


def test_gpu_lost_now(testlib: Path, tmp_path: Path, sample_file: Path) -> None:
    trace = scenario(
        tmp_path / "t.json",
        sample(gpu1={"gpm": busy()}),
        sample(gpu1={"gpm": busy()}),
        sample(gpu1=fault("NVMLError_GpuIsLost")),
    )
    out = run(
        trace,
        f"""
h = pynvml.nvmlDeviceGetHandleByIndex(1)
s0 = taken(h)
step(1)
s1 = taken(h)
step(2)
out["now-lost"] = metrics(s0, s1, [{SM}])
""",
        sample_file,
    )
    assert out["now-lost"] == {"error": "NVMLError_GpuIsLost"}


def test_faults_cover_gpm(testlib: Path, tmp_path: Path, sample_file: Path) -> None:
    trace = uneven(tmp_path / "t.json")
    out = run(
        trace,
        f"""
h = pynvml.nvmlDeviceGetHandleByIndex(1)
out["support"] = [name(pynvml.nvmlGpmQueryDeviceSupport, h) for _ in range(2)]
s0 = pynvml.nvmlGpmSampleAlloc()
s1 = pynvml.nvmlGpmSampleAlloc()
out["alloc"] = name(pynvml.nvmlGpmSampleAlloc)
pynvml.nvmlGpmSampleGet(h, s0)
step(1)
pynvml.nvmlGpmSampleGet(h, s1)
out["get"] = name(pynvml.nvmlGpmSampleGet, h, s1)
out["metrics"] = [metrics(s0, s1, [{SM}]), metrics(s0, s1, [{SM}])]
out["free"] = [name(pynvml.nvmlGpmSampleFree, s0), name(pynvml.nvmlGpmSampleFree, s0)]
""",
        sample_file,
        faults={
            "nvmlGpmQueryDeviceSupport": "NVMLError_GpuIsLost@1",
            "nvmlGpmSampleAlloc": "NVMLError_Memory@2",
            "nvmlGpmSampleGet": "NVMLError_Unknown@2",
            "nvmlGpmMetricsGet": "NVMLError_NotSupported@1",
            "nvmlGpmSampleFree": "NVMLError_InvalidArgument",
        },
    )
    assert out["support"] == [None, "NVMLError_GpuIsLost"]
    assert out["alloc"] == "NVMLError_Memory"  # the third call
    assert out["get"] == "NVMLError_Unknown"  # the third call
    assert by_id(out["metrics"][0])[SM] == (SUCCESS, READINGS[1]["sm_active_pct"])
    assert out["metrics"][1] == {"error": "NVMLError_NotSupported"}
    assert out["free"] == ["NVMLError_InvalidArgument", "NVMLError_InvalidArgument"]


def test_wall_clock_mode_spans_whole_loops(testlib: Path, tmp_path: Path) -> None:
    """Without a sample file the trace loops (period = last t + interval_s = 7 s here); at
    speed 1000 half a second is ~70 loops, whose mean is the loop's time-weighted mean (the
    first sample of a loop lasts t[0] + interval_s after the previous loop's last)."""
    trace = uneven(tmp_path / "t.json")
    script = f"""
import json, time
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(1)
s0, s1 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
pynvml.nvmlGpmSampleGet(h, s0)
time.sleep(0.5)
pynvml.nvmlGpmSampleGet(h, s1)
mg = pynvml.c_nvmlGpmMetricsGet_t()
mg.version, mg.numMetrics, mg.sample1, mg.sample2 = 1, 1, s0, s1
mg.metrics[0].metricId = {SM}
pynvml.nvmlGpmMetricsGet(mg)
print(json.dumps([mg.metrics[0].nvmlReturn, mg.metrics[0].value]))
"""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=str(ROOT),
        env=env_for(trace, None, speed=1000.0),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    ret, value = json.loads(proc.stdout)
    durations = [TIMES[0] + 1.0] + [TIMES[k] - TIMES[k - 1] for k in range(1, len(TIMES))]
    loop_mean = sum(r["sm_active_pct"] * d for r, d in zip(READINGS, durations, strict=True)) / 7
    assert ret == SUCCESS
    # at most one partial loop (7 s of ~500) off the loop mean, values 0 .. 80
    assert value == pytest.approx(loop_mean, abs=3.0)

"""The NVML reader on a real GPU. Skipped, saying why, where NVML cannot start (CI has no GPU).

Run on a GPU machine with `scripts/test -m nvml`. The failure path (no driver: health Unknown,
numbers removed, retried each tick) runs everywhere, against the real NVML library, in
tests/sources/test_faults_cluster.py::test_without_nvml_health_is_unknown_and_numbers_are_absent.
"""

from __future__ import annotations

import time

import pytest

from omaticaya_py.core.config.settings import load_settings
from omaticaya_py.core.publish.render import render
from omaticaya_py.core.rules.health import assess
from omaticaya_py.sources.nvml import NvmlReader, nvml_available

pytestmark = [
    pytest.mark.nvml,
    pytest.mark.skipif(
        not nvml_available(), reason="no NVIDIA GPU/driver here: NVML cannot start (nvmlInit failed)"
    ),
]


@pytest.fixture
def reader():
    r = NvmlReader(watch_xid=True)
    yield r
    r.close()


def test_reads_every_gpu_with_plausible_values(reader):
    snap = reader.read()
    assert snap.error is None and snap.gpus
    assert snap.driver_version and snap.cuda_driver_version[0] >= 11
    for g in snap.gpus:
        assert g.error is None, g
        assert g.uuid.startswith("GPU-") and g.product
        assert 0 < g.memory_total_mib and 0 <= g.memory_free_mib <= g.memory_total_mib
        assert 0 < g.temperature_c < 120
        assert g.power_w is None or 0 < g.power_w < 2000
        assert g.process_count is not None
        assert g.ecc_uncorrected_volatile is None or g.ecc_uncorrected_volatile >= 0
        if g.mig_enabled:  # MIG: no whole-GPU utilisation; each MIG device read on its own
            assert g.utilization_pct is None
            for m in g.mig_devices:
                assert m.error is None and m.uuid.startswith("MIG-") and m.profile, m
                assert 0 <= m.memory_free_mib <= m.memory_total_mib
        else:
            assert 0 <= g.utilization_pct <= 100
    assert not reader.errors, reader.errors  # NotSupported is absence, never an error


def test_second_read_is_the_mean_of_the_samples_since_the_first(reader, monkeypatch):
    """The samples path (GPUs without GPM, and a GPM GPU whose GPM read failed): GPM is turned
    off in the reader, so that it runs on Hopper and newer too (first run on an H200)."""
    import pynvml

    from omaticaya_py.sources.nvml import gpm

    def no_gpm(calls, device) -> bool:
        device.gpm_supported = False
        return False

    monkeypatch.setattr(gpm, "_supported", no_gpm)
    reader.read()
    devices = [  # the samples' cursor: GPUs read through nvmlDeviceGetSamples (no MIG)
        d
        for d in reader._devices  # noqa: SLF001
        if not d.mig_enabled and not d.gpm_supported
    ]
    if not devices:
        pytest.skip("every GPU has MIG on: the reader reads no utilisation samples")
    device = devices[0]
    since = device.last_ts

    def newer() -> list:
        try:
            return pynvml.nvmlDeviceGetSamples(
                device.handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, since
            )[1]
        except pynvml.NVMLError_NotFound:
            return []

    deadline = time.monotonic() + 10
    while not newer():  # the driver adds a sample every ~1/6 s: wait for one
        assert time.monotonic() < deadline, "no new utilisation sample in 10 s"
        time.sleep(0.05)
    got = reader.read().gpus[device.index].utilization_pct
    values = [s.sampleValue.uiVal for s in newer()]  # what the reader averaged, and maybe more
    assert device.last_ts > since
    assert min(values) <= got <= max(values)
    assert reader.call_s > 0


def test_the_mig_mode_is_asked_on_every_read_and_never_set(reader, monkeypatch):
    """MIG mode at runtime (issue 48, item 4): every read asks each GPU's mode once
    (``nvmlDeviceGetMigMode``) and reads it as NVML's current mode. Read-only: the setter is
    replaced by one that fails the test, so the reader never changes a GPU's MIG mode (that
    resets the GPU)."""
    import pynvml

    def never(*args: object) -> None:
        pytest.fail(f"nvmlDeviceSetMigMode{args}: the reader must never set a MIG mode")

    monkeypatch.setattr(pynvml, "nvmlDeviceSetMigMode", never)

    def asked() -> int:
        return reader.calls_by_name().get("nvmlDeviceGetMigMode", (0, 0.0))[0]

    reader.read()
    before = asked()
    snap = reader.read()
    assert asked() - before == sum(1 for g in snap.gpus if g.error is None)
    for g in snap.gpus:
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(g.uuid)
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except pynvml.NVMLError_NotSupported:  # no MIG on this GPU
            assert g.mig_enabled is None, g
            continue
        assert g.mig_enabled is bool(current), g


def test_render_of_a_real_reading_is_valid():
    reader = NvmlReader(watch_xid=False)
    try:
        snap = reader.read()
    finally:
        reader.close()
    health = assess(snap)
    desired = render(snap, health, load_settings())
    assert not desired.dropped
    assert desired.labels["omaticaya.io/gpu.count"] == str(len(snap.gpus))


# -- GPM (issue 40): SM activity tells a busy GPU from a resident kernel ------------------------


@pytest.fixture
def cuda():
    from tests.gpu_kernels import Cuda

    c = Cuda.open(0)
    if c is None:
        pytest.skip(f"no CUDA device to launch a kernel on: {Cuda.why}")
    yield c
    c.close()


def _gpm_gpu(reader, uuid=None):
    """The reader's first GPM GPU (or the one with ``uuid``); skips where there is none."""
    reader.read()  # nvmlInit, the support query, the first GPM sample
    for d in reader._devices:  # noqa: SLF001
        if d.gpm_supported and (uuid is None or d.uuid == uuid):
            return d.index
    pytest.skip("no GPU with GPM here (pre-Hopper, MIG on or vGPU)")


def test_idle_sm_activity_is_low(reader):
    index = _gpm_gpu(reader)
    time.sleep(1.0)
    g = reader.read().gpus[index]
    if g.process_count:
        pytest.skip(f"GPU {index} is not idle: {g.process_count} processes")
    assert g.sm_active_pct is not None and g.sm_active_pct < 5, g
    assert g.utilization_pct == g.sm_active_pct


def test_a_kernel_on_every_sm_is_high_sm_activity(reader, cuda):
    index = _gpm_gpu(reader, cuda.uuid())
    cuda.spin(4.0, blocks=cuda.sm_count * 8, threads=256)
    time.sleep(0.5)
    reader.read()  # the GPM interval starts with the kernel running
    time.sleep(1.5)
    g = reader.read().gpus[index]
    cuda.synchronize()
    assert g.sm_active_pct is not None and g.sm_active_pct > 50, g
    assert g.utilization_pct == g.sm_active_pct


def test_a_resident_spinning_kernel_is_high_utilisation_but_low_sm_activity(reader, cuda):
    import pynvml

    index = _gpm_gpu(reader, cuda.uuid())
    cuda.spin(4.0, blocks=1, threads=1)
    time.sleep(0.5)
    reader.read()
    time.sleep(1.5)
    g = reader.read().gpus[index]
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    classic = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
    cuda.synchronize()
    assert classic > 50, classic  # "a kernel ran": the whole interval
    assert g.sm_active_pct is not None and g.sm_active_pct < 10, g

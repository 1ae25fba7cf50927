"""The NVML reader on a real GPU. Skipped, saying why, where NVML cannot start (CI has no GPU).

Run on a GPU machine with `scripts/test -m nvml`. The failure path (no driver: health Unknown,
numbers removed, retried each tick) runs everywhere, against the real NVML library, in
tests/test_faults_cluster.py::test_without_nvml_health_is_unknown_and_numbers_are_absent.
"""

from __future__ import annotations

import time

import pytest

from omaticaya_py.core.health import assess
from omaticaya_py.core.render import render
from omaticaya_py.core.settings import load_settings
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


def test_second_read_is_the_mean_of_the_samples_since_the_first(reader):
    import pynvml

    reader.read()
    devices = [d for d in reader._devices if not d.mig_enabled]  # noqa: SLF001 - the samples' cursor
    if not devices:
        pytest.skip("every GPU has MIG on: NVML keeps no utilisation samples")
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

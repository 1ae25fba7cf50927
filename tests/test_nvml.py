"""The NVML reader on a real GPU. Skipped, saying why, where NVML cannot start (CI has no GPU).

Run on a GPU machine with `scripts/test -m nvml`. The failure path (no driver: health Unknown,
numbers removed, retried each tick) runs everywhere, against the real NVML library, in
tests/test_faults_cluster.py::test_without_nvml_health_is_unknown_and_numbers_are_absent.
"""

from __future__ import annotations

import time

import pytest

from omaticaya_py.health import assess
from omaticaya_py.labels import render
from omaticaya_py.nvml import NvmlReader, nvml_available
from omaticaya_py.settings import load_settings

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
        assert 0 <= g.utilization_pct <= 100
        assert 0 < g.temperature_c < 120
        assert g.power_w is None or 0 < g.power_w < 2000
        assert g.process_count is not None
        assert g.ecc_uncorrected_volatile in (None, 0) or g.ecc_uncorrected_volatile > 0
    assert not reader.errors, reader.errors  # NotSupported is absence, never an error


def test_second_read_averages_the_samples_since_the_first(reader):
    reader.read()
    time.sleep(1.0)
    snap = reader.read()
    assert all(0 <= g.utilization_pct <= 100 for g in snap.gpus)
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

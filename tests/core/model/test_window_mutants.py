"""``core.model.window`` cases that mutation testing (``scripts/mutation``) found no test
pinned: a window under a second, a GPU with one of its two readings (or neither), two readings
at one clock, and the p95 rounded to one decimal."""

from __future__ import annotations

import pytest

from omaticaya_py.core.model.window import PeakWindow, WindowSummary
from tests.helpers import gpu, snapshot

UUID0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"
UUID1 = "GPU-00000001-7fda-b7ae-a94e-630097a14ca4"


def test_a_window_under_a_second_is_a_window_and_none_is_refused() -> None:
    window = PeakWindow(0.5)
    assert window.window_s == 0.5
    for t in (0.0, 0.25):
        window.add(snapshot(gpu(0, memory_free_mib=100), clock_s=t))
    assert window.summary(UUID0) == WindowSummary(100, 0.0, 0.25)
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="window_s must be > 0"):
            PeakWindow(bad)


def test_a_gpu_with_one_reading_of_two_counts_and_one_with_neither_does_not() -> None:
    window = PeakWindow(10)
    for t in (0.0, 10.0):
        window.add(snapshot(
            gpu(0, memory_free_mib=None, utilization_pct=None),  # neither: not a sample
            gpu(1, memory_free_mib=None, utilization_pct=40.0),  # after it, still read
            clock_s=t,
        ))  # fmt: skip
    assert window.summary(UUID0) is None
    assert window.summary(UUID1) == WindowSummary(None, 40.0, 10.0)


def test_two_readings_at_one_clock_keep_the_window() -> None:
    """Only a clock that goes back starts afresh; the same clock again does not."""
    window = PeakWindow(10)
    for t in (0.0, 10.0, 10.0):
        window.add(snapshot(gpu(0, memory_free_mib=int(100 + t)), clock_s=t))
    assert window.summary(UUID0) == WindowSummary(100, 0.0, 10.0)


def test_the_p95_is_rounded_to_one_decimal() -> None:
    window = PeakWindow(10)
    for t in (0.0, 10.0):
        window.add(snapshot(gpu(0, utilization_pct=33.347), clock_s=t))
    summary = window.summary(UUID0)
    assert summary is not None
    assert summary.utilization_p95_pct == 33.3
    assert isinstance(summary.utilization_p95_pct, float)

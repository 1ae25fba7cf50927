"""The Xid watcher's buffer between two reads (``sources.nvml.events``): ``bound_events`` as a
table, and ``XidWatcher.keep`` over its bound. Pure: no NVML is loaded (the events' delivery
through real ``pynvml`` is in test_nvml_reader.py and test_nvml_faults.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from omaticaya_py.core.snapshot import XidEvent
from omaticaya_py.sources.nvml.events import XidWatcher, bound_events


def ev(index: int, xid: int, at_s: float = 0.0) -> XidEvent:
    return XidEvent(index=index, xid=xid, at_s=at_s, uuid=f"GPU-{index}")


def pairs(events: list[XidEvent]) -> list[tuple[int, int, float]]:
    return [(e.index, e.xid, e.at_s) for e in events]


@pytest.mark.parametrize(
    ("events", "limit", "kept", "dropped"),
    [
        pytest.param([ev(0, 79, 1), ev(1, 13, 2)], 2, [(0, 79, 1), (1, 13, 2)], 0, id="within"),
        pytest.param(
            [ev(0, 13, 1), ev(1, 79, 2), ev(0, 13, 3), ev(0, 13, 4)],
            2,
            [(1, 79, 2), (0, 13, 4)],
            2,
            id="repeats: the latest of each GPU and Xid",
        ),
        pytest.param(
            [ev(1, 79, 0)] + [ev(0, code, code) for code in range(1, 11)],
            3,
            [(1, 79, 0), (0, 9, 9), (0, 10, 10)],
            8,
            id="made-up codes: the oldest go, never a GPU's latest",
        ),
    ],
)
def test_bound_events(events, limit, kept, dropped) -> None:
    out, n = bound_events(events, limit)
    assert (pairs(out), n) == (kept, dropped)


def test_keep_cuts_the_buffer_to_half_its_bound_when_it_overflows() -> None:
    watcher = XidWatcher(Counter(), clock=lambda: 0.0)
    watcher.MAX_PENDING = 4
    for code in range(1, 6):  # a fifth distinct Xid of one GPU overflows the bound of 4
        watcher.keep(ev(0, code, code))
    assert (pairs(list(watcher.take())), watcher.dropped) == ([(0, 4, 4), (0, 5, 5)], 3)
    watcher.keep(ev(0, 6, 6))
    assert pairs(list(watcher.take())) == [(0, 6, 6)]

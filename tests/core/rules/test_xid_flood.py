"""An Xid flood stays bounded in the event thread, and no GPU's critical Xid is lost
(issue 23, item 3): ``bound_events`` as a table, then the real ``XidWatcher`` buffer under
10,000 events between two reads."""

from __future__ import annotations

from collections import Counter

import pytest

from omaticaya_py.core.model.snapshot import XidEvent
from omaticaya_py.sources.nvml.events import XidWatcher, bound_events


def ev(gpu: int, xid: int, at_s: float) -> XidEvent:
    return XidEvent(index=gpu, xid=xid, at_s=at_s, uuid=f"GPU-{gpu}")


def keys(events: list[XidEvent]) -> list[tuple[int, int, float]]:
    return [(e.index, e.xid, e.at_s) for e in events]


@pytest.mark.parametrize(
    ("events", "limit", "kept", "dropped"),
    [
        ([], 4, [], 0),
        ([ev(0, 79, 1), ev(0, 79, 2)], 4, [(0, 79, 1), (0, 79, 2)], 0),  # under the bound: all
        # over it: the latest per (GPU, Xid), in order
        (
            [ev(0, 79, 1), ev(1, 48, 2), ev(0, 79, 3), ev(0, 13, 4), ev(0, 79, 5)],
            3,
            [(1, 48, 2), (0, 13, 4), (0, 79, 5)],
            2,
        ),
        # more distinct pairs than the bound (made-up codes): the newest, and each GPU's latest
        (
            [ev(1, 79, 1), ev(0, 100, 2), ev(0, 101, 3), ev(0, 102, 4), ev(0, 103, 5)],
            2,
            [(1, 79, 1), (0, 103, 5)],
            3,
        ),
        (
            [ev(1, 79, 1), ev(0, 100, 2), ev(0, 101, 3), ev(0, 102, 4), ev(0, 103, 5)],
            3,
            [(1, 79, 1), (0, 102, 4), (0, 103, 5)],
            2,
        ),
    ],
)
def test_bound_events(events, limit, kept, dropped) -> None:
    out, n = bound_events(events, limit)
    assert (keys(out), n) == (kept, dropped)


def test_a_flood_between_two_reads_stays_bounded_and_keeps_every_gpus_xid() -> None:
    watcher = XidWatcher(Counter(), clock=lambda: 0.0)
    # 8 GPUs, Xid 79 and 13 over and over, and one Xid 48 on GPU 5 early in the flood
    watcher.keep(ev(5, 48, 0.5))
    for i in range(10_000):
        watcher.keep(ev(i % 8, 79 if i % 3 else 13, 1.0 + i))
        assert len(watcher._events) <= XidWatcher.MAX_PENDING
    taken = watcher.take()
    assert watcher.dropped == 10_001 - len(taken)
    latest = {(e.index, e.xid): e.at_s for e in taken}
    assert latest[(5, 48)] == 0.5  # never lost
    for gpu in range(8):
        for xid in (79, 13):
            last = max(1.0 + i for i in range(10_000) if i % 8 == gpu and (79 if i % 3 else 13) == xid)
            assert latest[(gpu, xid)] == last
    assert watcher.take() == ()

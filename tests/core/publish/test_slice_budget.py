"""The ResourceSlice's side of the write budget (``core.publish.slice_budget``): each part
(free memory, taints) of each typed device changes for the worse or the better, and what is
published while the changes for the better wait. Table-driven over typed devices."""

from __future__ import annotations

from dataclasses import replace

import pytest

from omaticaya_py.core.publish.dra import TAINT_MPS, TAINT_UNHEALTHY
from omaticaya_py.core.publish.publisher import Publisher
from omaticaya_py.core.publish.slice_budget import (
    FREE,
    TAINTS,
    device_changes,
    held_devices,
    within_budget,
)
from omaticaya_py.core.publish.slice_device import DeviceTaint, SliceDevice


def dev(name: str, free: int | None, *taints: str, **kw) -> SliceDevice:
    return SliceDevice(
        name, "gpu", False, 0, uuid=f"GPU-{name}", free_memory_mib=free, memory_mib=81920,
        taints=tuple(DeviceTaint(TAINT_UNHEALTHY, v, "NoSchedule", "T") for v in taints), **kw,
    )  # fmt: skip


A = dev("a", 4096)


@pytest.mark.parametrize(
    ("before", "after", "worse", "better"),
    [
        ([A], [A], set(), set()),
        ([A], [dev("a", 2048)], {("a", FREE)}, set()),  # less free
        ([A], [dev("a", 8192)], set(), {("a", FREE)}),  # more free
        ([A], [dev("a", None)], {("a", FREE)}, set()),  # no longer read
        # read again: goes at once too (the rule of worse_devices before it was typed)
        ([dev("a", None)], [A], {("a", FREE)}, set()),
        ([A], [dev("a", 4096, "xid-79")], {("a", TAINTS)}, set()),  # tainted
        ([dev("a", 4096, "xid-79")], [A], set(), {("a", TAINTS)}),  # cleared
        ([dev("a", 4096, "xid-79")], [dev("a", 4096, "gpu-lost")], {("a", TAINTS)}, set()),
        # the same taint published with another time: not worse
        ([dev("a", 4096, "xid-79")], [replace(dev("a", 4096), taints=(
            DeviceTaint(TAINT_UNHEALTHY, "xid-79", "NoSchedule", "U"),))], set(), {("a", TAINTS)}),
        ([A], [replace(A, uuid="GPU-b")], {("a", FREE)}, set()),  # another GPU
        ([A], [replace(A, memory_mib=1024)], {("a", FREE), ("a", TAINTS)}, set()),  # capacity
        ([A, dev("b", 1)], [A], {("b", FREE), ("b", TAINTS)}, set()),  # a device gone
        ([A], [A, dev("b", 1)], set(), {("b", FREE), ("b", TAINTS)}),  # a new one
        (None, [A], set(), {("a", FREE), ("a", TAINTS)}),  # nothing before: all new
    ],
    ids=["same", "less-free", "more-free", "free-unread", "free-back", "tainted", "cleared",
         "taint-changed", "taint-time", "uuid", "capacity", "gone", "new", "first"],
)
def test_device_changes(before, after, worse, better):
    changes = device_changes(before, after)
    assert (set(changes.worse), set(changes.better)) == (worse, better)


def test_held_devices_keep_the_published_side_of_every_change_for_the_better():
    mps = DeviceTaint(TAINT_MPS, "down", "NoSchedule", "T")
    before = [dev("a", 1024, "xid-79"), replace(dev("b", 4096), taints=(mps,))]
    after = [dev("a", 8192), dev("b", 2048), dev("c", 1)]
    assert held_devices(before, after) == [
        dev("a", 1024, "xid-79"),  # the rise and the cleared taint wait
        replace(dev("b", 2048), taints=(mps,)),  # the drop goes, the cleared taint waits
    ]  # the new device waits


SICK = [dev("a", 1024, "remap-pending"), dev("b", 40960)]


@pytest.mark.parametrize(
    ("desired", "publisher", "expected"),
    [
        # never written: nothing held
        ([dev("a", 8192), dev("b", 81920)], Publisher(30.0), [dev("a", 8192), dev("b", 81920)]),
        # the last write 5 s ago, nothing going: everything waits, a new device too
        ([dev("a", 8192), dev("b", 81920), dev("c", 1)], Publisher(30.0, {}, 95.0), SICK),
        # an interval on, calm: everything goes
        ([dev("a", 8192), dev("b", 81920), dev("c", 1)], Publisher(30.0, {}, 60.0),
         [dev("a", 8192), dev("b", 81920), dev("c", 1)]),
        # a device gone goes at once, carrying the calm changes
        ([dev("a", 8192)], Publisher(30.0, {}, 95.0), [dev("a", 8192)]),
    ],
    ids=["first-write", "rate-limit", "calm", "gone"],
)
def test_within_budget(desired, publisher, expected):
    assert within_budget(SICK, desired, publisher, 100.0) == expected

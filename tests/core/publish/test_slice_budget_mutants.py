"""``core.publish.slice_budget`` cases that mutation testing (``scripts/mutation``) found no test
pinned: a device new to the ResourceSlice while the budget holds something, waiting while either
of its parts is held, let go (in its place) while neither is, and the devices after it kept."""

from __future__ import annotations

import pytest

from omaticaya_py.core.publish.budget import Calm
from omaticaya_py.core.publish.dra import TAINT_UNHEALTHY
from omaticaya_py.core.publish.publisher import Publisher
from omaticaya_py.core.publish.slice_budget import FREE, TAINTS, within_budget
from omaticaya_py.core.publish.slice_device import DeviceTaint, SliceDevice

INTERVAL_S, NOW_S, LAST_WRITE_S = 30.0, 100.0, 50.0  # the last write long ago: calm keys go


def dev(name: str, free: int, *taints: str) -> SliceDevice:
    return SliceDevice(
        name, "gpu", False, 0, uuid=f"GPU-{name}", free_memory_mib=free,
        taints=tuple(DeviceTaint(TAINT_UNHEALTHY, v, "NoSchedule") for v in taints),
    )  # fmt: skip


PUBLISHED = [dev("a", 1024), dev("b", 40960)]


@pytest.mark.parametrize(
    ("desired", "calm", "expected"),
    [
        # new device n, its taints' part flapping (got worse 10 s ago), its free memory's calm:
        # n waits; a and b, after it, go
        ([dev("n", 8192), dev("a", 2048), dev("b", 40960)], {("n", TAINTS): Calm(90.0, INTERVAL_S)},
         [dev("a", 2048), dev("b", 40960)]),
        # ... its free memory's part held, its taints' calm: n waits as well
        ([dev("n", 8192), dev("a", 2048), dev("b", 40960)], {("n", FREE): Calm(90.0, INTERVAL_S)},
         [dev("a", 2048), dev("b", 40960)]),
        # a's memory held (it got worse itself 5 s ago); n, calm, goes in its place
        ([dev("a", 8192), dev("n", 4096), dev("b", 40960)], {("a", FREE): Calm(95.0, INTERVAL_S)},
         [dev("a", 1024), dev("n", 4096), dev("b", 40960)]),
    ],
    ids=["new-taints-held", "new-free-held", "new-let-go"],
)  # fmt: skip
def test_a_new_device_while_the_budget_holds_something(desired, calm, expected) -> None:
    publisher = Publisher(INTERVAL_S, calm, LAST_WRITE_S)
    assert within_budget(PUBLISHED, desired, publisher, NOW_S) == expected

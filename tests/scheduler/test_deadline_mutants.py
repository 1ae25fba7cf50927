"""The ``/preempt`` time budget (``scheduler.deadline``) pinned where a mutation run found no
test (``scripts/mutation``): a deadline whose reads may wait no time starts no node, however
much time is left (each read would be cut to nothing)."""

from __future__ import annotations

from omaticaya_py.scheduler.deadline import READS_PER_NODE, Deadline

NOW = 100.0


def clock() -> float:
    return NOW


def test_no_node_starts_when_a_read_may_wait_no_time():
    assert Deadline.start(0.0, clock).read_s == 0.0
    assert not Deadline.start(0.0, clock).node_fits()
    assert not Deadline(NOW + 10.0, 0.0, clock).node_fits()
    assert Deadline(NOW + READS_PER_NODE * 0.5, 0.5, clock).node_fits()

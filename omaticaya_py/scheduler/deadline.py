"""The time budget of one ``/preempt`` call (pure): how long it may read candidate nodes, and
how long each read may wait, so that the answer is sent within kube-scheduler's
``httpTimeout`` for the extender whatever the API server does (issue 30)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MARGIN_S", "READS_PER_NODE", "READ_TIMEOUT_S", "Deadline", "preempt_budget_s"]

#: requests that read one candidate node (``preempt.NodeReader``): a LIST of the Node, one of
#: the pods bound to it
READS_PER_NODE = 2
#: the longest one of those requests may wait, at most (``Deadline.start``: less when a
#: quarter of the budget is less)
READ_TIMEOUT_S = 2.0
#: what a ``/preempt`` call leaves of kube-scheduler's ``httpTimeout`` for the way in and out
#: (the request queued and parsed, the last node decided, the answer encoded and sent), or a
#: fifth of the timeout when that is less
MARGIN_S = 1.0


def preempt_budget_s(http_timeout_s: float) -> float:
    """Seconds one ``/preempt`` call may spend of kube-scheduler's ``httpTimeout`` for the
    extender (``ExtenderSettings.http_timeout_s``): the timeout less ``MARGIN_S``, or less a
    fifth of it when that is less (5 s: 4 s; 2 s: 1.6 s)."""
    return http_timeout_s - min(MARGIN_S, http_timeout_s / 5)


@dataclass(frozen=True, slots=True)
class Deadline:
    """The end of one ``/preempt`` call's budget, ``ends_s`` on ``clock`` (monotonic seconds),
    and ``read_s``, the longest one request that reads a node may wait.

    A node's worst case is ``READS_PER_NODE`` requests of ``read_s``: a node is started only
    while that much is left (``node_fits``), and each request waits at most ``read_s`` and
    never past the end (``read_timeout_s``), so the reads end by ``ends_s`` whatever the API
    server does. Pure: tests drive it with a fake clock."""

    ends_s: float
    read_s: float
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def start(
        cls,
        budget_s: float,
        clock: Callable[[], float] = time.monotonic,
        read_s: float = READ_TIMEOUT_S,
    ) -> Deadline:
        """A deadline ``budget_s`` from now; a request waits at most ``read_s`` or a quarter
        of the budget, whichever is less (so that two nodes' worst cases fit in it)."""
        per_read = max(0.0, min(read_s, budget_s / (2 * READS_PER_NODE)))
        return cls(clock() + budget_s, per_read, clock)

    def left_s(self) -> float:
        """Seconds left (negative once past the end)."""
        return self.ends_s - self.clock()

    def node_fits(self) -> bool:
        """Whether a node may be started: its worst case, ``READS_PER_NODE`` requests of
        ``read_s``, fits in the time left."""
        return self.read_s > 0 and self.left_s() >= READS_PER_NODE * self.read_s

    def read_timeout_s(self) -> float | None:
        """The timeout for the next request: ``read_s``, cut to the time left; ``None`` when
        nothing is left (the request must not be sent)."""
        left = self.left_s()
        return min(self.read_s, left) if left > 0 else None

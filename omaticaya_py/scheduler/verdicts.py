"""Per-need verdicts kept between requests: a request judges only the nodes that changed.

``nodeindex.judge_all`` costs a few dictionary reads and comparisons per name; at 5,000 names
that is most of a filter's time. Most nodes, though, are judged the same way request after
request: their Node, their reservations and their Lease did not change, and their telemetry is
still inside its fresh window. ``Verdicts`` keeps, for one need (MiB x count), the verdict of
every node that ``judge_all`` judged on its fast path (fresh and healthy: it fits with its free
MiB, or it fails with the need's fixed reason), with what it was judged on:

- the Node cache's object (its identity: a new object is a changed Node),
- the ledger's version of the node (``Ledger.version``: a reservation made, confirmed, moved or
  dropped there),
- the Lease object the node was judged by, when it names one and the Lease watch is synced,
- the times it holds until: the end of its fresh window (wall and monotonic clocks, from the
  telemetry or the Lease) and ``NodeRecord.until`` (a pending placement stops counting by age).

A request compares the Node object of every name it asks about in C (``map`` over the names;
no Python code per unchanged name), looks at the nodes whose reservations changed since the
last request (``Ledger.changed_since``) and at the Leases of the kept nodes, and pops the times
passed from two heaps; only the nodes found changed, never seen, or judged on the slow path last time
(stale, unknown, unhealthy, not in the cache: their reasons may name ages, and their policies
differ between filter and prioritize) are judged again, through ``judge_all`` itself. A clock
that goes back, or a Lease watch that comes or goes (``leases`` not equal to the last one),
drops everything kept.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Container, Mapping, Sequence
from itertools import compress, repeat
from operator import is_not
from typing import Any

from ..core.liveness import LeaseOf
from .nodeindex import NodeIndex, NodeRecord, judge_all
from .rules import Need

__all__ = ["Judged", "Verdicts", "VerdictsByNeed"]

_MISSING = object()
INF = float("inf")
#: every this many requests, what is kept of Nodes no longer in the cache is dropped
SWEEP_EVERY = 1024

#: (fitting {name: free MiB after the reservations} in input order, passed without a score,
#: failed {name: reason}; the failed of the fast path first, then the slow path's)
Judged = tuple[dict[str, int], list[str], dict[str, str]]


class Verdicts:
    """The kept verdicts of one ``need`` over ``index`` (see the module's docstring)."""

    def __init__(self, index: NodeIndex, need: Need) -> None:
        self.index, self.need = index, need
        #: nodes judged (a measure of work: the changed ones, not every name asked about)
        self.judged = 0
        self._calls = 0
        self._reset(None)

    def _reset(self, leases: LeaseOf | None) -> None:
        self._state: dict[str, Any] = {}  # name -> the Node cache's object judged
        self._version: dict[str, int] = {}  # name -> the ledger's version judged
        self._lease: dict[str, tuple[str, Any]] = {}  # name -> (Lease ref, Lease object)
        self.free: dict[str, int] = {}  # fitting name -> free MiB
        self.reason: dict[str, str] = {}  # failing name -> reason
        self._wall: list[tuple[float, str, int]] = []  # (until, name, token)
        self._mono: list[tuple[float, str, int]] = []
        self._token: dict[str, int] = {}
        self._count = 0
        self._seq = -1  # the ledger's change number last looked at (-1: none)
        self._leases, self._now, self._mono_now = leases, -INF, -INF

    def _forget(self, name: str) -> None:
        self._state.pop(name, None)
        self._version.pop(name, None)
        self._lease.pop(name, None)
        self._token.pop(name, None)
        self.free.pop(name, None)
        self.reason.pop(name, None)

    def _compact(self) -> None:
        """Drop the heaps' entries of verdicts judged again since (they pile up on the nodes
        reserved on, request after request)."""
        token = self._token
        for heap in (self._wall, self._mono):
            if len(heap) > 2 * len(token) + 1024:
                heap[:] = [e for e in heap if token.get(e[1]) == e[2]]
                heapq.heapify(heap)

    def _expire(self, now: float, now_mono: float) -> None:
        """Forget the nodes whose verdict held until a time now passed."""
        for heap, t in ((self._wall, now), (self._mono, now_mono)):
            while heap and heap[0][0] <= t:  # at the end: judged again (as records are)
                _, name, token = heapq.heappop(heap)
                if self._token.get(name) == token:
                    self._forget(name)

    def judge(
        self, names: Sequence[str], *, now: float, now_mono: float | None,
        leases: LeaseOf | None, slow: Any, prefix: str, grace_s: float, skew_s: float,
        flagged: Container[str] = (), on_fresh: Callable[[str], None] | None = None,
    ) -> Judged:  # fmt: skip
        """``judge_all`` of ``names`` (the same verdicts), judging again only what changed."""
        mono = now_mono if now_mono is not None else -INF
        if leases != self._leases or now < self._now or mono < self._mono_now:
            self._reset(leases)
        self._now, self._mono_now = now, mono
        self._expire(now, mono)
        if leases is not None:
            for name, (ref, lease) in list(self._lease.items()):
                if leases(ref) is not lease:
                    self._forget(name)
        index, lookup = self.index, self.index.lookup
        self._calls += 1
        if self._calls % SWEEP_EVERY == 0:  # Nodes deleted and never asked about again
            for name in [n for n in self._state if lookup(n) is None]:
                self._forget(name)
            index.sweep()
        versions = index.ledger._versions if index.ledger is not None else {}
        if index.ledger is not None:
            seq, moved = index.ledger.changed_since(self._seq)
            if moved is None:  # the first request, or too many changes since: look at all kept
                moved = list(self._version)
            for name in moved:  # forgotten here, judged below if asked about
                if self._version.get(name, -1) != versions.get(name, 0):
                    self._forget(name)
            self._seq = seq
        states = list(map(lookup, names))
        stale = compress(names, map(is_not, states, map(self._state.get, names, repeat(_MISSING))))
        todo = list(dict.fromkeys(stale))
        fast: dict[str, tuple[NodeRecord, float, float, Any]] = {}

        def on_fast(name: str, rec: NodeRecord, wall: float, mono_until: float, lease: Any) -> None:
            fast[name] = (rec, wall, mono_until, lease)

        items = [(name, index.record(name, now), None) for name in todo]
        fits, passed, failed = judge_all(
            items, self.need, now=now, now_mono=now_mono, leases=leases, slow=slow,
            prefix=prefix, grace_s=grace_s, skew_s=skew_s, flagged=flagged,
            on_fresh=on_fresh, on_fast=on_fast,
        )  # fmt: skip
        self.judged += len(todo)
        slow_fits: dict[str, int] = {}
        slow_failed: dict[str, str] = {}
        for name in todo:
            self._forget(name)
        for name, free, _ in fits:
            if name in fast:
                self.free[name] = free
            else:
                slow_fits[name] = free
        for name, why in failed.items():
            if name in fast:
                self.reason[name] = why
            else:
                slow_failed[name] = why
        for name, (rec, wall, mono_until, lease) in fast.items():
            self._state[name] = rec.state
            self._version[name] = rec.version
            if lease is not None:
                self._lease[name] = (rec.state.lease, lease)  # type: ignore[assignment]  # found by it
            self._count += 1
            self._token[name] = token = self._count
            if (until := min(wall, rec.until)) < INF:
                heapq.heappush(self._wall, (until, name, token))
            if mono_until < INF:
                heapq.heappush(self._mono, (mono_until, name, token))
        self._compact()
        if on_fresh is not None and isinstance(flagged, Mapping) and flagged:
            asked = set(names)
            for name in [n for n in flagged if n in asked and n in self._state and n not in fast]:
                on_fresh(name)  # asked about, judged well and kept: its problem is over
        return self._assemble(names, slow_fits, passed, slow_failed)

    def _assemble(self, names: Sequence[str], slow_fits: dict[str, int], passed: list[str],
                  slow_failed: dict[str, str]) -> Judged:  # fmt: skip
        free, reason = self.free, self.reason
        if slow_fits:
            fitting = {n: f for n in names
                       if (f := free.get(n, slow_fits.get(n))) is not None}  # fmt: skip
        else:
            fitting = {n: f for n, f in zip(names, map(free.get, names), strict=True) if f is not None}
        if len(reason) * 4 < len(names):
            asked = set(names) if reason else ()
            failed = {n: r for n, r in reason.items() if n in asked}
        else:
            failed = {n: r for n, r in zip(names, map(reason.get, names), strict=True) if r is not None}
        failed.update(slow_failed)
        return fitting, passed, failed


class VerdictsByNeed:
    """``Verdicts`` for the last few needs asked about (least recently used dropped)."""

    def __init__(self, index: NodeIndex, keep: int = 8) -> None:
        self.index, self.keep = index, keep
        self._by: dict[Need, Verdicts] = {}

    def __call__(self, need: Need) -> Verdicts:
        v = self._by.pop(need, None)
        if v is None:
            v = Verdicts(self.index, need)
            while len(self._by) >= self.keep:
                del self._by[next(iter(self._by))]
        self._by[need] = v
        return v

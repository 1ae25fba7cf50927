"""The fit rule's cache: per-node records and per-need verdicts kept between requests, so that
a request judges only the nodes that changed (``fit`` is the rule; this module only remembers
its answers and says when they no longer hold).

Records (``NodeIndex``): for each node asked about, a ``fit.NodeRecord`` (its GPU state as the
Node cache parsed it, that state less the reservations still counting, its fresh window),
rebuilt only when its Node (a new cache object), its reservations (``Ledger.versions``) or the
time one of them stops counting says so; a Lease's window is recomputed when the Lease watch
holds a new object. A request then costs a few dictionary reads and comparisons per name it
asks about, and nothing for the others.

Verdicts (``Verdicts``). ``fit.judge_all`` costs a few dictionary reads and comparisons per name; at 5,000 names
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
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from itertools import compress, filterfalse, repeat
from operator import ge, is_not, itemgetter, lt, ne, not_
from typing import Any

from ..core.rules.liveness import LeaseOf
from ..core.schema import NodeGpuState
from .bulk import fresh_columns, tell_judged
from .fit import (
    INF,
    Judged,
    JudgingContext,
    NodeRecord,
    ReasonText,
    build_record,
    judge_all,
    room_failure,
)
from .inflight import ASSUME_S, expiry, pending
from .ledger import Ledger
from .need import Need
from .nodeview import FREE_SLOTS
from .records import ages_s

__all__ = ["NodeIndex", "Verdicts", "VerdictsByNeed"]

class NodeIndex:
    """Records by node name over the Node cache (``lookup``) and the ``ledger``, rebuilt on
    change only (see the module's docstring); the windows by ``ttl_s``, ``grace_s`` and
    ``skew_s`` as ``fit.JudgingContext``'s, reservations counting by ``settle_s``."""

    def __init__(
        self, lookup: Callable[[str], NodeGpuState | None], ledger: Ledger | None, *,
        settle_s: float, ttl_s: float, grace_s: float, skew_s: float,
    ) -> None:  # fmt: skip
        self.lookup, self.ledger, self.settle_s = lookup, ledger, settle_s
        self.assume_s = ledger.assume_s if ledger is not None else ASSUME_S
        self._windows = JudgingContext(0.0, ttl_s, grace_s, max_skew_s=skew_s)
        self._versions: Mapping[str, int] = ledger.versions if ledger is not None else {}
        self._records: dict[str, NodeRecord] = {}
        #: records built (a measure of work: one per change, not per request)
        self.builds = 0

    def build(self, state: NodeGpuState, now: float, version: int = 0) -> NodeRecord:
        """The record of ``state`` at ``now`` with the ledger's reservations on its node."""
        held = self.ledger.on_node(state.name) if self.ledger is not None else ()
        live = pending(held, state, now=now, settle_s=self.settle_s, assume_s=self.assume_s)
        until = min((expiry(p, self.settle_s, self.assume_s) for p in live), default=INF)
        return build_record(state, live, self._windows, version=version, until=until)

    def record(self, name: str, now: float) -> NodeRecord | None:
        """The record of node ``name`` (``None``: not in the Node cache)."""
        state = self.lookup(name)
        rec = self._records.get(name)
        version = self._versions.get(name, 0)
        if rec is not None and rec.state is state and rec.version == version and now < rec.until:
            return rec
        if state is None:
            self._records.pop(name, None)
            return None
        rec = self._records[name] = self.build(state, now, version)
        self.builds += 1
        return rec

    def records(self, names: Sequence[str], now: float) -> list[tuple[str, NodeRecord | None]]:
        """``[(name, record)]`` of ``names`` (``record`` inlined for the unchanged ones: this
        is the per-name cost of a request)."""
        recs, lookup, record, versions = self._records, self.lookup, self.record, self._versions
        out: list[tuple[str, NodeRecord | None]] = []
        append = out.append
        for name in names:
            rec = recs.get(name)
            if (rec is None or rec.state is not lookup(name) or now >= rec.until
                    or rec.version != versions.get(name, 0)):  # fmt: skip
                rec = record(name, now)
            append((name, rec))
        return out

    def sweep(self) -> int:
        """Drop the records of Nodes no longer in the Node cache (deleted, never asked about
        again); returns how many. O(records)."""
        gone = [n for n in self._records if self.lookup(n) is None]
        for name in gone:
            self._records.pop(name, None)
        return len(gone)

    def __len__(self) -> int:
        return len(self._records)


_MISSING = object()
#: every this many requests, what is kept of Nodes no longer in the cache is dropped
SWEEP_EVERY = 1024
#: from this many names to judge, the fresh and unreserved ones are judged in bulk
BULK_MIN = 16

#: a kept verdict's end in a heap: (until, name, ``id`` of the state judged, ledger version);
#: it ends that verdict only if the verdict kept is still of that state and version
Entry = tuple[float, str, int, int]


def _bulk_need(need: Need) -> bool:
    """``need`` is judged by the sorted free MiB alone (``fit.room``'s first branch): GPU
    memory on ``count`` GPUs (at most ``nodeview.FREE_SLOTS``), no slice, no device of the
    plugin, no MIG profile, no error."""
    return (need.memory_mib > 0 and 1 <= need.count <= FREE_SLOTS and not need.error
            and not (need.slices or need.exclusive or need.profile))  # fmt: skip


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
        self._version: dict[str, int] = {}  # name -> the ledger's version judged (absent: 0)
        self._lease: dict[str, tuple[str, Any]] = {}  # name -> (Lease ref, Lease object)
        self.free: dict[str, int] = {}  # fitting name -> free MiB
        self.reason: dict[str, ReasonText] = {}  # failing name -> reason
        self._wall: list[Entry] = []
        self._mono: list[Entry] = []
        self._seq = -1  # the ledger's change number last looked at (-1: none)
        self._leases, self._now, self._mono_now = leases, -INF, -INF

    def _forget(self, name: str) -> None:
        self._state.pop(name, None)
        self._version.pop(name, None)
        self._lease.pop(name, None)
        self.free.pop(name, None)
        self.reason.pop(name, None)

    def _current(self, entry: Entry) -> bool:
        """``entry`` ends the verdict kept now for its node (one judged since, on another state
        or version, has its own entry)."""
        _, name, state_id, version = entry
        state = self._state.get(name)
        return state is not None and id(state) == state_id and self._version.get(name, 0) == version

    def _compact(self) -> None:
        """Drop the heaps' entries of verdicts judged again since (they pile up on the nodes
        reserved on, request after request)."""
        for heap in (self._wall, self._mono):
            if len(heap) > 2 * len(self._state) + 1024:
                heap[:] = [e for e in heap if self._current(e)]
                heapq.heapify(heap)

    def _expire(self, now: float, now_mono: float) -> None:
        """Forget the nodes whose verdict held until a time now passed."""
        for heap, t in ((self._wall, now), (self._mono, now_mono)):
            while heap and heap[0][0] <= t:  # at the end: judged again (as records are)
                entry = heapq.heappop(heap)
                if self._current(entry):
                    self._forget(entry[1])

    def _look(self, names: Sequence[str], ctx: JudgingContext
              ) -> dict[str, NodeGpuState | None]:  # fmt: skip
        """Forget what no longer holds at ``ctx``'s clocks (see the module's docstring); the
        names of ``names`` to judge again, once each, in their order, with the Node cache's
        object of each."""
        leases, now = ctx.leases, ctx.now
        mono = ctx.now_mono if ctx.now_mono is not None else -INF
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
        if index.ledger is not None:
            versions = index.ledger.versions
            seq, moved = index.ledger.changed_since(self._seq)
            if moved is None:  # the first request, or too many changes since: look at all kept
                kept = list(self._state)
                moved = list(compress(kept, map(ne, map(self._version.get, kept, repeat(0)),
                                                map(versions.get, kept, repeat(0)))))  # fmt: skip
            for name in moved:  # forgotten here, judged below if asked about
                if self._version.get(name, 0) != versions.get(name, 0):
                    self._forget(name)
            self._seq = seq
        states = list(map(lookup, names))
        if not self._state:  # nothing kept (the first request): every name, with its state
            return dict(zip(names, states, strict=True))
        changed = map(is_not, states, map(self._state.get, names, repeat(_MISSING)))
        return dict(compress(zip(names, states, strict=True), changed))

    def _keep(self, name: str, kept: tuple[NodeRecord, float, float, Any], ages_mono: bool
              ) -> None:  # fmt: skip
        """Keep the verdict of ``name``, judged by its window (``kept``: its record, wall and
        monotonic ends, Lease), until what it holds on changes; ``ages_mono``: the request's
        reservations age on the monotonic clock (``records.ages_s``)."""
        rec, wall, mono_until, lease = kept
        self._state[name] = rec.state
        if rec.version:
            self._version[name] = rec.version
        if lease is not None:
            self._lease[name] = (rec.state.lease, lease)  # type: ignore[assignment]  # found by it
        # a record's ``until`` (a reservation ageing out) is on the clock reservations age on
        # (``records.ages_s``): the monotonic one when the request has it
        if ages_mono:
            wall_until, mono_until = wall, min(mono_until, rec.until)
        else:
            wall_until = min(wall, rec.until)
        if wall_until < INF:
            heapq.heappush(self._wall, (wall_until, name, id(rec.state), rec.version))
        if mono_until < INF:
            heapq.heappush(self._mono, (mono_until, name, id(rec.state), rec.version))

    def _bulk(self, todo: dict[str, NodeGpuState | None], ctx: JudgingContext,
              flagged: Container[str]) -> Collection[str]:  # fmt: skip
        """Judge and keep the nodes of ``todo`` that ``judge_all`` would judge on its fast path
        with a record holding no reservation (``bulk.fresh_columns``, which says which), with
        ``map`` over columns (no Python code per node): on such a node ``fit.room`` decides on
        the state as the Node cache holds it: fits (scored by ``free_total_mib``) when
        ``count`` healthy GPUs have ``memory_mib`` free, else ``NO_ROOM`` (nothing is reserved
        there: never ``IN_FLIGHT``). Returns the names judged (``todo`` itself when every one
        was); the others are for ``judge_all``."""
        cols = fresh_columns(todo, self.index._windows, ctx, self.index.ledger)
        if cols is None:
            return ()
        names, states, versions = cols.names, cols.states, cols.versions
        need = self.need
        fits = list(map(ge, map(itemgetter(need.count - 1), cols.desc), repeat(need.memory_mib)))
        self.free.update(compress(zip(names, cols.free_total, strict=True), fits))
        if False in fits:
            no_room = room_failure(need, ctx.prefix)
            self.reason.update(zip(compress(names, map(not_, fits)), repeat(no_room)))
        if cols.every and not self._state:
            self._state = todo  # the request's own: nothing else holds it
        else:
            self._state.update(zip(names, states, strict=True))
        if versions:
            self._version.update(compress(zip(names, versions, strict=True), versions))
        for heap, until in ((self._wall, cols.wall_until), (self._mono, cols.mono_until)):
            if min(until) < INF:
                ends = compress(zip(until, names, map(id, states), versions or repeat(0), strict=False),
                                map(lt, until, repeat(INF)))  # fmt: skip
                heap.extend(ends)
                heapq.heapify(heap)
        judged: Collection[str] = todo if cols.every else set(names)
        tell_judged(ctx, flagged, judged, names)
        return judged

    def judge(self, names: Sequence[str], ctx: JudgingContext,
              flagged: Container[str] = ()) -> Judged:  # fmt: skip
        """``fit.judge_all`` of ``names`` (the same verdicts), judging again only what
        changed."""
        todo = self._look(names, ctx)
        self.judged += len(todo)
        if self._state:
            for name in list(filter(self._state.__contains__, todo)):  # judged again below
                self._forget(name)
        bulk: Collection[str] = ()
        if len(todo) >= BULK_MIN and _bulk_need(self.need) and ctx.now_mono is not None:
            bulk = self._bulk(todo, ctx, flagged)
        fast: dict[str, tuple[NodeRecord, float, float, Any]] = {}

        def on_fast(name: str, rec: NodeRecord, wall: float, mono_until: float, lease: Any) -> None:
            fast[name] = (rec, wall, mono_until, lease)

        now = ages_s(ctx)
        slow: Iterable[str] = todo
        if bulk:
            slow = () if len(bulk) == len(todo) else filterfalse(bulk.__contains__, todo)
        fits, passed, failed = judge_all(((name, self.index.record(name, now)) for name in slow),
                                         self.need, ctx, flagged, on_fast)  # fmt: skip
        slow_fits = {n: f for n, f in fits.items() if n not in fast}
        slow_failed = {n: r for n, r in failed.items() if n not in fast}
        self.free.update((n, f) for n, f in fits.items() if n in fast)
        self.reason.update((n, r) for n, r in failed.items() if n in fast)
        for name, kept in fast.items():
            self._keep(name, kept, ctx.now_mono is not None)
        self._compact()
        on_problem = ctx.on_problem
        if on_problem is not None and isinstance(flagged, Mapping) and flagged:
            asked = set(names)
            for name in [n for n in flagged if n in asked and n in self._state and n not in fast
                         and n not in bulk]:  # fmt: skip
                on_problem(name, None, "")  # asked about, judged well and kept: its problem is over
        return self._assemble(names, slow_fits, passed, slow_failed)

    def _assemble(self, names: Sequence[str], slow_fits: dict[str, int], passed: list[str],
                  slow_failed: dict[str, ReasonText]) -> Judged:  # fmt: skip
        free, reason = self.free, self.reason
        if slow_fits:
            fitting = {n: f for n in names
                       if (f := free.get(n, slow_fits.get(n))) is not None}  # fmt: skip
        else:  # in C: no Python code per name
            got = list(map(free.get, names))
            fitting = dict(compress(zip(names, got, strict=True), map(is_not, got, repeat(None))))  # type: ignore[arg-type]  # the Nones left out
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

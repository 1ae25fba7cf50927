"""Per-node records for O(names) decisions: what judging a node needs, kept between requests.

A ``NodeRecord`` holds, for one node: its GPU state as the Node cache parsed it (``state``, the
cache's own object: its identity says whether the Node changed), the free MiB of its healthy
GPUs before and after the pending placements of the ledger (sorted, most free first), the state
after them (``left``), whether its telemetry is usable and its health good (``ok``), and the
times between which its telemetry is fresh (``core.liveness``'s rule turned into a window on
the wall and the monotonic clock). ``NodeIndex.record`` rebuilds a node's record only when its
Node (a new cache object), its reservations (``Ledger.version``) or the time one of them stops
counting says so; a Lease's window is recomputed when the Lease watch holds a new object. A
request then costs a few dictionary reads and comparisons per name it was asked about, and
nothing for nodes it was not asked about.

``judge_all`` sorts the names of one request into fitting (with their free MiB after the
reservations), passed without a score (the staleness policies), and failed (with the reason).
Nodes whose record says fresh and healthy are judged here; every other node (stale, unknown,
unhealthy, a Lease's holder gone, a policy override) goes through ``rules.judge`` with its
``left`` state, so that the reasons and policies are the rules' own.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from typing import Any

from ..core.liveness import LeaseOf
from ..core.schema import NodeGpuState
from .inflight import ASSUME_S, Placement, adjust, expiry, pending
from .ledger import Ledger
from .rules import BAD_HEALTH, Need, Verdict, _gpus_text
from .slices import slice_reasons, slice_room

__all__ = ["NodeIndex", "NodeRecord", "build_record", "judge_all", "window"]

INF = float("inf")

#: (wall_from, wall_until, mono_until): fresh while wall_from <= now <= wall_until and the
#: monotonic clock <= mono_until
Window = tuple[float, float, float]


def window(published_s: float, valid_s: float, seen: Any, grace_s: float, skew_s: float) -> Window:
    """``core.liveness.judge_liveness`` as a window: the published time is not ahead once the
    wall clock reaches ``published_s - skew_s``; its age is the time since ``seen`` changed it
    (monotonic), or, before a change was seen, the larger of that and the publisher's age."""
    limit = valid_s + grace_s
    wall_from = published_s - skew_s
    if seen is None:
        return wall_from, published_s + limit, INF
    if seen.changed:
        return wall_from, INF, seen.at_s + limit
    return wall_from, published_s + limit, seen.at_s + limit


class NodeRecord:
    """What judging one node needs (see the module's docstring). ``until``: the wall time at
    which a pending placement stops counting by age (the record is rebuilt then)."""

    __slots__ = ("state", "version", "until", "left", "raw", "fits", "free", "ok", "win",
                 "lease", "lease_win", "pending")  # fmt: skip

    def __init__(self, state: NodeGpuState, version: int, until: float, left: NodeGpuState,
                 raw: tuple[int, ...], fits: tuple[int, ...], ok: bool, win: Window,
                 pending: int) -> None:  # fmt: skip
        self.state, self.version, self.until, self.left = state, version, until, left
        self.raw, self.fits, self.free, self.ok, self.win = raw, fits, left.free_total_mib, ok, win
        self.lease: Any = None
        self.lease_win: Window = (INF, -INF, -INF)
        self.pending = pending


def _sorted_free(state: NodeGpuState) -> tuple[int, ...]:
    return tuple(sorted((g.free_mib for g in state.gpus if g.healthy), reverse=True))


def build_record(
    state: NodeGpuState, placements: Sequence[Placement], *, version: int = 0, now: float,
    settle_s: float, assume_s: float = ASSUME_S, ttl_s: float, grace_s: float, skew_s: float,
) -> NodeRecord:  # fmt: skip
    """The record of ``state`` with ``placements`` (the ledger's on its node) at ``now``."""
    live = pending(placements, state, now=now, settle_s=settle_s, assume_s=assume_s)
    until = min((expiry(p, settle_s, assume_s) for p in live), default=INF)
    left = adjust(state, live) if live else state
    ok = (
        state.known and state.read_at is not None and not state.problem
        and state.health is not None and state.health not in BAD_HEALTH
    )  # fmt: skip
    win: Window = (INF, -INF, -INF)
    if ok:
        read_at = state.read_at or 0.0
        valid = state.expires_at - read_at if state.expires_at is not None else ttl_s
        win = window(read_at, valid, getattr(state, "seen", None), grace_s, skew_s)
    raw = _sorted_free(state)
    return NodeRecord(state, version, until, left, raw, _sorted_free(left) if live else raw, ok,
                      win, len(live))  # fmt: skip


class NodeIndex:
    """Records by node name over the Node cache (``lookup``) and the ``ledger``, rebuilt on
    change only (see the module's docstring). Judging settings as ``rules.judge``'s."""

    def __init__(
        self, lookup: Callable[[str], NodeGpuState | None], ledger: Ledger | None, *,
        settle_s: float, ttl_s: float, grace_s: float, skew_s: float,
    ) -> None:  # fmt: skip
        self.lookup, self.ledger = lookup, ledger
        self.params: dict[str, Any] = {"settle_s": settle_s, "ttl_s": ttl_s, "grace_s": grace_s, "skew_s": skew_s,
                       "assume_s": ledger.assume_s if ledger is not None else ASSUME_S}  # fmt: skip
        self._records: dict[str, NodeRecord] = {}
        #: records built (a measure of work: one per change, not per request)
        self.builds = 0

    def record(self, name: str, now: float) -> NodeRecord | None:
        """The record of node ``name`` (``None``: not in the Node cache)."""
        state = self.lookup(name)
        rec = self._records.get(name)
        ledger = self.ledger
        version = ledger._versions.get(name, 0) if ledger is not None else 0
        if rec is not None and rec.state is state and rec.version == version and now < rec.until:
            return rec
        if state is None:
            self._records.pop(name, None)
            return None
        held = ledger.on_node(name) if ledger is not None else ()
        rec = build_record(state, held, version=version, now=now, **self.params)
        self._records[name] = rec
        self.builds += 1
        return rec

    def records(self, names: Sequence[str], now: float) -> list[tuple[str, NodeRecord | None, None]]:
        """``[(name, record, None)]`` of ``names`` (``record`` inlined for the unchanged ones:
        this is the per-name cost of a request)."""
        recs, lookup, record = self._records, self.lookup, self.record
        versions = self.ledger._versions if self.ledger is not None else {}
        out: list[tuple[str, NodeRecord | None, None]] = []
        append = out.append
        for name in names:
            rec = recs.get(name)
            if (rec is None or rec.state is not lookup(name) or now >= rec.until
                    or rec.version != versions.get(name, 0)):  # fmt: skip
                rec = record(name, now)
            append((name, rec, None))
        return out

    def ad_hoc(self, state: NodeGpuState, now: float) -> NodeRecord:
        """The record of a state parsed from a whole Node in the request (not kept)."""
        held = self.ledger.on_node(state.name) if self.ledger is not None else ()
        return build_record(state, held, now=now, **self.params)

    def sweep(self) -> int:
        """Drop the records of Nodes no longer in the Node cache (deleted, never asked about
        again); returns how many. O(records)."""
        gone = [n for n in self._records if self.lookup(n) is None]
        for name in gone:
            self._records.pop(name, None)
        return len(gone)

    def __len__(self) -> int:
        return len(self._records)


#: judge one node the slow way: (name, state, left) -> Verdict (``rules.judge`` bound to the
#: request, through ``rules.judge_safely``)
Slow = Callable[[str, "NodeGpuState | None", "NodeGpuState | None"], Verdict]

#: told of a node judged fresh: (name, record, wall_until, mono_until, Lease object or None)
OnFast = Callable[[str, NodeRecord, float, float, Any], None]


def judge_all(
    items: Sequence[tuple[str, NodeRecord | None, NodeGpuState | None]],
    need: Need,
    *,
    now: float,
    now_mono: float | None,
    leases: LeaseOf | None,
    slow: Slow,
    prefix: str,
    grace_s: float,
    skew_s: float,
    flagged: Container[str] = (),
    on_fresh: Callable[[str], None] | None = None,
    on_fast: OnFast | None = None,
) -> tuple[list[tuple[str, int, NodeRecord | None]], list[str], dict[str, str]]:
    """(fitting ``[(name, free MiB after the reservations, record)]``, passed without a score,
    failed ``{name: reason}``), each in input order. ``items``: ``(name, record, state)``;
    ``flagged``: names with a problem on record (``on_fresh(name)`` is told when one judges
    well here); ``on_fast(name, record, wall_until, mono_until, lease)`` hears of each node
    judged fresh here, with the end of its fresh window (epoch s, monotonic s) and the Lease
    object it was judged by (``None``: by its telemetry's times): ``verdicts.Verdicts``."""
    mem, count = need.memory_mib, need.count
    wanted = f"pod needs {_gpus_text(count)} with {mem} MiB free"
    no_room = f"node(s) had no room: {wanted} ({prefix})"
    taken = (f"node(s) had room taken by in-flight pods: {wanted}, and pods placed there are "
             f"not in its telemetry yet ({prefix})")  # fmt: skip
    sliced = bool(need.slices)
    slice_no_room, slice_taken = slice_reasons(need, prefix) if sliced else ("", "")
    fits: list[tuple[str, int, NodeRecord | None]] = []
    passed: list[str] = []
    failed: dict[str, str] = {}
    mono = now_mono if now_mono is not None else -INF
    k = count - 1
    for name, rec, state in items:
        fresh = False
        if rec is not None and rec.ok and now_mono is not None:
            ref = rec.state.lease if leases is not None else None
            if ref is None:
                w = rec.win
                fresh = w[0] <= now <= w[1] and mono <= w[2]
                if fresh and on_fast is not None:
                    on_fast(name, rec, w[1], w[2], None)
            else:
                lease = leases(ref)  # type: ignore[misc]
                if lease is not None and lease.holder:
                    if lease is not rec.lease:
                        rec.lease = lease
                        rec.lease_win = window(lease.renewed_at, lease.duration_s, lease.seen,
                                               grace_s, skew_s)  # fmt: skip
                    w, lw = rec.win, rec.lease_win
                    fresh = w[0] <= now and lw[0] <= now <= lw[1] and mono <= lw[2]
                    if fresh and on_fast is not None:
                        on_fast(name, rec, lw[1], lw[2], lease)
        if fresh:
            if name in flagged and on_fresh is not None:
                on_fresh(name)
            if sliced:
                room = slice_room(rec.left, need)  # type: ignore[union-attr]
                if room is not None:
                    fits.append((name, room, rec))
                else:
                    failed[name] = (slice_taken if slice_room(rec.state, need) is not None  # type: ignore[union-attr]
                                    else slice_no_room)  # fmt: skip
                continue
            f = rec.fits  # type: ignore[union-attr]
            if len(f) > k and f[k] >= mem:
                fits.append((name, rec.free, rec))  # type: ignore[union-attr]
            else:
                r = rec.raw  # type: ignore[union-attr]
                failed[name] = taken if len(r) > k and r[k] >= mem else no_room
            continue
        v = slow(name, state if rec is None else rec.state, None if rec is None else rec.left)
        if not v.ok:
            failed[name] = v.reason
        elif v.fits:
            fits.append((name, v.free_mib, rec))
        else:
            passed.append(name)
    return fits, passed, failed


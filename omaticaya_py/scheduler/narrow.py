"""The exact reservation rule: the filter narrows a pod to its one best node and reserves its
GPU memory there.

``Narrowing.filter`` judges the nodes the scheduler asked about (``nodeindex.judge_all``: O(1)
per name over the per-node records), picks among those that fit the one the strategy prefers
(``binpack``: the least free memory after the reservations, ``spread``: the most; ties: the
first asked about), returns only that node as passing (every other node that passed fails with
``OTHER_NODE``), and reserves the pod's need there in the ledger, on the GPUs the device plugin
would give it (``inflight.choose_gpus``). A refilter of the same pod (by uid) first releases its
earlier reservation. When no node fits, the nodes that the staleness policies let pass (no
known room: nothing to reserve) pass as before. ``Narrowing.prioritize`` scores as
``rules.prioritize_nodes`` does, the node holding the pod's reservation first.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from itertools import repeat
from operator import add, mul, sub, truediv
from typing import Any

from ..core.schema import NodeGpuState, json_mapping
from .inflight import Placement, choose_gpus
from .ledger import Ledger
from .nodeindex import NodeIndex, NodeRecord, judge_all
from .rules import MAX_PRIORITY, MIN_PRIORITY, Need, ProblemOf, Verdict, judge, judge_safely
from .slices import place_slices
from .staleness import effective
from .verdicts import VerdictsByNeed

__all__ = ["OTHER_NODE", "ItemsOf", "Narrowing", "flagged_of"]

#: the reason of a node that fits but lost to the chosen one (``{prefix}`` filled in); short:
#: at 5,000 names it is most of the answer
OTHER_NODE = "node(s) fit, another was chosen ({prefix})"

#: (name, record or None, state or None) of each node of a request
Items = list[tuple[str, "NodeRecord | None", "NodeGpuState | None"]]


def _pod_id(pod: Any) -> tuple[str, str]:
    meta = json_mapping(json_mapping(pod).get("metadata"))
    uid = meta.get("uid")
    return (uid if isinstance(uid, str) else ""), f"{meta.get('namespace', '')}/{meta.get('name', '')}"


#: prioritize reuses the judging of the same pod's filter (same uid and need) this recent, s:
#: kube-scheduler sends it right after the filter, with the names that passed
REUSE_S = 1.0


class ItemsOf:
    """The nodes of one request: ``names`` (``NodeNames``), or ``states`` (parsed from whole
    ``Nodes``); called with the time, their records (``Narrowing.items``)."""

    def __init__(self, narrowing: Narrowing, names: Sequence[str] | None,
                 states: Sequence[tuple[str, Any]] = ()) -> None:  # fmt: skip
        self._narrowing, self._names, self._states = narrowing, names, states

    @property
    def by_name(self) -> bool:
        """Whether the request named its nodes (``NodeNames``: the cache's records)."""
        return self._names is not None

    @property
    def names(self) -> Sequence[str]:
        return self._names if self._names is not None else [n for n, _ in self._states]

    def __call__(self, now: float) -> Items:
        return self._narrowing.items(self._names, self._states, now)


class Narrowing:
    """The rule over a ``ledger`` and the Node cache's ``lookup``; judging settings from
    ``settings`` (``ExtenderSettings``)."""

    def __init__(self, settings: Any, lookup: Callable[[str], NodeGpuState | None],
                 ledger: Ledger) -> None:  # fmt: skip
        self.settings, self.ledger = settings, ledger
        #: (uid, need, time, names asked, {fitting name: free MiB}) of the last filter
        self._last: tuple[str, Need, float, Sequence[str] | None, dict[str, int]] | None = None
        self.index = NodeIndex(
            lookup, ledger, settle_s=settings.settle_s, ttl_s=settings.ttl_s,
            grace_s=settings.grace_s, skew_s=settings.max_clock_skew_s,
        )  # fmt: skip
        #: the kept verdicts by need (``verdicts``): a request judges only what changed
        self.verdicts = VerdictsByNeed(self.index)

    def items(self, names: Sequence[str] | None, states: Sequence[tuple[str, Any]], now: float
              ) -> Items:  # fmt: skip
        """Records of the names asked about (kept), or of the whole Nodes sent (ad hoc)."""
        if names is not None:
            return self.index.records(names, now)  # type: ignore[return-value]  # list: invariant
        return [(n, self.index.ad_hoc(s, now) if s is not None else None, s) for n, s in states]

    def _judge(self, items_of: Callable[[float], Items], need: Need, clocks: dict[str, Any],
               judging: Callable[..., Verdict], flagged: Container[str]
               ) -> tuple[dict[str, int], list[str], dict[str, str]]:  # fmt: skip
        """({fitting name: free MiB} in input order, passed without a score, failed
        {name: reason}): by the kept verdicts (``verdicts``) for ``NodeNames``, else
        ``judge_all`` over the Nodes sent."""
        on_problem: ProblemOf | None = clocks.get("on_problem")

        def slow(name: str, state: NodeGpuState | None, left: NodeGpuState | None) -> Verdict:
            def one(st: NodeGpuState | None, _: Sequence[Placement]) -> Verdict:
                return judging(st, left)

            return judge_safely(name, state, one, None, on_problem)

        kw = {
            "now": clocks["now"], "now_mono": clocks["now_mono"], "leases": clocks["leases"],
            "slow": slow, "prefix": clocks["prefix"], "grace_s": clocks["grace_s"],
            "skew_s": clocks["max_skew_s"], "flagged": flagged,
            "on_fresh": (lambda name: on_problem(name, None, "")) if on_problem else None,
        }  # fmt: skip
        names = items_of.names if isinstance(items_of, ItemsOf) else None
        if isinstance(items_of, ItemsOf) and items_of.by_name:
            return self.verdicts(need).judge(names, **kw)  # type: ignore[arg-type]
        fits, passed, failed = judge_all(items_of(clocks["now"]), need, **kw)
        return {name: f for name, f, _ in fits}, passed, failed

    def _record(self, items_of: Callable[[float], Items], name: str, now: float
                ) -> NodeRecord | None:  # fmt: skip
        """The record of node ``name`` of this request (kept, or made from the Node sent)."""
        if isinstance(items_of, ItemsOf) and items_of.by_name:
            return self.index.record(name, now)
        return next((rec for n, rec, _ in items_of(now) if n == name), None)

    def filter(self, pod: Any, need: Need, items_of: Callable[[float], Items],
               clocks: dict[str, Any], flagged: Container[str] = ()
               ) -> tuple[list[str], dict[str, str]]:  # fmt: skip
        """(the one node chosen, or the nodes the policies let pass when none fits;
        {name: reason} for the others). Reserves the pod's need on the chosen node."""
        s, now = self.settings, clocks["now"]
        uid, key = _pod_id(pod)
        if uid:
            self.ledger.release(uid)  # a refilter replaces the earlier reservation
        kw = {k: v for k, v in clocks.items() if k != "on_problem"}
        kw.update(fail_open=s.fail_open, unknown_policy=s.unknown_policy)

        def judging(state: NodeGpuState | None, left: NodeGpuState | None) -> Verdict:
            return judge(state, need, left=left, **kw)

        fits, passed, failed = self._judge(items_of, need, clocks, judging, flagged)
        self._last = (uid, need, now, items_of.names if isinstance(items_of, ItemsOf) else None,
                      fits)  # fmt: skip
        if not fits:
            return passed, failed
        pick = min if s.strategy == "binpack" else max
        best = pick(fits, key=fits.__getitem__)  # ties: the first asked about
        other = OTHER_NODE.format(prefix=s.prefix)
        if len(failed) * 2 < len(fits):
            failed = {**dict.fromkeys(fits, other), **dict.fromkeys(passed, other), **failed}
        else:
            failed.update(dict.fromkeys(fits, other))
            failed.update(dict.fromkeys(passed, other))
        del failed[best]
        rec = self._record(items_of, best, now)
        if uid and rec is not None:
            self.ledger.reserve(_reservation(need, rec, key, uid, best, now, s.strategy))
        return [best], failed

    def prioritize(self, pod: Any, need: Need, items_of: Callable[[float], Items],
                   clocks: dict[str, Any], flagged: Container[str] = ()
                   ) -> list[dict[str, Any]]:  # fmt: skip
        """A HostPriorityList as ``rules.prioritize_nodes``; the node holding the pod's
        reservation scores ``MAX_PRIORITY``."""
        stale_policy = clocks.get("stale_policy") or ""
        kw = {k: v for k, v in clocks.items() if k not in ("on_problem", "stale_policy")}

        def judging(state: NodeGpuState | None, left: NodeGpuState | None) -> Verdict:
            allow = effective(state, stale_policy) == "allow"
            return judge(state, need, left=left, fail_open=False,
                         stale_policy="allow" if allow else "reject", **kw)  # fmt: skip

        uid, _ = _pod_id(pod)
        names = items_of.names if isinstance(items_of, ItemsOf) else None
        if names is None:
            names = [t[0] for t in items_of(clocks["now"])]
        last = self._last
        if (last is not None and uid and last[0] == uid and last[1] == need
                and 0 <= clocks["now"] - last[2] <= REUSE_S and last[3] is not None
                and (names == last[3] or set(names) <= set(last[3]))):  # fmt: skip
            # right after this pod's filter (kube-scheduler's order, with the names that
            # passed, or all of them): its judging stands
            if names is last[3] or names == last[3]:
                free = last[4]
            else:
                get = last[4].get
                free = {name: f for name in names if (f := get(name)) is not None}
        else:
            free, _, _ = self._judge(items_of, need, clocks, judging, flagged)
        mine = self.ledger.get(uid) if uid else None
        lo, hi = (min(free.values()), max(free.values())) if free else (0, 0)
        span = hi - lo
        if span == 0:
            scores = dict.fromkeys(free, MAX_PRIORITY)
        else:
            scores = dict(zip(free, _scaled(free.values(), lo, span, self.settings.strategy),
                              strict=True))  # fmt: skip
        if mine is not None:
            scores[mine.node] = MAX_PRIORITY
        get = scores.get
        return [{"Host": name, "Score": get(name, MIN_PRIORITY)} for name in names]


def _reservation(need: Need, rec: NodeRecord, key: str, uid: str, node: str, now: float,
                 strategy: str) -> Placement:  # fmt: skip
    """The pod's reservation on ``node`` (its record ``rec``): on the GPUs the device plugin
    would give it (``inflight.choose_gpus``: for whole devices the plugin's own order; slices:
    ``slices.place_slices``, in container order,
    best fit when ``strategy`` cannot place them all)."""
    if need.slices:
        units = need.slices  # container order, as the kubelet allocates them
        mibs = need.slice_mibs(rec.left.share_unit_mib or 0)
        unit = rec.left.share_unit_mib or 1
        placed = (place_slices(rec.left.shared, mibs, strategy, unit)
                  or place_slices(rec.left.shared, mibs, unit_mib=unit))  # fmt: skip
        return Placement(key, uid, node, 0, 0, placed_at=now, slices=units,
                         baseline_free_mib=rec.state.shared_free_total_mib,
                         gpus=placed[0] if placed else (), bound=False)  # fmt: skip
    gpus = choose_gpus(rec.left, need.memory_mib, need.count, strategy, exclusive=need.exclusive)
    return Placement(key, uid, node, need.memory_mib, need.count, placed_at=now,
                     baseline_free_mib=rec.state.live_free_total_mib, gpus=gpus, bound=False,
                     exclusive=need.exclusive)  # fmt: skip


def _scaled(free: Iterable[int], lo: int, span: int, strategy: str) -> Iterator[int]:
    """Scores 1..``MAX_PRIORITY`` of free MiB between ``lo`` and ``lo + span`` (``span`` > 0):
    ``binpack`` 10 to the least free, ``spread`` to the most. The arithmetic of
    ``rules.prioritize_nodes`` (the same operations in the same order: the same scores), in
    ``map`` so that no Python code runs per node."""
    top = MAX_PRIORITY - 1
    frac = map(truediv, map(sub, free, repeat(lo)), repeat(span))
    if strategy == "binpack":
        frac = map(sub, repeat(1.0), frac)
    return map(add, repeat(1), map(round, map(mul, frac, repeat(top))))


def flagged_of(on_problem: Any) -> Container[str]:
    """The names with a judging problem on record (``app.NodeProblems.flagged``), or every
    name (``on_problem`` then hears of each node) when it keeps none."""
    owner = getattr(on_problem, "__self__", None)
    flagged = getattr(owner, "flagged", None)
    return flagged if flagged is not None else _Everything()


class _Everything:
    def __contains__(self, item: object) -> bool:
        return True


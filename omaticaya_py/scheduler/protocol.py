"""The kube-scheduler extender protocol (``k8s.io/kube-scheduler/extender/v1``): ExtenderArgs in,
results out, every verb judged by the one fit rule (``fit``).

With a reservation ledger (``ledger``; ``settle_s`` > 0) the filter *narrows* each pod to its
one best node and reserves its need there (``Narrowing``): it judges the nodes asked about
(``cache.Verdicts`` for ``NodeNames``: only what changed; ``fit.judge_all`` over whole Nodes),
picks among those that fit the one the strategy prefers (``binpack``: the least free memory
after the reservations, ``spread``: the most; ties: the first asked about), returns only that
node as passing (every other node that passed fails with ``OTHER_NODE``), and reserves the pod's
need there, on the devices the device plugin would give it (``core.allocation.placement.place``). A
refilter of the same pod (by uid) first releases its earlier reservation. When no node fits, the nodes that the staleness policies let pass (no known room:
nothing to reserve) pass as before. Prioritize scores as the filter judged (``fit.scores``), the
node holding the pod's reservation first. Without a ledger each request is judged node by node
(``fit.judge_each``), the in-flight placements taken from ``Extender.placements``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import Any

from ..core.allocation.placement import Taken, place
from ..core.allocation.policy import policy_sign
from ..core.rules.liveness import LeaseOf
from ..core.schema import NodeGpuState, json_mapping, json_str
from .cache import NodeIndex, VerdictsByNeed
from .fit import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    InFlightOf,
    Judged,
    JudgingContext,
    NodeRecord,
    ProblemOf,
    Reason,
    ReasonText,
    by_links,
    judge_all,
    judge_each,
    link_scores,
    reason_text,
    scores,
)
from .inflight import ASSUME_S, Placement, baselines, pending
from .ledger import Ledger
from .metrics import Decisions
from .need import Need, pod_need
from .nodeview import view_from_object
from .records import ages_s
from .room_sought import RoomSought
from .settings import ExtenderSettings
from .victims import unresolvable

# ------------------------------------------------------------------- protocol handlers ----


Lookup = Callable[[str], "NodeGpuState | None"]


#: prioritize reuses the judging of the same pod's filter (same uid and need) this recent, s:
#: kube-scheduler sends it right after the filter, with the names that passed
REUSE_S = 1.0


def pod_name(pod: Any) -> str:
    """``namespace/name`` of a pod document (parts it lacks are empty)."""
    meta = json_mapping(json_mapping(pod).get("metadata"))
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def pod_uid(pod: Any) -> str:
    """``metadata.uid`` of a pod document ("" when it has none, or not as text)."""
    uid = json_mapping(json_mapping(pod).get("metadata")).get("uid")
    return uid if isinstance(uid, str) else ""


@dataclass(frozen=True, slots=True)
class Asked:
    """The nodes one request asks about, in its order: by ``names`` (``NodeNames``: the Node
    cache's records), with ``states`` ``None``; or as whole Nodes, parsed (``states``)."""

    names: Sequence[str]
    states: Sequence[tuple[str, NodeGpuState | None]] | None = None


class Narrowing:
    """The reservation rule (the module's docstring) over a ``ledger`` and the Node cache's
    ``lookup``; settings from ``settings`` (``ExtenderSettings``)."""

    def __init__(self, settings: ExtenderSettings, lookup: Callable[[str], NodeGpuState | None],
                 ledger: Ledger) -> None:  # fmt: skip
        self.settings, self.ledger = settings, ledger
        #: (uid, need, time, names asked, {fitting name: free MiB}) of the last filter
        self._last: tuple[str, Need, float, Sequence[str], dict[str, int]] | None = None
        self.index = NodeIndex(
            lookup, ledger, settle_s=settings.settle_s, ttl_s=settings.ttl_s,
            grace_s=settings.grace_s, skew_s=settings.max_clock_skew_s,
        )  # fmt: skip
        #: the kept verdicts by need (``cache``): a request judges only what changed
        self.verdicts = VerdictsByNeed(self.index)

    def judged(self, asked: Asked, need: Need, ctx: JudgingContext,
               flagged: Container[str]) -> Judged:  # fmt: skip
        """The fit rule over the nodes asked about: the kept verdicts for ``NodeNames``, else
        ``fit.judge_all`` over records made for the Nodes sent."""
        if asked.states is None:
            return self.verdicts(need).judge(asked.names, ctx, flagged)
        build = self.index.build
        return judge_all(((n, build(s, ages_s(ctx)) if s is not None else None)
                          for n, s in asked.states), need, ctx, flagged)  # fmt: skip

    def _record(self, asked: Asked, name: str, now: float) -> NodeRecord | None:
        if asked.states is None:
            return self.index.record(name, now)
        state = dict(asked.states).get(name)
        return self.index.build(state, now) if state is not None else None

    def filter(self, pod: Any, need: Need, asked: Asked, ctx: JudgingContext,
               flagged: Container[str] = ()) -> tuple[list[str], dict[str, ReasonText]]:  # fmt: skip
        """(the one node chosen, or the nodes the policies let pass when none fits;
        {name: reason} for the others). Reserves the pod's need on the chosen node."""
        uid = pod_uid(pod)
        if uid:
            self.ledger.release(uid)  # a refilter replaces the earlier reservation
        fits, passed, failed = self.judged(asked, need, ctx, flagged)
        self._last = (uid, need, ctx.now, asked.names, fits)
        if not fits:
            return passed, failed
        sign = policy_sign(self.settings.placement_policy)
        links = self._links(asked, need, fits, ages_s(ctx))
        # the best connected set first (pods of several whole GPUs), then by the policy;
        # ties: the first asked about
        if links:
            best = min(fits, key=lambda name: (-links.get(name, 0), sign * fits[name]))
        else:  # the same, in C: min and max keep the first of equals
            best = (min if sign > 0 else max)(fits, key=fits.__getitem__)
        other = reason_text(Reason.OTHER_NODE, prefix=ctx.prefix)
        if len(failed) * 2 < len(fits):
            others = dict.fromkeys(fits, other)
            others.update(zip(passed, repeat(other)))
            others.update(failed)
            failed = others
        else:
            failed.update(zip(fits, repeat(other)))
            failed.update(zip(passed, repeat(other)))
        del failed[best]
        rec = self._record(asked, best, ages_s(ctx))
        if uid and rec is not None:
            self.ledger.reserve(reservation(need, rec, pod_name(pod), uid, ages_s(ctx),
                                            self.settings.placement_policy))  # fmt: skip
        return [best], failed

    def _links(self, asked: Asked, need: Need, fits: Mapping[str, int], now: float
               ) -> dict[str, int]:  # fmt: skip
        """``fit.link_scores`` of the fitting nodes (``{}`` unless the need is ranked by
        links)."""
        if not by_links(need):
            return {}
        return link_scores(((name, self._record(asked, name, now)) for name in fits), need,
                           self.settings.placement_policy)  # fmt: skip

    def _reused(self, pod: Any, need: Need, names: Sequence[str], now: float
                ) -> dict[str, int] | None:  # fmt: skip
        """The fitting nodes of this pod's filter when it was right before (kube-scheduler's
        order, with the names that passed, or all of them): its judging stands."""
        last, uid = self._last, pod_uid(pod)
        if (last is None or not uid or last[0] != uid or last[1] != need
                or not 0 <= now - last[2] <= REUSE_S):  # fmt: skip
            return None
        if names is last[3] or names == last[3]:
            return last[4]
        if not set(names) <= set(last[3]):
            return None
        get = last[4].get
        return {name: f for name in names if (f := get(name)) is not None}

    def prioritize(self, pod: Any, need: Need, asked: Asked, ctx: JudgingContext,
                   flagged: Container[str] = ()) -> list[dict[str, Any]]:  # fmt: skip
        """A HostPriorityList (``fit.scores`` of the fitting nodes, judged for scoring); the
        node holding the pod's reservation scores ``MAX_PRIORITY``."""
        free = self._reused(pod, need, asked.names, ctx.now)
        if free is None:
            free, _, _ = self.judged(asked, need, replace(ctx, scoring=True), flagged)
        links = self._links(asked, need, free, ages_s(ctx))
        scored = scores(free, self.settings.placement_policy, links)
        uid = pod_uid(pod)
        mine = self.ledger.get(uid) if uid else None
        if mine is not None:
            scored[mine.node] = MAX_PRIORITY
        get = scored.get
        return [{"Host": name, "Score": get(name, MIN_PRIORITY)} for name in asked.names]


def reservation(need: Need, rec: NodeRecord, key: str, uid: str, now: float,
                strategy: str) -> Placement:  # fmt: skip
    """The pod's reservation on ``rec``'s node: on the devices the device plugin would give it,
    by the placement model (``core.allocation.placement.place`` under ``strategy``, the plugin's policy
    too): its whole GPUs or MIG devices, and its slices in ``need.slices``' order. A pod that
    passed the filter fits; otherwise its devices are left unknown (taken from the freest)."""
    node = rec.state.name
    taken = place(rec.left, need, strategy) or Taken()
    if need.slices:
        p = Placement(key, uid, node, need.memory_mib, need.count, placed_at=now,
                      slices=need.slices, gpus=taken.slices, whole_gpus=taken.gpus, bound=False,
                      exclusive=need.exclusive, slice_memory=need.slice_memory)  # fmt: skip
    else:
        p = Placement(key, uid, node, need.memory_mib, need.count, placed_at=now, bound=False,
                      gpus=taken.gpus, exclusive=need.exclusive, profile=need.profile,
                      migs=taken.migs)  # fmt: skip
    return replace(p, baselines=baselines(rec.state, p))


class _Everything:
    def __contains__(self, item: object) -> bool:
        return True


@dataclass
class Extender:
    """The protocol handlers bound to settings and a node lookup (the cache's ``get``)."""

    settings: ExtenderSettings
    lookup: Lookup = field(default=lambda name: None)
    clock: Callable[[], float] = time.time
    synced: Callable[[], bool] = field(default=lambda: True)
    #: (ready, reason) of the node cache (``NodeCache.health``): a dead or stalled watch
    health: Callable[[], tuple[bool, str]] = field(default=lambda: (True, "ok"))
    #: the placements known on a node when there is no ``ledger`` (tests, pure callers);
    #: ``pending`` decides which still count
    placements: Callable[[str], Sequence[Placement]] = field(default=lambda name: ())
    #: every decision counted and logged (``omaticaya_extender_decisions_total``)
    decisions: Decisions = field(default_factory=Decisions)
    #: a Lease by ``"<namespace>/<name>"`` (``LeaseCache.lease``), ``None``: no Lease watch;
    #: used only while ``leases_synced()``, else nodes are judged by their telemetry's times
    leases: LeaseOf | None = None
    leases_synced: Callable[[], bool] = field(default=lambda: True)
    #: the monotonic clock the watches' ``Seen`` times are on (``core.rules.liveness``)
    monotonic: Callable[[], float] = time.monotonic
    #: told of each node's problem at judging time (a time ahead of the clock, judging
    #: raised): ``app.NodeProblems.judged``
    on_problem: ProblemOf | None = None
    #: the names with a judging problem on record (``app.NodeProblems.flagged``): the others
    #: need not be told that they judged well; ``None``: ``on_problem`` hears of every node
    flagged: Container[str] | None = None
    #: the reservation ledger (``scheduler.ledger``): with it (and ``settle_s`` > 0) the
    #: filter narrows each pod to one node and reserves its need there (``Narrowing``)
    ledger: Ledger | None = None
    #: the nodes each pod's filter failed for GPU room alone, which ``/preempt`` adds to
    #: kube-scheduler's candidates (``victims.RoomSought``)
    room_sought: RoomSought = field(default_factory=RoomSought)
    #: preemption kube-scheduler never asks for (``unasked.UnaskedPreemption``), told of each
    #: GPU pod's room failures; ``None``: off (``OMATICAYA_EXTENDER_PREEMPT_UNASKED``)
    unasked: Any = None
    _narrowing: Narrowing | None = field(default=None, repr=False)

    def narrowing(self) -> Narrowing | None:
        """The reservation rule over ``ledger``, built for the current settings."""
        if self.ledger is None or self.settings.settle_s <= 0:
            return None
        n = self._narrowing
        if n is None or n.settings is not self.settings or n.index.lookup is not self.lookup:
            n = self._narrowing = Narrowing(self.settings, self.lookup, self.ledger)
        return n

    def context(self) -> JudgingContext:
        """The judging context of a request now: clocks, settings, Leases, the problem sink."""
        leases = self.leases if self.leases is not None and self.leases_synced() else None
        return JudgingContext.of(self.settings, self.clock(), self.monotonic(), leases=leases,
                                 on_problem=self.on_problem)  # fmt: skip

    def inflight_of(self, pod: Any) -> InFlightOf | None:
        """The in-flight placements counting against each node for ``pod`` (itself left out):
        the ledger's (``ledger.on_node``), else ``placements``'."""
        settle_s = self.settings.settle_s
        if settle_s <= 0:
            return None
        uid, now = pod_uid(pod), self.monotonic()  # reservations age on the monotonic clock
        held = self.ledger.on_node if self.ledger is not None else self.placements
        assume_s = self.ledger.assume_s if self.ledger is not None else ASSUME_S

        def of(name: str, state: NodeGpuState | None) -> Sequence[Placement]:
            known = held(name)
            if not known:
                return ()
            return pending(known, state, now=now, settle_s=settle_s, exclude_uid=uid,
                           assume_s=assume_s)  # fmt: skip

        return of

    def asked(self, args: Mapping[str, Any]) -> Asked:
        """The nodes ``args`` asks about: ``NodeNames``, or each of ``Nodes`` parsed as the
        Node cache parses one (``nodeview.view_from_object``)."""
        names = args.get("NodeNames")
        if names is not None:
            return Asked(names)
        prefix, signal = self.settings.prefix, self.settings.signal
        items = ((args.get("Nodes") or {}).get("items")) or []
        states = [(_name(n), view_from_object(n, prefix, signal)) for n in items]
        return Asked([n for n, _ in states], states)

    def _states(self, asked: Asked) -> Sequence[tuple[str, NodeGpuState | None]]:
        if asked.states is not None:
            return asked.states
        return [(n, self.lookup(n)) for n in asked.names]

    def _need(self, args: Mapping[str, Any]) -> Need | None:
        s = self.settings
        return pod_need(args.get("Pod"), s.prefix, s.shared_resource, s.device_plugin_resource)

    def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """ExtenderArgs -> ExtenderFilterResult."""
        need, pod, asked = self._need(args), args.get("Pod"), self.asked(args)
        by_name = asked.states is None
        if need is None:
            passed, failed = list(asked.names), dict[str, ReasonText]()
        elif by_name and not self.synced() and not self.settings.fail_open:
            # no data yet: say so instead of failing every node one by one
            passed, failed = [], dict.fromkeys(asked.names, reason_text(Reason.NOT_SYNCED))
        elif (narrowing := self.narrowing()) is not None and not need.error:
            flagged = self.flagged if self.flagged is not None else _Everything()
            passed, failed = narrowing.filter(pod, need, asked, self.context(), flagged)
        else:
            fits, passed, failed = judge_each(self._states(asked), need, self.context(),
                                              self.inflight_of(pod))  # fmt: skip
            unscored = set(passed)
            passed = [n for n in asked.names if n in fits or n in unscored]
        if need is not None:
            self.decisions.filtered(pod_name(pod), passed, failed)
        result: dict[str, Any] = {"FailedNodes": failed, "Error": ""}
        if hopeless := unresolvable(need, failed, self.lookup):  # read from 1.21; 1.20 ignores it
            result["FailedAndUnresolvableNodes"] = hopeless
        if need is not None and not (need.slices or need.profile):  # preempt's own victims
            now = self.monotonic()
            self.room_sought.record(pod_uid(pod), {} if passed else failed, hopeless, now)
            if self.unasked is not None:
                self.unasked.filtered(pod, self.room_sought.nodes(pod_uid(pod), now), now)
        if by_name:
            return {**result, "NodeNames": passed, "Nodes": None}
        keep = set(passed)
        nodes = args.get("Nodes") or {}
        items = [n for n in nodes.get("items") or [] if _name(n) in keep]
        return {**result, "Nodes": {**{k: v for k, v in nodes.items() if k != "items"},
                                    "items": items}, "NodeNames": None}  # fmt: skip

    def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        """ExtenderArgs -> HostPriorityList (``[{"Host", "Score"}]``, in the order asked)."""
        need, pod, asked = self._need(args), args.get("Pod"), self.asked(args)
        narrowing = self.narrowing()
        if need is None or need.error:
            result = [{"Host": name, "Score": MIN_PRIORITY} for name in asked.names]
            if need is None:
                return result
        elif narrowing is not None:
            flagged = self.flagged if self.flagged is not None else _Everything()
            result = narrowing.prioritize(pod, need, asked, self.context(), flagged)
        else:
            ctx = replace(self.context(), scoring=True)
            free, _, _ = judge_each(self._states(asked), need, ctx, self.inflight_of(pod))
            get = scores(free, self.settings.placement_policy).get
            result = [{"Host": name, "Score": get(name, MIN_PRIORITY)} for name in asked.names]
        self.decisions.prioritized(pod_name(pod), result)
        return result


def _name(node: Any) -> str:
    """A Node document's ``metadata.name`` ("" when it has none, or not as text)."""
    return json_str(json_mapping(json_mapping(node).get("metadata")).get("name")) or ""


def handle_filter(
    args: Mapping[str, Any],
    settings: ExtenderSettings,
    lookup: Lookup | None = None,
    now: float | None = None,
    leases: LeaseOf | None = None,
) -> dict[str, Any]:
    """ExtenderArgs -> ExtenderFilterResult (pure; ``lookup`` resolves ``NodeNames``,
    ``leases`` resolves the Leases named by telemetry: a synced Lease watch)."""
    ext = Extender(settings, lookup or (lambda name: None), leases=leases)
    if now is not None:
        ext.clock = lambda: now
    return ext.filter(args)


def handle_prioritize(
    args: Mapping[str, Any],
    settings: ExtenderSettings,
    lookup: Lookup | None = None,
    now: float | None = None,
    leases: LeaseOf | None = None,
) -> list[dict[str, Any]]:
    """ExtenderArgs -> HostPriorityList (pure; ``lookup`` resolves ``NodeNames``,
    ``leases`` resolves the Leases named by telemetry: a synced Lease watch)."""
    ext = Extender(settings, lookup or (lambda name: None), leases=leases)
    if now is not None:
        ext.clock = lambda: now
    return ext.prioritize(args)

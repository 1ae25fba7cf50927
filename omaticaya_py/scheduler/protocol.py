"""The kube-scheduler extender protocol (``k8s.io/kube-scheduler/extender/v1``): ExtenderArgs in, results out."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from ..core.schema import NodeGpuState, json_mapping, json_str
from .decisions import Decisions
from .inflight import ASSUME_S, Placement, pending
from .ledger import Ledger
from .narrow import ItemsOf, Narrowing, flagged_of
from .preemption import unresolvable
from .rules import InFlightOf, LeaseOf, ProblemOf, filter_nodes, parse_need, prioritize_nodes
from .settings import ExtenderSettings
from .staleness import view_from_object

# ------------------------------------------------------------------- protocol handlers ----


Lookup = Callable[[str], "NodeGpuState | None"]


class MetaPod(TypedDict):
    """A victim by ``UID`` (``extender/v1.MetaPod``)."""

    UID: str


class MetaVictims(TypedDict):
    """A node's victims (``extender/v1.MetaVictims``)."""

    Pods: list[MetaPod]
    NumPDBViolations: int


class ExtenderPreemptionArgs(TypedDict, total=False):
    """What kube-scheduler POSTs to ``preemptVerb``: the preemptor ``Pod`` and its candidates,
    ``NodeNameToMetaVictims`` when ``nodeCacheCapable``, else ``NodeNameToVictims`` (node ->
    ``{"Pods": [v1.Pod], "NumPDBViolations"}``)."""

    Pod: Any
    NodeNameToVictims: dict[str, Any] | None
    NodeNameToMetaVictims: dict[str, MetaVictims] | None


class ExtenderPreemptionResult(TypedDict):
    """The answer: the nodes kept, each with its victims (``scheduler.preempt``)."""

    NodeNameToMetaVictims: dict[str, MetaVictims]


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
    #: the monotonic clock the watches' ``Seen`` times are on (``core.liveness``)
    monotonic: Callable[[], float] = time.monotonic
    #: told of each node's problem at judging time (a time ahead of the clock, judging
    #: raised): ``app.NodeProblems.judged``
    on_problem: ProblemOf | None = None
    #: the reservation ledger (``scheduler.ledger``): with it (and ``settle_s`` > 0) the
    #: filter narrows each pod to one node and reserves its need there (``narrow``)
    ledger: Ledger | None = None
    _narrowing: Any = field(default=None, repr=False)

    def narrowing(self) -> Narrowing | None:
        """The reservation rule over ``ledger``, built for the current settings."""
        if self.ledger is None or self.settings.settle_s <= 0:
            return None
        n = self._narrowing
        if n is None or n.settings is not self.settings or n.index.lookup is not self.lookup:
            n = self._narrowing = Narrowing(self.settings, self.lookup, self.ledger)
        return n

    def _items_of(self, narrowing: Narrowing, args: Mapping[str, Any]) -> ItemsOf:
        names = args.get("NodeNames")
        if names is not None:
            return ItemsOf(narrowing, names)
        return ItemsOf(narrowing, None, self._states(args)[0])

    @staticmethod
    def _pod_name(pod: Any) -> str:
        meta = json_mapping(json_mapping(pod).get("metadata"))
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    def _inflight(self, pod: Any) -> InFlightOf | None:
        """The in-flight placements counting against each node for ``pod`` (itself left out):
        the ledger's (``ledger.on_node``), else ``placements``'."""
        settle_s = self.settings.settle_s
        if settle_s <= 0:
            return None
        uid = json_mapping(json_mapping(pod).get("metadata")).get("uid")
        uid = uid if isinstance(uid, str) else ""
        now = self.clock()
        held = self.ledger.on_node if self.ledger is not None else self.placements
        assume_s = self.ledger.assume_s if self.ledger is not None else ASSUME_S

        def of(name: str, state: NodeGpuState | None) -> Sequence[Placement]:
            known = held(name)
            if not known:
                return ()
            return pending(known, state, now=now, settle_s=settle_s, exclude_uid=uid,
                           assume_s=assume_s)  # fmt: skip

        return of

    def _leases(self) -> LeaseOf | None:
        return self.leases if self.leases is not None and self.leases_synced() else None

    def _states(
        self, args: Mapping[str, Any]
    ) -> tuple[list[tuple[str, NodeGpuState | None]], bool]:
        """[(name, state)] and whether the request used NodeNames (cache mode)."""
        prefix = self.settings.prefix
        if args.get("NodeNames") is not None:
            return [(n, self.lookup(n)) for n in args["NodeNames"]], True
        items = ((args.get("Nodes") or {}).get("items")) or []
        return [
            (_name(node), view_from_object(node, prefix, self.settings.signal)) for node in items
        ], False

    def _clocks(self) -> dict[str, Any]:
        """The judging arguments every verb shares: clocks, windows, Leases, problems."""
        s = self.settings
        return {
            "now": self.clock(), "now_mono": self.monotonic(), "ttl_s": s.ttl_s,
            "grace_s": s.grace_s, "max_skew_s": s.max_clock_skew_s, "prefix": s.prefix,
            "stale_policy": s.stale_policy, "leases": self._leases(),
            "on_problem": self.on_problem,
        }  # fmt: skip

    def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        s = self.settings
        need = parse_need(args.get("Pod"), s.prefix, s.shared_resource, s.device_plugin_resource)
        by_name = args.get("NodeNames") is not None
        if by_name and need is not None and not self.synced() and not s.fail_open:
            # no data yet: say so instead of failing every node one by one
            why = "node(s) not checked: the omaticaya extender's node cache is not synced yet"
            passed, failed = list[str](), dict.fromkeys(args["NodeNames"], why)
        elif (narrowing := self.narrowing()) is not None and need is not None and not need.error:
            passed, failed = narrowing.filter(
                args.get("Pod"), need, self._items_of(narrowing, args), self._clocks(),
                flagged_of(self.on_problem),
            )  # fmt: skip
        else:
            passed, failed = filter_nodes(
                need,
                self._states(args)[0],
                fail_open=s.fail_open,
                unknown_policy=s.unknown_policy,
                inflight=self._inflight(args.get("Pod")),
                **self._clocks(),
            )
        if need is not None:
            self.decisions.filtered(self._pod_name(args.get("Pod")), passed, failed)
        result: dict[str, Any] = {"FailedNodes": failed, "Error": ""}
        if hopeless := unresolvable(need, failed, self.lookup):  # read from 1.21; 1.20 ignores it
            result["FailedAndUnresolvableNodes"] = hopeless
        if by_name:
            result["NodeNames"] = passed
            result["Nodes"] = None
        else:
            keep = set(passed)
            nodes = args.get("Nodes") or {}
            result["Nodes"] = {
                **{k: v for k, v in nodes.items() if k != "items"},
                "items": [n for n in nodes.get("items") or [] if _name(n) in keep],
            }
            result["NodeNames"] = None
        return result

    def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        s = self.settings
        need = parse_need(args.get("Pod"), s.prefix, s.shared_resource, s.device_plugin_resource)
        narrowing = self.narrowing()
        if narrowing is not None and need is not None and not need.error:
            scores = narrowing.prioritize(
                args.get("Pod"), need, self._items_of(narrowing, args), self._clocks(),
                flagged_of(self.on_problem),
            )  # fmt: skip
            self.decisions.prioritized(self._pod_name(args.get("Pod")), scores)
            return scores
        states, _ = self._states(args)
        scores = prioritize_nodes(
            need,
            states,
            strategy=s.strategy,
            inflight=self._inflight(args.get("Pod")),
            **self._clocks(),
        )
        if need is not None:
            self.decisions.prioritized(self._pod_name(args.get("Pod")), scores)
        return scores


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

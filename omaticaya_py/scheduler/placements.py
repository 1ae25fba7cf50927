"""Pods placed through the extender, read from the pod watch: parsing (untrusted) and the index.

``placement_from_pod`` turns one pod document into a ``Placement`` (or ``None``: not placed yet,
no GPU need, deleted, failed or finished); ``PodProblems`` logs a bad pod once and counts it;
``InFlight`` groups the pod cache's placements by node for the filter, rebuilt only when the
cache changed.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from loguru import logger as log

from ..core.schema import NodeGpuState, json_mapping, rfc3339_s
from .inflight import Placement
from .rules import parse_need

#: phases of a pod that holds no GPU memory any more
DONE_PHASES = frozenset({"Failed", "Succeeded"})


def _scheduled_at(status: Mapping[str, Any]) -> float | None:
    conditions = status.get("conditions")
    for c in conditions if isinstance(conditions, list) else ():
        c = json_mapping(c)
        if c.get("type") == "PodScheduled" and c.get("status") == "True":
            return rfc3339_s(c.get("lastTransitionTime"))
    return None


def placement_from_pod(
    pod: Mapping[str, Any],
    previous: Placement | None,
    *,
    prefix: str,
    node_state: Callable[[str], NodeGpuState | None],
    now: float,
) -> Placement | None:
    """The placement a pod document stands for, or ``None``. Raises ``ValueError`` for a pod
    whose fields have the wrong shape (the caller skips it and counts it).

    ``previous`` (the placement stored for this pod before) keeps the first ``placed_at`` and
    ``baseline_free_mib``; a new placement's baseline is the node's free memory now
    (``node_state``), its ``placed_at`` the pod's PodScheduled transition (else ``now``)."""
    if not isinstance(pod, Mapping):
        raise ValueError("pod is not an object")
    meta, spec, status = (json_mapping(pod.get(k)) for k in ("metadata", "spec", "status"))
    node = spec.get("nodeName")
    if node is None or node == "":
        return None
    if not isinstance(node, str) or len(node) > 253:
        raise ValueError("spec.nodeName is not a Node name")
    if meta.get("deletionTimestamp") or status.get("phase") in DONE_PHASES:
        return None
    need = parse_need(pod, prefix)
    if need is None or need.error:
        return None  # never placed through the extender's rules: nothing to account
    uid = meta.get("uid")
    if not isinstance(uid, str):
        raise ValueError("metadata.uid is not a string")
    if previous is not None and previous.uid == uid and previous.node == node:
        placed_at, baseline = previous.placed_at, previous.baseline_free_mib
    else:
        placed_at = _scheduled_at(status) or now
        state = node_state(node)
        baseline = state.free_total_mib if state is not None and state.known else None
    return Placement(
        key=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        uid=uid,
        node=node,
        memory_mib=need.memory_mib,
        count=need.count,
        placed_at=placed_at,
        started_at=rfc3339_s(status.get("startTime")),
        baseline_free_mib=baseline,
    )


class PodProblems:
    """Pods that could not be read: each logged once (by pod and problem) and counted."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._seen: dict[str, str] = {}
        self._lock = threading.Lock()

    def skipped(self, key: str, exc: Exception) -> None:
        problem = f"skipped: {type(exc).__name__}"
        with self._lock:
            self.counts[problem] += 1
            if self._seen.get(key) == problem:
                return
            self._seen[key] = problem
            if len(self._seen) > 10_000:  # bounded: forget the oldest
                self._seen.pop(next(iter(self._seen)))
        log.warning("pod {}: {}: {} (not counted in flight)", key, problem, str(exc)[:200])


#: how long a pod that passed the filter counts against the nodes it passed on, waiting for
#: the pod watch to say where it was bound (the scheduler binds asynchronously, after it has
#: already sent the next pod's filter)
ASSUME_S = 30.0


class InFlight:
    """Placements by node: the pod cache's (``snapshot()`` of ``Placement`` values and a
    ``version`` that grows with every change; the grouping is redone only on a new version),
    plus the *assumed* ones: a pod that passed the filter counts against every node it passed
    on until the watch shows it bound (then only against its node), for at most ``ASSUME_S``.
    This closes the window between the scheduler's decision and the binding showing in the
    watch, in which the next pod of a burst is already being filtered."""

    def __init__(self, cache: Any, assume_s: float = ASSUME_S) -> None:
        self._cache = cache
        self._assume_s = assume_s
        self._version = -1
        self._by_node: dict[str, list[Placement]] = {}
        self._uids: frozenset[str] = frozenset()
        self._assumed: dict[str, tuple[float, Placement, frozenset[str]]] = {}
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        version = self._cache.version
        if version != self._version:
            by_node: dict[str, list[Placement]] = {}
            for p in self._cache.snapshot().values():
                by_node.setdefault(p.node, []).append(p)
            self._by_node, self._version = by_node, version
            self._uids = frozenset(p.uid for ps in by_node.values() for p in ps)

    def assume(
        self, uid: str, key: str, memory_mib: int, count: int, nodes: list[str], now: float
    ) -> None:
        """The pod ``uid`` passed the filter on ``nodes``: count it there until it is bound."""
        if not uid or not nodes:
            return
        with self._lock:
            self._assumed.pop(uid, None)  # re-inserted last: the dict stays in expiry order
            self._assumed[uid] = (
                now + self._assume_s,
                Placement(key, uid, "", memory_mib, count, placed_at=now),
                frozenset(nodes),
            )
            while len(self._assumed) > 100_000:  # bounded
                self._assumed.pop(next(iter(self._assumed)))

    def for_node(self, node: str, now: float | None = None) -> list[Placement]:
        with self._lock:
            self._refresh()
            placed = self._by_node.get(node, [])
            if not self._assumed:
                return placed
            now = time.time() if now is None else now
            for uid in [u for u, (until, _, _) in self._assumed.items()
                        if until <= now or u in self._uids]:  # fmt: skip
                del self._assumed[uid]
            extra = [p for _, p, nodes in self._assumed.values() if node in nodes]
            return placed + extra if extra else placed

    def assumed(self) -> int:
        """Pods that passed the filter and are not yet seen bound."""
        return len(self._assumed)

    def __len__(self) -> int:
        return len(self._cache)

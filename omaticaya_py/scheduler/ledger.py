"""The reservation ledger: each pod's GPU memory held on the one node it was given, indexed by
node and by pod uid (``inflight.Placement`` values).

Who writes it:

- the filter: ``reserve`` when it narrows a pod to its node (a refilter of the same pod, by
  uid, replaces its earlier reservation: ``release`` then ``reserve``);
- the pod watch (``kube.PodCache``'s ``on_change``): ``pod_changed`` with the bound pod's
  placement (``placements.placement_from_pod``) or ``None`` when the pod was deleted, failed
  or finished. Bound on the node it was reserved on: *confirmed* (the reserved GPUs and
  baseline kept, the age counted from the binding); bound elsewhere (another scheduler, a
  direct bind): *moved* there, its GPUs then unknown; bound and never reserved (learned after
  an extender restart): added. An unbound reservation that never shows bound stops counting
  after ``assume_s`` and is dropped from the ledger at the next ``reserve`` after that.

Readers (``nodeindex.NodeIndex``) ask ``on_node(name)`` and ``version(name)``: a per-node number
that grows with every change on that node, so that a node's record is rebuilt only when its
reservations changed; ``changed_since(seq)`` names the nodes changed since a point
(``verdicts.Verdicts``: a request looks only at those). Every operation is O(1) in the number of pods and nodes, except that a
node's own placements are copied on a change there. Thread-safe: the pod watch's thread and the
request handlers share it.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import replace
from itertools import islice

from .inflight import ASSUME_S, Placement, expiry

__all__ = ["Ledger"]

#: at most this many unbound reservations are held (the oldest go first)
MAX_RESERVED = 100_000
#: changes remembered for ``changed_since``
MAX_CHANGES = 4096


class Ledger:
    """Placements by node and by uid. ``settle_s`` and ``assume_s`` as in ``inflight``."""

    def __init__(self, settle_s: float = 60.0, assume_s: float = ASSUME_S) -> None:
        self.settle_s, self.assume_s = settle_s, assume_s
        self._by_uid: dict[str, Placement] = {}
        self._by_node: dict[str, dict[str, Placement]] = {}
        self._versions: dict[str, int] = {}
        #: the nodes changed, in order (``changed_since``): the last ``MAX_CHANGES`` kept
        self._changes: deque[str] = deque(maxlen=MAX_CHANGES)
        self._seq = 0  # changes ever made
        self._reserved: dict[str, float] = {}  # unbound uids, in reservation order -> expiry
        self._lock = threading.Lock()
        #: how many reservations were made, confirmed by the watch, moved to another node,
        #: and dropped as expired without being seen bound
        self.counts = {"reserved": 0, "confirmed": 0, "moved": 0, "expired": 0}

    # -- readers -------------------------------------------------------------------------

    def on_node(self, node: str) -> tuple[Placement, ...]:
        """The placements held on ``node`` (settled ones included: ``inflight.pending``
        decides which still count)."""
        held = self._by_node.get(node)
        return tuple(held.values()) if held else ()

    def version(self, node: str) -> int:
        """A number that changes whenever ``node``'s placements change."""
        return self._versions.get(node, 0)

    def changed_since(self, seq: int) -> tuple[int, list[str] | None]:
        """``(now, the nodes whose placements changed after change number seq)``; ``None``
        instead of the nodes when more than ``MAX_CHANGES`` were made since (the caller then
        compares every version)."""
        with self._lock:
            now, n = self._seq, self._seq - seq
            if n <= 0:
                return now, []
            if seq < 0 or n > len(self._changes):
                return now, None
            return now, list(islice(self._changes, len(self._changes) - n, None))

    def get(self, uid: str) -> Placement | None:
        """The placement of the pod ``uid``, or ``None``."""
        return self._by_uid.get(uid)

    def reserved(self) -> int:
        """Reservations not yet seen bound (expired ones until they are dropped)."""
        return len(self._reserved)

    def __len__(self) -> int:
        """Placements of pods seen bound."""
        return len(self._by_uid) - len(self._reserved)

    # -- writers -------------------------------------------------------------------------

    def _put(self, p: Placement) -> None:
        self._by_node.setdefault(p.node, {})[p.uid] = p
        self._by_uid[p.uid] = p
        self._bump(p.node)

    def _bump(self, node: str) -> None:
        self._versions[node] = self._versions.get(node, 0) + 1
        self._changes.append(node)
        self._seq += 1

    def _drop(self, uid: str) -> Placement | None:
        p = self._by_uid.pop(uid, None)
        self._reserved.pop(uid, None)
        if p is None:
            return None
        held = self._by_node.get(p.node)
        if held is not None:
            held.pop(uid, None)
            if not held:
                del self._by_node[p.node]
        self._bump(p.node)
        return p

    def reserve(self, p: Placement) -> None:
        """Hold ``p`` (``bound`` False, ``placed_at`` now) on its node, replacing the pod's
        earlier reservation. A pod already seen bound is not reserved again."""
        with self._lock:
            before = self._by_uid.get(p.uid)
            if before is not None and before.bound:
                return
            self._drop(p.uid)
            self._put(replace(p, bound=False))
            self._reserved[p.uid] = expiry(p, self.settle_s, self.assume_s)
            self.counts["reserved"] += 1
            self._prune(p.placed_at)

    def release(self, uid: str) -> Placement | None:
        """Drop the pod's unbound reservation (a refilter replaces it); a bound one stays."""
        with self._lock:
            p = self._by_uid.get(uid)
            if p is None or p.bound:
                return None
            return self._drop(uid)

    def _prune(self, now: float) -> None:
        """Drop the unbound reservations past ``assume_s`` (oldest first: amortised O(1))."""
        while self._reserved:
            uid, until = next(iter(self._reserved.items()))
            if until > now and len(self._reserved) <= MAX_RESERVED:
                return
            self._drop(uid)
            self.counts["expired"] += 1

    def pod_changed(self, key: str, old: Placement | None, new: Placement | None) -> None:
        """The pod watch's change of the pod ``key``: its placement before (``old``) and now
        (``new``; ``None``: deleted, failed, finished, or no longer bound)."""
        with self._lock:
            if old is not None and (new is None or old.uid != new.uid):
                held = self._by_uid.get(old.uid)
                if held is not None and held.bound:
                    self._drop(old.uid)
            if new is None:
                return
            held = self._by_uid.get(new.uid)
            if held is not None and held.node == new.node:
                if not held.bound:
                    self.counts["confirmed"] += 1
                baseline = held.baseline_free_mib
                merged = replace(
                    new, gpus=held.gpus or new.gpus,
                    baseline_free_mib=baseline if baseline is not None else new.baseline_free_mib,
                    bound=True,
                )  # fmt: skip
            else:
                if held is not None:
                    self.counts["moved"] += 1
                merged = replace(new, bound=True)
            if held == merged:
                return
            self._drop(new.uid)
            self._put(merged)

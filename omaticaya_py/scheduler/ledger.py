"""The reservation ledger: each pod's GPU memory held on the one node it was given, indexed by
node and by pod uid (``inflight.Placement`` values), as kube-scheduler's cache holds its assumed
pods; and the pod watch's side (``placement_from_pod``, ``PodProblems``).

A pod's life in the ledger (``Ledger.phase``; each arrow a verb, counted in ``Ledger.counts``)::

                 reserve (the filter narrows the pod to this node)
      GONE ───────────────────────────────────────────► RESERVED ──── release ────► GONE
       │  ▲                                      (a refilter replaces it)  │
       │  │ drop: the pod deleted, failed,            │                    │ expire: assume_s
       │  │ finished or unbound                       │ confirm: seen      │ passes, never seen
       │  │                                           │ bound here         │ bound (dropped at
       │  └──────────────────┐                        │ move: seen bound   ▼ the next reserve)
       │ add: seen bound,    │                        │ on another node   EXPIRED
       │ never reserved      │                        ▼
       └───────────────────► BOUND ──── show: the reading shows it ────► SHOWN
                               │        (``inflight.pending``: ``core.allocation.shown``; or its pod
                               │         is a holder in the kubelet's books)
                               └──────── settle_s passes ──────────────► EXPIRED

RESERVED and BOUND count against their node's GPUs (``inflight.adjust``); SHOWN and EXPIRED do
not (the reading has it, or it aged out) but a bound pod stays in the ledger until the pod goes
(``drop``): its memory is part of the drop a later pod's must be told apart from.

Who moves it: the filter (``reserve``, ``release``: a refilter of the same pod, by uid, releases
then reserves); the pod watch (``kube.PodCache``'s ``on_change``): ``pod_changed`` with the
bound pod's placement or ``None`` (``drop``). Bound on the node it was reserved on: *confirm*
(the reserved devices, their baselines and time kept); bound elsewhere (another scheduler, a direct
bind): *move* there, its GPUs then unknown; bound and never reserved (learned after an extender
restart): *add*.

Ages (``placed_at``) are on the extender's own monotonic clock (``records.ages_s``), the one
every ``now`` here is read on, never the API server's nor the wall clock (a step of it ages
nothing): a reservation keeps the time the filter made it; a pod first seen from the
watch, the time the extender first saw it (``placement_from_pod``'s ``now``). No later event or
LIST restarts it (``pod_changed`` keeps the held one), so a pod counts by age for at most
``settle_s`` after the extender first held it, as long as the process lives.

Readers (``cache.NodeIndex``) ask ``on_node(name)`` and ``versions`` (per node, a number that
grows with every change on that node: a node's record is rebuilt only when it changed);
``changed_since(seq)`` names the nodes changed since a point (``cache.Verdicts``). Every
operation is O(1) in the number of pods and nodes, except that a node's own placements are
copied on a change there. Thread-safe: the pod watch's thread and the request handlers share it.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from enum import StrEnum
from itertools import islice
from typing import Any

from loguru import logger as log

from ..core.model.sayonce import SayOnce
from ..core.schema import NodeGpuState, json_mapping, rfc3339_s
from .inflight import ASSUME_S, Placement, expiry, pending
from .need import Need, pod_need

__all__ = ["DONE_PHASES", "Ledger", "Phase", "PodProblems", "placement_from_pod"]


class Phase(StrEnum):
    """Where a pod is in the ledger's life cycle (the module's diagram)."""

    GONE = "gone"
    RESERVED = "reserved"
    BOUND = "bound"
    SHOWN = "shown"
    EXPIRED = "expired"

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
        #: and dropped as expired without being seen bound (the verbs of the diagram)
        self.counts = {"reserved": 0, "confirmed": 0, "moved": 0, "expired": 0}

    # -- readers -------------------------------------------------------------------------

    def on_node(self, node: str) -> tuple[Placement, ...]:
        """The placements held on ``node`` (settled ones included: ``inflight.pending``
        decides which still count)."""
        held = self._by_node.get(node)
        return tuple(held.values()) if held else ()

    @property
    def versions(self) -> Mapping[str, int]:
        """Node -> a number that grows whenever its placements change (absent: 0). Read-only;
        the live mapping, so that a reader's per-name lookups cost one ``get``."""
        return self._versions

    def phase(self, uid: str, state: NodeGpuState | None, now: float) -> Phase:
        """Where the pod ``uid`` is (the module's diagram), judged against its node's reading
        ``state`` at ``now`` (the monotonic clock ages are on)."""
        p = self._by_uid.get(uid)
        if p is None:
            return Phase.GONE
        if now >= expiry(p, self.settle_s, self.assume_s):
            return Phase.EXPIRED
        if not p.bound:
            return Phase.RESERVED
        live = pending(self.on_node(p.node), state, now=now, settle_s=self.settle_s,
                       assume_s=self.assume_s)  # fmt: skip
        return Phase.BOUND if any(q.uid == uid for q in live) else Phase.SHOWN

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
            if held is not None:  # its age started when the extender first held it
                new = replace(new, placed_at=held.placed_at)
            if held is not None and held.node == new.node:
                if not held.bound:
                    self.counts["confirmed"] += 1
                merged = replace(
                    new, gpus=held.gpus or new.gpus, whole_gpus=held.whole_gpus or new.whole_gpus,
                    migs=held.migs or new.migs, baselines=held.baselines or new.baselines,
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


# ---------------------------------------------------------------- the pod watch ----


#: phases of a pod that holds no GPU memory any more
DONE_PHASES = frozenset({"Failed", "Succeeded"})


def placement_from_pod(
    pod: Mapping[str, Any],
    previous: Placement | None,
    *,
    now: float,
    read_need: Callable[[Any], Need | None] = pod_need,
) -> Placement | None:
    """The placement a pod document stands for, or ``None``. Raises ``ValueError`` for a pod
    whose fields have the wrong shape (the caller skips it and counts it).

    ``read_need``: the pod's need (``need.need_reader`` of the settings; default:
    ``need.pod_need`` with the default prefix and resources: every GPU pod, annotated or not). ``previous`` (the placement stored for this pod before) keeps the
    first ``placed_at``; a new placement's ``placed_at`` is ``now``: the extender's monotonic
    clock when it first saw the pod, never a time the API server wrote
    (PodScheduled's ``lastTransitionTime`` is on the server's clock: 90 s behind, it aged a
    pod out the moment it was confirmed)."""
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
    need = read_need(pod)
    if need is None or need.error:
        return None  # never placed through the extender's rules: nothing to account
    uid = meta.get("uid")
    if not isinstance(uid, str):
        raise ValueError("metadata.uid is not a string")
    same = previous is not None and previous.uid == uid and previous.node == node
    placed_at = previous.placed_at if previous is not None and same else now
    return Placement(
        key=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        uid=uid,
        node=node,
        memory_mib=need.memory_mib,
        count=need.count,
        placed_at=placed_at,
        started_at=rfc3339_s(status.get("startTime")),
        slices=need.slices,
        exclusive=need.exclusive,
        profile=need.profile,
        slice_memory=need.slice_memory,
    )


class PodProblems:
    """Pods that could not be read: each logged once (by pod and problem) and counted."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._seen: SayOnce[str, str] = SayOnce(max_keys=10_000)  # bounded: the oldest goes
        self._lock = threading.Lock()

    def skipped(self, key: str, exc: Exception) -> None:
        problem = f"skipped: {type(exc).__name__}"
        with self._lock:
            self.counts[problem] += 1
            if not self._seen.start(key, problem):
                return
        log.warning("pod {}: {}: {} (not counted in flight)", key, problem, str(exc)[:200])

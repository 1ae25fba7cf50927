"""The nodes a pod's filter failed for GPU room alone (``RoomSought``), which ``/preempt`` adds to
kube-scheduler's candidates: its dry run names victims only where its own resource count fits,
so it never offers a node the extender refused for GPU memory (issue 48)."""

from __future__ import annotations

import threading
from collections.abc import Container, Mapping
from itertools import islice

from .fit import Reason, ReasonText

__all__ = ["ROOM_KEEP_S", "ROOM_REASONS", "RoomSought"]

#: filter reasons where evicting pods on the node may make room (the node passed
#: kube-scheduler's in-tree filters, then the extender's for GPU room only)
ROOM_REASONS = frozenset({Reason.NO_ROOM, Reason.IN_FLIGHT})
#: how long a pod's filter's room failures stand for its preemption, seconds (monotonic):
#: kube-scheduler runs PostFilter right after the extenders' filter, in the same cycle and
#: on the same snapshot; a later cycle whose in-tree filters pass no node never calls the
#: filter, so an older record must not outlive the one cycle by much
ROOM_KEEP_S = 5.0


class RoomSought:
    """Per preemptor (pod uid): the nodes its latest filter failed for GPU room alone
    (``ROOM_REASONS``, less the nodes eviction cannot help), which ``scheduler.preempt`` adds
    to kube-scheduler's candidates. Those nodes passed kube-scheduler's in-tree filters in
    that cycle (it sends the extender only those), so its dry run named no victim there and
    never offers them. Holds at most ``max_pods`` pods (the oldest record goes first), each
    with its first ``max_nodes`` such nodes (``/preempt`` reads 32 nodes at most), for
    ``keep_s`` seconds on the caller's monotonic clock. Thread-safe: the filter and
    ``/preempt`` run on different threads. Raises ``ValueError`` for a negative ``keep_s``
    or a bound under 1."""

    def __init__(self, keep_s: float = ROOM_KEEP_S, max_pods: int = 1024,
                 max_nodes: int = 64) -> None:  # fmt: skip
        if keep_s < 0 or max_pods < 1 or max_nodes < 1:
            raise ValueError(f"RoomSought: keep_s {keep_s} must be >= 0, max_pods {max_pods} "
                             f"and max_nodes {max_nodes} >= 1")  # fmt: skip
        self.keep_s, self.max_pods, self.max_nodes = keep_s, max_pods, max_nodes
        self._by_uid: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._lock = threading.Lock()

    def record(self, uid: str, failed: Mapping[str, ReasonText], hopeless: Container[str],
               now_s: float) -> None:  # fmt: skip
        """A filter's answer for pod ``uid``: ``failed`` (name -> reason, the
        ``FailedNodes``), ``hopeless`` (its ``FailedAndUnresolvableNodes``). Empty
        ``failed`` (the pod passed somewhere) forgets the pod; no uid records nothing."""
        if not uid:
            return
        names = tuple(islice((n for n, r in failed.items()
                              if r.code in ROOM_REASONS and n not in hopeless), self.max_nodes))
        with self._lock:
            self._by_uid.pop(uid, None)
            if not names:
                return
            while len(self._by_uid) >= self.max_pods:
                del self._by_uid[next(iter(self._by_uid))]  # the oldest record
            self._by_uid[uid] = (now_s, names)

    def nodes(self, uid: str, now_s: float) -> tuple[str, ...]:
        """The nodes pod ``uid``'s filter failed for room alone, in its order, if that filter
        was at most ``keep_s`` ago (else, or unknown: none)."""
        with self._lock:
            got = self._by_uid.get(uid)
        if got is None or not 0 <= now_s - got[0] <= self.keep_s:
            return ()
        return got[1]

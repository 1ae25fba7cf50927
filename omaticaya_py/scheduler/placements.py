"""Pods placed through the extender, read from the pod watch: parsing (untrusted) and the index.

``placement_from_pod`` turns one pod document into a ``Placement`` (or ``None``: not placed yet,
no GPU need, deleted, failed or finished); ``PodProblems`` logs a bad pod once and counts it.
The pod cache hands each change to ``ledger.Ledger.pod_changed`` (its ``on_change``): the
ledger, not this module, holds the placements by node.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from loguru import logger as log

from ..core.sayonce import SayOnce
from ..core.schema import NodeGpuState, json_mapping, rfc3339_s
from ..core.sharing import DEFAULT_SHARED_RESOURCE
from .inflight import ASSUME_S, Placement
from .need import DEFAULT_GPU_RESOURCE
from .rules import parse_need

__all__ = ["ASSUME_S", "DONE_PHASES", "PodProblems", "placement_from_pod"]

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
    shared_resource: str = DEFAULT_SHARED_RESOURCE,
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
) -> Placement | None:
    """The placement a pod document stands for, or ``None``. Raises ``ValueError`` for a pod
    whose fields have the wrong shape (the caller skips it and counts it).

    ``previous`` (the placement stored for this pod before) keeps the first ``placed_at`` and
    ``baseline_free_mib``; a new placement's baseline is the node's free memory now
    (``node_state``; of its shared GPUs for a pod of slices of ``shared_resource``), its
    ``placed_at`` the pod's PodScheduled transition (else ``now``)."""
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
    need = parse_need(pod, prefix, shared_resource, gpu_resource)
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
        baseline = None
        if state is not None and state.known:
            baseline = state.shared_free_total_mib if need.slices else state.live_free_total_mib
    return Placement(
        key=f"{meta.get('namespace', '')}/{meta.get('name', '')}",
        uid=uid,
        node=node,
        memory_mib=need.memory_mib,
        count=need.count,
        placed_at=placed_at,
        started_at=rfc3339_s(status.get("startTime")),
        baseline_free_mib=baseline,
        slices=need.slices,
        exclusive=need.exclusive,
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

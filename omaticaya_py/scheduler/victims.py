"""Pure preemption rules: which lower-priority pods on a node must go for a GPU pod to fit.

kube-scheduler (1.20) finds preemption candidates with its in-tree filters only. A pod that
asks for GPU memory by annotation requests nothing those filters see, so its dry run reprieves
every lower-priority pod and hands the extender each candidate node with *no* victims (or with
the few its own resources need). Evicting nothing frees no GPU memory; evicting by the in-tree
rules can evict pods whose GPUs are not the ones that would make room. The extender's
``preemptVerb`` therefore chooses the GPU victims itself, per node (``choose_victims``):

- the pool: the node's pods of lower priority than the preemptor (``PodOnNode``), not already
  terminating or finished, that hold a whole GPU (the kubelet's books: ``GpuRoom.holders``) or
  a reservation in the extender's ledger (a pod placed and not yet in the telemetry);
- the node as it would be once a set of pods is evicted (``node_after``): a GPU that a pod
  which stays holds is still taken, whatever its memory shows (the filter's rule:
  ``GpuInfo.assigned``); a GPU whose every holder goes is free, with its live free memory plus
  the memory the telemetry attributes to them there (a holder whose memory is unknown adds
  nothing: never more than the truth); a holder the telemetry names that is no longer bound
  to the node (an earlier victim, deleted before the agent's next reading) counts as gone, so
  a node whose room is on its way is left out (fits already), never charged a second victim;
  the evicted pods' reservations stop counting, the
  others' are taken off as the filter takes them (``inflight.adjust``: an exclusive one takes
  its GPU whole);
- the pod fits there by the filter's own rule (``fit.room_on``: ``need.count`` healthy GPUs
  each with ``need.memory_mib`` free), never a copy of it. The node is kept only if evicting
  the whole pool lets the pod fit;
- then the fewest pods of the pool whose eviction lets it fit (issue 48: a node's GPU pods are
  few, so every set is tried, smallest first, while the pool has at most ``EXACT_POOL`` pods);
  among sets of one size, the one whose most important pod matters least, then the lowest
  priority sum, then the younger pods. So one priority-500 pod goes rather than two of
  priority 100: fewer workloads restarted. A larger pool is trimmed as kube-scheduler trims
  its own: from the most important pod (highest priority, then the earlier in the node's order)
  down, a pod is spared when the rest still make it fit. Either way every pod left is needed;
  pods whose GPUs the preemptor cannot use are never victims.
- the victims kube-scheduler named stay victims: its in-tree filters need them gone (CPU,
  memory, ports), which the extender cannot judge; their GPUs and memory count as freed.

Nodes kube-scheduler does not offer (``room_sought.RoomSought``): its dry run names victims only where its
in-tree filters fail, so a node where its own count fits (``nvidia.com/gpu`` free, the memory
not) is never a candidate (1.22+: "expected at least one victim pod on node"). The nodes this
pod's filter failed for room alone were exactly those its in-tree filters passed in this
cycle (kube-scheduler sends the extender only those); ``scheduler.preempt`` adds them to the
candidates, with no victim named, and ``choose_victims`` chooses theirs as above (the protocol
lets the extender answer any node of kube-scheduler's snapshot, with any pod on it).

The time a ``/preempt`` call may take (``deadline.Deadline``): kube-scheduler waits its ``httpTimeout``
for the answer and fails that preemption without it. The call gets ``preempt_budget_s`` of it
(the timeout less a margin for the way in and out); reading a node takes ``READS_PER_NODE``
requests of at most ``Deadline.read_s`` each, each cut to the time left, and a node is started
only while that worst case still fits, so the reads never run past the budget.

Nothing here reads the cluster: ``scheduler.preempt`` gathers each node's view and applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations, compress
from typing import Any

from ..core.schema import GpuInfo, NodeGpuState, json_int, json_mapping, json_str, rfc3339_s
from .fit import Reason, ReasonText, room_on
from .inflight import Placement
from .need import Need

__all__ = [
    "EXACT_POOL",
    "UNRESOLVABLE",
    "Choice",
    "GpuRoom",
    "PodOnNode",
    "Preemptor",
    "choose_victims",
    "node_after",
    "pod_on_node",
    "unresolvable",
]

#: the largest pool whose every subset ``choose_victims`` may try for the fewest victims (2^10
#: fit checks at most, a few ms); a larger pool is trimmed as kube-scheduler trims its own
EXACT_POOL = 10

#: filter reasons that evicting pods cannot change
UNRESOLVABLE = frozenset(
    {Reason.STALE, Reason.UNHEALTHY, Reason.NO_TELEMETRY, Reason.UNUSABLE_TELEMETRY,
     Reason.NOT_IN_CACHE, Reason.BAD_POD, Reason.JUDGING_FAILED}
)  # fmt: skip



@dataclass(frozen=True, slots=True)
class PodOnNode:
    """A pod bound to the node: ``uid``, ``key`` (``namespace/name``, as the telemetry names
    its holders), ``priority`` (``spec.priority``; 0 when absent, as kube-scheduler reads it)
    and ``going`` (terminating or finished: it frees its memory by itself, never a victim)."""

    uid: str
    key: str
    priority: int = 0
    going: bool = False


@dataclass(frozen=True, slots=True)
class GpuRoom:
    """One whole GPU as preemption sees it: ``free_mib`` (its free memory as the filter reads
    it, before reservations; for a GPU with holders, by the live reading: what evicting them
    starts from), ``healthy``, ``total_mib`` (``None``: not published) and ``holders``:
    ``(namespace/name, MiB or None)`` for each container the telemetry says the kubelet gave
    it (MiB: its processes' memory, ``None`` when the agent could not tell; the name ``""``: a
    holder the telemetry does not name, never evicted). A GPU with a holder is assigned, as
    ``parse_node`` reads it: no room for another pod while one of them stays."""

    index: int
    free_mib: int
    healthy: bool
    total_mib: int | None = None
    holders: tuple[tuple[str, int | None], ...] = ()


@dataclass(frozen=True, slots=True)
class Choice:
    """A node's outcome: ``victims`` (pod uids, kube-scheduler's first, then the GPU victims in
    the node's order), or ``None`` with ``reason`` when preemption cannot make the pod fit."""

    victims: tuple[str, ...] | None
    reason: str = ""


def pod_on_node(doc: Any) -> PodOnNode:
    """A ``PodOnNode`` from a v1.Pod document (the API's LIST, or ``NodeNameToVictims``).
    Raises ``ValueError`` when it has no uid, namespace or name as text, or a priority that is
    not a whole number: untrusted input, the caller skips it and counts it."""
    if not isinstance(doc, Mapping):
        raise ValueError("pod is not an object")
    meta, spec, status = (json_mapping(doc.get(k)) for k in ("metadata", "spec", "status"))
    uid, ns, name = (json_str(meta.get(k)) for k in ("uid", "namespace", "name"))
    if not uid or not ns or not name:
        raise ValueError("pod without metadata.uid, namespace and name")
    raw = spec.get("priority")
    priority = 0 if raw is None else json_int(raw)
    if priority is None or isinstance(raw, bool):
        raise ValueError("spec.priority is not a whole number")
    going = bool(meta.get("deletionTimestamp")) or status.get("phase") in ("Failed", "Succeeded")
    return PodOnNode(uid, f"{ns}/{name}", priority, going)


def pod_started_s(doc: Any) -> float | None:
    """``status.startTime`` of a pod document in epoch seconds (``None``: absent or bad)."""
    return rfc3339_s(json_mapping(json_mapping(doc).get("status")).get("startTime"))


def node_after(gpus: Sequence[GpuRoom], gone: Container[str] = ()) -> NodeGpuState:
    """The node's whole GPUs as the filter would read them once the pods ``gone``
    (``namespace/name``) are evicted: a GPU that a holder which stays holds is taken
    (``assigned``, ``free_mib`` 0, as ``parse_node`` reads it), whatever its memory shows; a
    GPU whose every holder goes is free, with its free memory plus what the telemetry
    attributes to them there (a holder whose memory is unknown adds nothing)."""
    out = []
    for g in gpus:
        if any(key not in gone for key, _ in g.holders):
            out.append(GpuInfo(g.index, 0, g.healthy, total_mib=g.total_mib, assigned=True,
                               assigned_free_mib=g.free_mib))  # fmt: skip
        else:
            freed = sum(max(mib or 0, 0) for _, mib in g.holders)
            out.append(GpuInfo(g.index, g.free_mib + freed, g.healthy, total_mib=g.total_mib))
    return NodeGpuState(name="", known=True, gpus=tuple(out),
                        free_total_mib=sum(g.free_mib for g in out if g.healthy))  # fmt: skip


def _fits(need: Need, gpus: Sequence[GpuRoom], reserved: Sequence[Placement],
          gone: frozenset[str], keys: Mapping[str, str], absent: frozenset[str]) -> bool:  # fmt: skip
    """Whether ``need`` fits by the filter's rule (``fit.room_on``) on the node once the pods
    ``gone`` (uids; ``keys``: namespace/name -> uid) are evicted: their GPUs given back
    (``node_after``, with those of the holders ``absent``, already gone from the node), their
    reservations no longer counting, the others' still taken off."""
    state = node_after(gpus, {key for key, uid in keys.items() if uid in gone} | absent)
    return room_on(state, [p for p in reserved if p.uid not in gone], need).ok


@dataclass(frozen=True, slots=True)
class Preemptor:
    """The pod preemption is for: its ``need``, its ``priority`` (``spec.priority``) and its
    ``uid`` (its own reservations never count against it)."""

    need: Need
    priority: int
    uid: str = ""


def choose_victims(
    preemptor: Preemptor,
    gpus: Sequence[GpuRoom],
    pods: Iterable[PodOnNode],
    *,
    reserved: Sequence[Placement] = (),
    named: Sequence[str] = (),
) -> Choice:
    """The victims on one node for ``preemptor`` (module docstring).

    ``gpus``: the node's whole GPUs; ``pods``: the pods bound to it, in the node's order (their
    start, oldest first, as kube-scheduler orders pods of one priority); ``reserved``: the
    ledger's placements still counting on it (``inflight.pending``; the preemptor's own never
    count, nor slices: they are on shared GPUs); ``named``: the uids kube-scheduler named as
    victims (each must be one of ``pods`` with a lower priority, else the node is dropped: it
    cannot be checked)."""
    need, priority, preemptor_uid = preemptor.need, preemptor.priority, preemptor.uid
    reserved = [p for p in reserved if p.uid != preemptor_uid and not p.slices]
    pods = list(pods)
    by_uid = {p.uid: p for p in pods}
    keys = {p.key: p.uid for p in pods}
    forced: list[str] = []
    for uid in dict.fromkeys(named):
        p = by_uid.get(uid)
        if p is None or p.priority >= priority:
            return Choice(None, f"victim {uid} named by the scheduler is not a lower-priority pod "
                          "on the node")  # fmt: skip
        forced.append(uid)
    big = [g for g in gpus if g.healthy and (g.total_mib is None or g.total_mib >= need.memory_mib)]
    if len(big) < need.count:
        return Choice(None, f"fewer than {need.count} healthy GPU(s) of {need.memory_mib} MiB")
    # holders the telemetry names that are no longer bound to the node (a victim deleted
    # before the agent's next reading): their GPUs are being freed, never a reason to evict
    # another pod
    absent = frozenset(k for g in gpus for k, _ in g.holders if k and k not in keys)
    if _fits(need, gpus, reserved, frozenset(forced), keys, absent):
        return Choice(tuple(forced))
    # a pod that holds a whole GPU or a reservation: the only ones whose eviction can help
    holds = {p.uid for p in reserved} | {keys[k] for g in gpus for k, _ in g.holders if k in keys}
    pool = [
        p for p in pods
        if p.priority < priority and not p.going and p.uid in holds and p.uid not in forced
        and p.uid != preemptor_uid
    ]  # fmt: skip
    gone = set(forced) | {p.uid for p in pool}
    if not _fits(need, gpus, reserved, frozenset(gone), keys, absent):
        return Choice(None, "evicting every lower-priority pod frees too little GPU memory")
    fewest = _fewest(pool, lambda uids: _fits(need, gpus, reserved, frozenset(forced) | uids,
                                               keys, absent))  # fmt: skip
    if fewest is not None:
        return Choice((*forced, *(p.uid for p in pool if p.uid in fewest)))
    order = {p.uid: i for i, p in enumerate(pool)}
    for p in sorted(pool, key=lambda p: (-p.priority, order[p.uid])):
        if _fits(need, gpus, reserved, frozenset(gone - {p.uid}), keys, absent):
            gone.discard(p.uid)  # spared: the rest still make room
    return Choice((*forced, *(p.uid for p in pool if p.uid in gone)))


def _fewest(pool: Sequence[PodOnNode], fits: Callable[[frozenset[str]], bool]) -> frozenset[str] | None:
    """The smallest set of ``pool``'s uids whose eviction ``fits`` (module docstring: the fewest
    victims), searched by size; among sets of one size the one whose most important pod matters
    least (lowest highest priority), then the lowest priority sum, then the later pods in the
    node's order (the younger go first, as kube-scheduler spares the older). ``None`` when the
    pool is larger than ``EXACT_POOL`` (the search would cost 2^n fit checks: the caller trims
    instead) or when no set fits (the caller has checked the whole pool does)."""
    if len(pool) > EXACT_POOL:
        return None
    n = len(pool)
    for size in range(1, n + 1):
        fitting = [c for c in combinations(range(n), size)
                   if fits(frozenset(pool[i].uid for i in c))]  # fmt: skip
        if fitting:
            best = min(fitting, key=lambda c: (max(pool[i].priority for i in c),
                                               sum(pool[i].priority for i in c),
                                               [-i for i in reversed(c)]))  # fmt: skip
            return frozenset(pool[i].uid for i in best)
    return None


def _smaller(gpu: GpuInfo, mib: int) -> bool:
    """Whether a GPU's published total memory is below ``mib`` (``False`` when unknown)."""
    return gpu.total_mib is not None and gpu.total_mib < mib


def unresolvable(
    need: Need | None, failed: Mapping[str, ReasonText],
    lookup: Callable[[str], NodeGpuState | None],
) -> dict[str, str]:
    """The failed nodes (``failed``: name -> reason) that evicting pods cannot help, for
    ``FailedAndUnresolvableNodes``: a reason of an ``UNRESOLVABLE`` code (stale, unhealthy, no
    or unusable telemetry, not in the cache, a bad pod annotation, judging raised), or
    ``NO_ROOM`` on a node with no healthy shared GPU (slices) or with fewer than ``need.count``
    healthy GPUs of ``need.memory_mib`` or more (``lookup``: name -> state; a GPU whose total is
    not published counts as big enough)."""
    if need is None or not failed:
        return {}
    # few distinct reasons among thousands of nodes: pick the ones to look at, then the names
    # that carry them, in C (``compress``: no Python code per node that another node beat)
    looked = {r for r in set(failed.values()) if r.code in UNRESOLVABLE or r.code == Reason.NO_ROOM}
    if not looked:
        return {}
    out: dict[str, str] = {}
    for name in compress(failed.keys(), map(looked.__contains__, failed.values())):
        reason = failed[name]
        if reason.code in UNRESOLVABLE or not _could_fit(need, lookup(name)):
            out[name] = reason
    return out


def _could_fit(need: Need, state: NodeGpuState | None) -> bool:
    """Whether ``state``'s node has GPUs the need could fit on once pods are evicted: a
    healthy shared GPU (slices), or ``need.count`` healthy GPUs not smaller than
    ``need.memory_mib`` (``None``: unknown, it could)."""
    if need.slices:
        return state is not None and any(g.healthy for g in state.shared)
    if state is None:
        return True
    if need.profile is not None:  # MIG devices of its profile, never a whole GPU
        return sum(1 for m in state.mig if m.profile == need.profile and m.healthy
                   and not _smaller(m, need.memory_mib)) >= need.count  # fmt: skip
    return sum(1 for g in state.gpus if g.healthy and not _smaller(g, need.memory_mib)) >= need.count

"""Pure in-flight rules: pods given GPU memory on a node that the node's telemetry does not show yet.

Live labels lag reality by up to one agent interval: ten pods bound in the same second all see
the same free memory. The extender keeps each pod's GPU memory as a ``Placement`` on the one
node (and the GPUs) it was given (``scheduler.ledger``) and subtracts the pending ones from the
node's GPUs before it filters and scores (``adjust``), as kube-scheduler's cache assumes a pod
on its node for CPU and memory.

A placement is *reserved* (``bound`` False) from the moment the filter narrows the pod to its
node, and *bound* once the pod watch shows it bound there. It stops counting (``pending``
leaves it out) when

- a reserved placement is ``assume_s`` seconds old (``placed_at``: when it was reserved) and
  was never seen bound (the pod was deleted unbound, or its binding failed and it was never
  filtered again), or a bound one ``settle_s`` seconds old (``placed_at``: when it was
  reserved, or when the extender first saw it bound; on the extender's clock, never the API
  server's: ``ledger``), or
- the node's telemetry was read after the pod started (``started_at``: the pod's
  ``status.startTime``) and the node's free memory, against what it was when the extender
  first counted the placement (``baseline_free_mib``), dropped by at least this placement's
  need plus that of every earlier placement on the node that started before the reading too (the
  rule is conservative: a placement whose memory cannot be told apart waits for ``settle_s``).

- the node's telemetry, read after the pod started, names the pod among the holders of its
  GPUs (``NodeGpuState.holders``, the kubelet's PodResources): the kubelet's books now count it
  (an assigned whole GPU has no room, a slice's units are held), whatever its memory shows.

A deleted, failed or finished pod is never a placement (the pod watch drops it).

``adjust`` takes each pending placement's memory from the GPUs it was given (``gpus``, chosen
by the filter as the device plugin would: ``fit.choose_gpus``), and a placement whose GPUs are not
known (learned from the pod watch: bound by another path, or after a restart) from its
``count`` healthy GPUs with the most free memory left, clamped at zero. A placement of whole
devices (``exclusive``: the pod asks for the device plugin's GPU resource, so the kubelet
hands it whole GPUs) takes all of each GPU it is given: no other pod can get them. A placement of slices
(``slices``: units per container, as ``need.held_slices`` groups them) is taken from the node's shared GPUs the same way, each slice
from one GPU (``fit.place_slices`` chose them), and is shown by the shared GPUs' free memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import compress

from ..core.schema import NodeGpuState
from ..core.sharing import gpu_room_mib
from ..core.shown import Grant, still_counting

__all__ = ["ASSUME_S", "Placement", "adjust", "expiry", "pending"]

#: how long a reservation made at filter time counts while the pod is not seen bound: the
#: window Filter -> Bind (a pod held in Permit included: this must exceed the Permit wait)
ASSUME_S = 30.0


@dataclass(frozen=True, slots=True)
class Placement:
    """One pod's GPU memory on ``node``: ``count`` GPUs with ``memory_mib`` each, on the GPUs
    ``gpus`` (indices; empty: not known, taken from the freest). ``bound``: seen bound by the
    pod watch (False: reserved by the filter). Times are epoch seconds."""

    key: str  # namespace/name
    uid: str
    node: str
    memory_mib: int
    count: int = 1
    placed_at: float = 0.0
    started_at: float | None = None
    baseline_free_mib: int | None = None
    gpus: tuple[int, ...] = ()
    bound: bool = True
    #: a pod's slices of shared GPUs, units per container (``need.held_slices``: a sidecar's
    #: included, a plain init container's shared with the containers reusing it), in the
    #: kubelet's order, init containers first (``gpus`` then the shared GPU of each, in the
    #: same order); empty: whole GPUs
    slices: tuple[int, ...] = ()
    #: the pod asks for whole devices of the GPU resource (``Need.exclusive``): each GPU it is
    #: given is taken whole
    exclusive: bool = False
    #: a pod of slices, as ``pending`` returns it: whether it still counts against its GPUs'
    #: live free memory (not shown by a drop yet) and against their units (not a holder yet)
    in_memory: bool = True
    in_units: bool = True

    @property
    def total_mib(self) -> int:
        return self.memory_mib * self.count

    def mib_at(self, unit_mib: int | None) -> int:
        """The memory it holds at ``unit_mib`` MiB per unit (slices), or ``total_mib``."""
        return sum(self.slices) * (unit_mib or 0) if self.slices else self.total_mib


def expiry(p: Placement, settle_s: float, assume_s: float = ASSUME_S) -> float:
    """When ``p`` stops counting by age (epoch seconds)."""
    return p.placed_at + (settle_s if p.bound else assume_s)


def pending(
    placements: Iterable[Placement],
    state: NodeGpuState | None,
    *,
    now: float,
    settle_s: float,
    exclude_uid: str = "",
    assume_s: float = ASSUME_S,
) -> list[Placement]:
    """The placements that still count against ``state``'s node (oldest first)."""
    live = sorted(
        (p for p in placements
         if p.uid != exclude_uid and now < expiry(p, settle_s, assume_s)),  # fmt: skip
        key=lambda p: (p.started_at if p.started_at is not None else float("inf"), p.placed_at),
    )
    if state is None or state.read_at is None:
        return live
    whole = [p for p in live if not p.slices]
    sliced = [p for p in live if p.slices]
    holders = state.holders
    out = _not_shown(whole, state.read_at, state.live_free_total_mib, None, holders)
    if sliced:  # two books, as the device plugin keeps them
        # the live memory of the shared GPUs: a drop shows a slice (the plugin's still_pending)
        in_memory = set(map(id, _not_shown(sliced, state.read_at, state.shared_free_total_mib,
                                           state.share_unit_mib)))  # fmt: skip
        by_id: dict[int, Placement] = {}
        for p in sliced:
            memory = id(p) in in_memory
            if not state.units_attributed:  # no holders published: the memory book decides
                if memory:
                    by_id[id(p)] = p
                continue
            units = not _held(p, state)  # the kubelet's books: shown once it is a holder
            if memory and units == p.in_units:
                by_id[id(p)] = p
            elif memory or units:
                by_id[id(p)] = replace(p, in_memory=memory, in_units=units,
                                       gpus=p.gpus if units else _held_on(p, state))  # fmt: skip
        out = [by_id[id(p)] if p.slices else p for p in live
               if (p.slices and id(p) in by_id) or (not p.slices and p in out)]  # fmt: skip
    return out


def _held(p: Placement, state: NodeGpuState) -> bool:
    """``p``'s pod is a holder in ``state``'s telemetry, read after the pod started."""
    return (p.key in state.holders and p.started_at is not None and state.read_at is not None
            and state.read_at > p.started_at)  # fmt: skip


def _held_on(p: Placement, state: NodeGpuState) -> tuple[int, ...]:
    """The shared GPUs ``p``'s slices are on by the telemetry (the device plugin's choice),
    in ``p.slices``' order (each slice matched to a held one of its size); ``p.gpus`` when the
    holders do not account for every slice. The ledger follows the plugin: what still counts in
    the memory book counts where the kubelet put it."""
    held = [(n, i) for k, i, n in state.slices_held if k == p.key]
    out: list[int] = []
    for units in p.slices:
        match = next((h for h in held if h[0] == units), None)
        if match is None:
            return p.gpus
        held.remove(match)
        out.append(match[1])
    return tuple(out)


def _not_shown(live: list[Placement], read_at: float, free_now: int, unit_mib: int | None,
               holders: frozenset[str] = frozenset()) -> list[Placement]:  # fmt: skip
    """The placements of ``live`` (oldest first) a reading at ``read_at`` with ``free_now``
    free does not show yet: ``core.shown.still_counting``, the device plugin's rule too. A
    pod among ``holders`` (``"<namespace>/<name>"``) in a reading after it started is shown."""
    grants = [
        Grant(p.mib_at(unit_mib), p.baseline_free_mib,
              read_after=(after := p.started_at is not None and read_at > p.started_at),
              held=after and p.key in holders)
        for p in live
    ]  # fmt: skip
    return list(compress(live, still_counting(grants, free_now)))


def adjust(state: NodeGpuState, placements: Sequence[Placement]) -> NodeGpuState:
    """``state`` with each placement's need taken from its GPUs (its own ``gpus`` when known
    and still healthy on the node, else the healthy ones with the most free left)."""
    if not placements:
        return state
    sliced = [p for p in placements if p.slices]
    if sliced:
        state = _adjust_shared(state, sliced)
        placements = [p for p in placements if not p.slices]
        if not placements:
            return state
    if not state.gpus:
        return state
    free = {g.index: g.free_mib for g in state.gpus}
    healthy = [g.index for g in state.gpus if g.healthy]
    good = set(healthy)
    for p in sorted(placements, key=lambda p: not p.gpus):  # known GPUs first
        mine = [i for i in p.gpus if i in good][: p.count]
        if len(mine) < p.count:
            rest = sorted((i for i in healthy if i not in mine), key=lambda i: -free[i])
            mine += rest[: p.count - len(mine)]
        for index in mine:
            free[index] = 0 if p.exclusive else max(0, free[index] - p.memory_mib)
    gpus = tuple(
        g if free[g.index] == g.free_mib else replace(g, free_mib=free[g.index]) for g in state.gpus
    )
    return replace(state, gpus=gpus, free_total_mib=sum(g.free_mib for g in gpus if g.healthy))


def _adjust_shared(state: NodeGpuState, placements: Sequence[Placement]) -> NodeGpuState:
    """``state`` with each slice taken from its shared GPU (its own when known and healthy,
    else the healthy shared GPU with the most room left), in each book it still counts in
    (``Placement.in_memory``, ``in_units``), clamped at zero."""
    unit = state.share_unit_mib
    if not state.shared or not unit:
        return state
    free = {g.index: g.free_mib for g in state.shared}
    left = {g.index: g.units_left for g in state.shared}
    room = {g.index: g.room_mib(unit) for g in state.shared}
    good = {g.index for g in state.shared if g.healthy}
    for p in sorted(placements, key=lambda p: not p.gpus):  # known GPUs first
        for k, units in enumerate(p.slices):
            index = p.gpus[k] if k < len(p.gpus) and p.gpus[k] in good else None
            if index is None:
                if not good:
                    break
                index = max(good, key=lambda i: (room[i], -i))
            if p.in_memory:
                free[index] = max(0, free[index] - units * unit)
            n = left[index]
            if p.in_units and n is not None:
                n = left[index] = max(0, n - units)
            room[index] = free[index] if n is None else gpu_room_mib(free[index], n, unit)
    shared = tuple(
        g if (free[g.index], left[g.index]) == (g.free_mib, g.units_left)
        else replace(g, free_mib=free[g.index], units_left=left[g.index]) for g in state.shared
    )  # fmt: skip
    return replace(state, shared=shared)

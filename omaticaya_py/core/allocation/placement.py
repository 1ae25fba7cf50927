"""Which devices a pod takes, and what is left on each GPU: the one placement model (pure).

The scheduler extender predicts where the kubelet will put a pod's devices, and the device
plugin decides it; a pod bound by the first must be admitted by the second with the GPU memory
it was placed for. So both ask this module, and nothing else, "which device":

- **A slice** (units of the shared resource, all on one shared GPU) goes to the healthy shared
  GPU whose room (``GpuInfo.room_mib``: the least of its live free memory, less what still
  counts there, and its units no container holds) takes it: under ``binpack`` the one with the
  least room, under ``spread`` the most, the lower NVML index on a tie (``pick_slice``). The
  device plugin's ``GetPreferredAllocation`` and ``Allocate`` check call it with the kubelet's
  available units; the extender with the units the telemetry says are left.
- **A whole device** (the device plugin's GPU resource, or a MIG device of one profile) is one
  of those no container holds, healthy, most live free memory first, the lower index (then MIG
  index) on a tie; for several whole GPUs on a node whose wiring is known
  (``core.model.topology``), the best connected set among the equally roomy
  (``first_whole``: memory first, then links). The device plugin does not know a pod's memory
  need (the device plugin API gives it none), so a pod fits only when the devices so chosen each
  have its need free (``pick_whole``).
- **Memory without a device** (a pod that asks only by the ``gpu-memory-mib`` annotation) takes
  that much on each of ``count`` healthy GPUs with it free: ``binpack`` the least free,
  ``spread`` the most (``pick_memory``).

A pod's whole need (``Need``) is placed container group by container group in the kubelet's
order (``place``): its whole devices, then each of its slices as ``container_asks.held_slices`` groups
them (init containers first, a sidecar's held for the pod's life, a plain init container's
reused by the containers after it), each slice taken off its GPU before the next is placed.
What is left (``take``) is what the in-flight book, preemption and the next pod judge by.

One policy (``POLICIES``), set once in the chart (``placement.policy``), is read by both
sides. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from ..model.sharing import DEFAULT_SHARED_RESOURCE, device_order
from ..model.topology import NodeTopology
from ..schema import GpuInfo, NodeGpuState
from .connected import MAX_LINK_SETS, MEMORY_GRAIN_MIB, connected_set
from .policy import DEFAULT_POLICY, POLICIES, PlacementPolicy, policy_sign

__all__ = [
    "DEFAULT_POLICY",
    "MAX_LINK_SETS",
    "MEMORY_GRAIN_MIB",
    "POLICIES",
    "Need",
    "PlacementPolicy",
    "Placed",
    "Taken",
    "choose_gpus",
    "first_whole",
    "fits_slice",
    "need_devices",
    "pick_memory",
    "pick_slice",
    "pick_whole",
    "place",
    "place_slices",
    "policy_sign",
    "slice_key",
    "slice_room",
    "take",
    "take_memory",
    "take_slice",
    "take_whole",
    "whole_key",
]



@dataclass(frozen=True, slots=True)
class Need:
    """What a pod asks for, as placement judges it.

    - The whole part: ``count`` devices each with ``memory_mib`` free: whole GPUs of the
      device plugin's resource (``exclusive``: the kubelet hands them out, no other pod gets
      them), MIG devices of ``profile`` (``exclusive`` too), or, for a pod that asks only by
      annotation, ``memory_mib`` on each of ``count`` GPUs (no device handed out). A pod of
      slices alone has no whole part (``whole_count`` 0).
    - ``slices``: units of the shared resource ``resource``, one per group of containers that
      hold them on one shared GPU (``scheduler.container_asks.held_slices``), in the kubelet's order.

    ``error`` is set when the pod's request is malformed (every node then fails with it)."""

    memory_mib: int
    count: int = 1
    error: str | None = None
    slices: tuple[int, ...] = ()
    #: the shared resource the slices are of (for messages)
    resource: str = DEFAULT_SHARED_RESOURCE
    #: the whole devices are the device plugin's (``nvidia.com/gpu`` or a MIG resource):
    #: each one given is taken whole
    exclusive: bool = False
    #: the MIG profile (``1g.10gb``) of the whole devices; ``None``: whole GPUs
    profile: str | None = None
    #: units of each slice's first container, the one the device plugin places it by (a plain
    #: init container whose units the later containers reuse); empty: each slice's own size
    firsts: tuple[int, ...] = ()
    #: units of each slice whose memory counts once the pod is admitted (a plain init
    #: container's slice, reused, is over: ``container_asks.held_groups``); empty: each slice's own size
    slice_memory: tuple[int, ...] = ()

    @property
    def whole_count(self) -> int:
        """The whole devices (or GPUs with ``memory_mib`` each) the pod takes: ``count``,
        or 0 for a pod of slices that asks for no device of the GPU resource."""
        return self.count if (not self.slices or self.exclusive) else 0

    def memory_mibs(self, unit_mib: int) -> tuple[int, ...]:
        """Each slice's memory in MiB once the pod is admitted (``slice_memory``), in
        ``slices``' order."""
        return tuple(u * unit_mib for u in (self.slice_memory or self.slices))

    def slice_mibs(self, unit_mib: int) -> tuple[int, ...]:
        """Each slice in MiB at ``unit_mib`` MiB per unit, in ``slices``' order: the order the
        kubelet asks the device plugin for them, init containers first."""
        return tuple(u * unit_mib for u in self.slices)


@dataclass(frozen=True, slots=True)
class Taken:
    """Where a pod's need goes on one node: ``gpus``, the whole GPUs (NVML indices) of its
    whole part, or ``migs``, its MIG devices as ``(GPU index, MIG index)``; ``slices``, the
    shared GPU index of each slice, in ``Need.slices``' order; ``room_mib``, what a node is
    scored by (slices: the room of the GPU the largest slice goes to, before it; whole: the
    free MiB of the healthy whole GPUs, or of the free MIG devices of the profile)."""

    gpus: tuple[int, ...] = ()
    migs: tuple[tuple[int, int], ...] = ()
    slices: tuple[int, ...] = ()
    room_mib: int = 0


# ---------------------------------------------------------------------- one device ----


def whole_key(g: GpuInfo) -> tuple[bool, int, int, int]:
    """The sort key of a whole device (GPU or MIG device) not yet handed out, first preferred
    first: ``core.model.sharing.device_order`` (healthy first, most free MiB, lowest index), then
    the MIG index."""
    return (*device_order(g.healthy, g.free_mib, g.index), g.mig_index or 0)


def slice_key(g: GpuInfo, unit_mib: int, policy: str) -> tuple[int, int]:
    """The sort key of a shared GPU a slice fits on, first chosen first: its room
    (``GpuInfo.room_mib``) least first under ``binpack``, most under ``spread``; lowest
    index on a tie."""
    return (policy_sign(policy) * g.room_mib(unit_mib), g.index)


def fits_slice(g: GpuInfo, mib: int, unit_mib: int) -> bool:
    """Whether a slice of ``mib`` MiB fits on the shared GPU ``g``: healthy, and its room
    (``GpuInfo.room_mib``: the least of its free MiB and its units left, when counted) at least
    ``mib``. ``pick_slice`` chooses among the GPUs it holds for; the device plugin's
    ``Allocate`` asks it of the one GPU the kubelet's units are on."""
    return g.healthy and g.room_mib(unit_mib) >= mib


def pick_slice(gpus: Iterable[GpuInfo], mib: int, unit_mib: int, policy: str) -> GpuInfo | None:
    """The shared GPU a slice of ``mib`` MiB goes to among ``gpus``: one it fits on
    (``fits_slice``), first by ``slice_key``; ``None`` when none has it."""
    fit = [g for g in gpus if fits_slice(g, mib, unit_mib)]
    return min(fit, key=lambda g: slice_key(g, unit_mib, policy)) if fit else None


T = TypeVar("T")


def first_whole(devices: Sequence[T], count: int, info: Callable[[T], GpuInfo],
                chosen: Sequence[T] = (),
                links: Callable[[T, T], int] | None = None) -> list[T]:  # fmt: skip
    """The next ``count`` whole devices handed out of ``devices`` (fewer when there are fewer),
    first handed out first: THE rule of which whole devices a container gets, called by the
    device plugin's ``GetPreferredAllocation`` (``deviceplugin.allocation.preferred``: device
    IDs, the kubelet's available list) and by the extender's prediction (``pick_whole``: the
    node's devices no container holds), so both choose alike.

    Memory first, then links:

    1. Without ``links`` (no topology known), or when fewer than ``count`` healthy devices are
       there: the first ``count`` by ``whole_key`` (``info(device)``: its ``GpuInfo``; healthy
       first, most free MiB first, lowest index, then MIG index); a tie of everything goes to
       the device earlier in ``devices``.
    2. With ``links`` (``links(a, b)``: the pair's score, ``core.model.topology``; higher is
       better connected): the best connected set among those with about as much free memory
       as rule 1's, in whole GiB less an eighth (``core.allocation.connected.connected_set``,
       which states the rule).

    The result is in rule 1's order."""
    ranked = sorted(devices, key=lambda d: whole_key(info(d)))
    first = ranked[:count]
    if links is None or count <= 0 or len(first) < count or not all(info(d).healthy for d in first):
        return first
    return connected_set(ranked, count, info, chosen, links)


def pick_whole(devices: Iterable[GpuInfo], count: int, memory_mib: int = 0,
               topology: NodeTopology | None = None) -> tuple[GpuInfo, ...] | None:  # fmt: skip
    """The ``count`` whole devices a pod of the device plugin's resource gets: the first
    ``count`` of the healthy ones no container holds, as the plugin hands them out
    (``first_whole``); ``None`` when there are fewer, or when one of them has less than
    ``memory_mib`` free (the plugin would hand it out all the same). A pod that asks for the
    devices alone (no memory annotation: ``memory_mib`` 0) fits wherever ``count`` are free.
    ``topology``: the node's wiring (the telemetry's ``links``), whole GPUs only: the links
    between GPUs then choose among the equally roomy (``first_whole``)."""
    free = [g for g in devices if g.healthy and not g.assigned]
    links = None
    if topology is not None and topology.pairs:
        links = lambda a, b: topology.pair_score(a.index, b.index)  # noqa: E731
    got = first_whole(free, count, _same, links=links)
    if len(got) < count or any(g.free_mib < memory_mib for g in got):
        return None
    return tuple(got)


def _same(g: GpuInfo) -> GpuInfo:
    return g


def pick_memory(gpus: Iterable[GpuInfo], count: int, memory_mib: int, policy: str
                ) -> tuple[GpuInfo, ...] | None:  # fmt: skip
    """The ``count`` GPUs a pod asking ``memory_mib`` on each (by annotation, no device) is
    counted on: healthy, not held whole, with that much free; ``binpack`` the least free,
    ``spread`` the most, lowest index on a tie. ``None`` when fewer fit."""
    fit = [g for g in gpus if g.healthy and not g.assigned and g.free_mib >= memory_mib]
    if len(fit) < count:
        return None
    sign = policy_sign(policy)
    return tuple(sorted(fit, key=lambda g: (sign * g.free_mib, g.index))[:count])


def take_slice(g: GpuInfo, mib: int, unit_mib: int, *, memory: bool = True,
               units: bool = True, memory_mib: int | None = None) -> GpuInfo:  # fmt: skip
    """``g`` less a slice of ``mib`` MiB: from its live free memory (``memory``; ``memory_mib``
    of it when given: what of the slice still counts there) and from its units left
    (``units``, when counted), each clamped at 0."""
    used = mib if memory_mib is None else memory_mib
    free = max(0, g.free_mib - used) if memory else g.free_mib
    left = g.units_left
    if units and left is not None:
        left = max(0, left - mib // unit_mib)
    return g if (free, left) == (g.free_mib, g.units_left) else replace(g, free_mib=free,
                                                                        units_left=left)


def take_whole(g: GpuInfo) -> GpuInfo:
    """``g`` handed to a container whole: ``assigned``, no room for another pod (``free_mib``
    0), its live free memory kept as ``assigned_free_mib``."""
    if g.assigned:
        return g
    return replace(g, assigned=True, free_mib=0, assigned_free_mib=g.free_mib)


def take_memory(g: GpuInfo, mib: int) -> GpuInfo:
    """``g`` with ``mib`` of its free memory counted as taken (clamped at 0)."""
    return g if mib <= 0 else replace(g, free_mib=max(0, g.free_mib - mib))


# ---------------------------------------------------------------------- one pod ----


def need_devices(state: NodeGpuState, need: Need) -> tuple[GpuInfo, ...]:
    """The devices of ``state`` a need's whole part is placed on: the MIG devices of its
    ``profile``, else the whole GPUs."""
    if need.profile is not None:
        return tuple(m for m in state.mig if m.profile == need.profile)
    return state.gpus


def place(state: NodeGpuState, need: Need, policy: str = DEFAULT_POLICY) -> Taken | None:
    """Where ``need`` goes on ``state``'s devices (their free memory and units being what is
    left after everything still counting there), or ``None`` when it does not fit: its whole
    part (``pick_whole`` for devices of the plugin, ``pick_memory`` for memory alone), then
    each slice in order on ``pick_slice``'s GPU, taken off before the next. A node without a
    unit size fits no slice."""
    gpus: tuple[int, ...] = ()
    migs: tuple[tuple[int, int], ...] = ()
    room = 0
    n = need.whole_count
    if n:
        devices = need_devices(state, need)
        wiring = state.topology if need.profile is None else None
        chosen = (pick_whole(devices, n, need.memory_mib, wiring) if need.exclusive or need.profile
                  else pick_memory(devices, n, need.memory_mib, policy))  # fmt: skip
        if chosen is None:
            return None
        if need.profile is not None:
            migs = tuple((g.index, g.mig_index or 0) for g in chosen)
            room = sum(g.free_mib for g in devices if g.healthy and not g.assigned)
        else:
            gpus = tuple(sorted(g.index for g in chosen))
            room = state.free_total_mib
    if not need.slices:
        return Taken(gpus, migs, (), room)
    unit = state.share_unit_mib
    if not unit or not state.shared:
        return None
    placed = place_slices(state.shared, need.slice_mibs(unit), policy, unit,
                          tuple(u * unit for u in need.firsts), need.memory_mibs(unit))  # fmt: skip
    if placed is None:
        return None
    return Taken(gpus, migs, placed[0], placed[1])


#: (GPU index per slice, in the slices' order; the room of the GPU the largest went to, MiB)
Placed = tuple[tuple[int, ...], int]


def place_slices(gpus: Sequence[GpuInfo], mibs: Sequence[int], policy: str, unit_mib: int,
                 firsts: Sequence[int] = (), memories: Sequence[int] = ()
                 ) -> Placed | None:  # fmt: skip
    """Each slice of ``mibs`` (MiB, whole units of ``unit_mib``, in the kubelet's order) on
    ``gpus`` (shared GPUs), each taken off (``take_slice``) before the next is placed, as the
    device plugin hands them out one container at a time. A slice is a group of containers on
    one GPU (``scheduler.container_asks.held_slices``): the plugin places the group by its first container
    (``firsts``: MiB of each group's first container; empty: the group's own size), at
    ``pick_slice``'s GPU for that size, and the later containers reusing its units stay there;
    the group fits only if that GPU takes the whole group. ``None`` when a slice fits nowhere,
    or its first container's GPU cannot take the group (the kubelet's later containers would be
    refused there). ``memories``: the MiB of each slice that still counts in its GPU's memory
    once the pod is admitted (``Need.memory_mibs``; empty: all of it)."""
    books = list(gpus)
    where: list[int] = []
    room = 0
    largest = max(range(len(mibs)), key=lambda k: (mibs[k], -k), default=0)
    for k, mib in enumerate(mibs):
        first = firsts[k] if k < len(firsts) else mib
        g = pick_slice(books, first, unit_mib, policy)
        if g is None or g.room_mib(unit_mib) < mib:
            return None
        if k == largest:
            room = g.room_mib(unit_mib)
        used = memories[k] if k < len(memories) else mib
        books[books.index(g)] = take_slice(g, mib, unit_mib, memory_mib=used)
        where.append(g.index)
    return tuple(where), room


def slice_room(state: NodeGpuState, need: Need, policy: str = DEFAULT_POLICY) -> int | None:
    """The room of the shared GPU ``need``'s largest slice goes to on ``state`` (``place`` of
    its slices alone); ``None`` when its slices do not all fit (or the node shares no GPU)."""
    if not need.slices:
        return None
    taken = place(state, replace(need, exclusive=False, profile=None), policy)
    return taken.room_mib if taken is not None else None


def choose_gpus(state: NodeGpuState, need: Need, policy: str = DEFAULT_POLICY) -> tuple[int, ...]:
    """The whole GPUs ``place`` gives ``need`` on ``state`` (sorted indices); ``()`` when it
    does not fit or takes none."""
    taken = place(state, replace(need, slices=()) if need.exclusive else need, policy)
    return taken.gpus if taken is not None else ()


def take(state: NodeGpuState, need: Need, taken: Taken, *, memory: bool = True,
         units: bool = True) -> NodeGpuState:  # fmt: skip
    """``state`` less ``need`` where ``taken`` puts it: each GPU of ``taken.gpus`` handed out
    whole (``need.exclusive``) or less ``need.memory_mib``, each MIG
    device of ``taken.migs`` handed out whole, each slice from its shared GPU's live free
    memory (``memory``) and units (``units``). A device not on the node is skipped (it left, or
    the reservation named one it no longer has). ``free_total_mib`` follows the whole GPUs."""
    out = state
    if taken.gpus:
        on = set(taken.gpus)
        gpus = tuple((take_whole(g) if need.exclusive else take_memory(g, need.memory_mib))
                     if g.index in on else g for g in state.gpus)  # fmt: skip
        out = replace(out, gpus=gpus, free_total_mib=sum(g.free_mib for g in gpus if g.healthy))
    if taken.migs:
        on_mig = set(taken.migs)
        out = replace(out, mig=tuple(take_whole(m) if (m.index, m.mig_index or 0) in on_mig
                                     else m for m in state.mig))  # fmt: skip
    unit = state.share_unit_mib
    if taken.slices and unit and (memory or units):
        shared = list(out.shared)
        at = {g.index: k for k, g in enumerate(shared)}
        for index, n, m in zip(taken.slices, need.slices, need.memory_mibs(unit), strict=False):
            k = at.get(index)
            if k is not None:
                shared[k] = take_slice(shared[k], n * unit, unit, memory=memory, units=units,
                                       memory_mib=m)  # fmt: skip
        out = replace(out, shared=tuple(shared))
    return out

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
  reserved, or when the extender first saw it bound; on the extender's monotonic clock, never
  the API server's: ``ledger``), or
- every device it is on shows it: the device's own free memory, read after the pod started
  (``started_at``: the pod's ``status.startTime``), dropped since the extender first counted
  it there (``baselines``) by at least its memory there plus every earlier grant still in the
  book of that device, as the device plugin keeps its slices (``core.allocation.shown.still_in_book``;
  judged only on devices healthy then and now; a placement whose devices are not known, and
  a whole device given with no memory asked (a pod without the memory annotation,
  ``need.pod_need``), are shown only by the kubelet's books), or
- the node's telemetry, read after the pod started, names the pod among the holders of its
  GPUs (``NodeGpuState.holders``, the kubelet's PodResources): an assigned whole GPU has no
  room whatever its memory shows; a slice's units are held (its memory still counts until a
  drop shows it).

A deleted, failed or finished pod is never a placement (the pod watch drops it); the units of a
bound pod's slices that the kubelet holds and does not list count for the pod's life
(``_unlisted``).

``adjust`` takes each pending placement off where the placement model puts it
(``core.allocation.placement.take``): the devices it was given (``gpus``, ``whole_gpus``, ``migs``: chosen
by the filter as the device plugin would, ``core.allocation.placement.place``), and for devices not known
(learned from the pod watch: bound by another path, or after a restart) the healthy ones first
in the model's order, clamped at zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..core.allocation.placement import Need, Taken, take, whole_key
from ..core.allocation.shown import Grant, still_in_book
from ..core.schema import GpuInfo, NodeGpuState

__all__ = ["ASSUME_S", "Device", "Placement", "adjust", "baselines", "expiry", "live_free_mib",
           "pending"]

#: a device the in-flight rule measures a drop on: ("gpu" | "shared", GPU index) or
#: ("mig", (GPU index, MIG index))
Device = tuple[str, Any]

#: how long a reservation made at filter time counts while the pod is not seen bound: the
#: window Filter -> Bind (a pod held in Permit included: this must exceed the Permit wait)
ASSUME_S = 30.0


@dataclass(frozen=True, slots=True)
class Placement:
    """One pod's GPU memory on ``node``: ``count`` GPUs with ``memory_mib`` each, on the GPUs
    ``gpus`` (indices; empty: not known, taken from the freest). ``bound``: seen bound by the
    pod watch (False: reserved by the filter). ``placed_at`` is on the extender's monotonic
    clock (``records.ages_s``); ``started_at`` is the pod's ``status.startTime``, epoch s."""

    key: str  # namespace/name
    uid: str
    node: str
    memory_mib: int
    count: int = 1
    placed_at: float = 0.0
    started_at: float | None = None
    gpus: tuple[int, ...] = ()
    bound: bool = True
    #: a pod's slices of shared GPUs, units per container (``container_asks.held_slices``: a sidecar's
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
    #: a pod of slices that also asks for whole devices of the GPU resource: the whole GPUs it
    #: is given (``gpus`` are its slices' there)
    whole_gpus: tuple[int, ...] = ()
    #: MIG devices of ``profile`` it is given, as ``(GPU index, MIG index)``
    profile: str | None = None
    migs: tuple[tuple[int, int], ...] = ()
    #: units of each slice whose memory counts once the pod is admitted
    #: (``Need.slice_memory``; empty: ``slices``)
    slice_memory: tuple[int, ...] = ()
    #: the live free MiB of each device of ``memory_on`` when the extender first counted it
    #: (``None``: not present and healthy then): what a drop on that GPU is measured from
    baselines: tuple[int | None, ...] = ()

    def memory_on(self, unit_mib: int | None) -> tuple[tuple[Device, int], ...]:
        """The memory it takes per device it is known to be on: ``(device, MiB)``, a device
        being ``("gpu", index)``, ``("shared", index)`` or ``("mig", (index, mig index))``;
        empty when its devices are not known (``gpus`` empty)."""
        if self.slices:
            return tuple((("shared", i), n * (unit_mib or 0))
                         for i, n in zip(self.gpus, self.slice_memory or self.slices,
                                         strict=False))  # fmt: skip
        if self.profile is not None:
            return tuple((("mig", k), self.memory_mib) for k in self.migs)
        return tuple((("gpu", i), self.memory_mib) for i in self.gpus)

    @property
    def need(self) -> Need:
        """What it takes, as the placement model reads it (``core.allocation.placement.Need``)."""
        return Need(self.memory_mib, self.count, slices=self.slices, profile=self.profile,
                    exclusive=self.exclusive or self.profile is not None,
                    slice_memory=self.slice_memory)  # fmt: skip


def expiry(p: Placement, settle_s: float, assume_s: float = ASSUME_S) -> float:
    """When ``p`` stops counting by age (on ``placed_at``'s clock: the extender's monotonic)."""
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
    """The placements that still count against ``state``'s node (oldest first); and, whatever
    their age, the units of a bound pod's slices the kubelet holds but its PodResources does not
    list (``_unlisted``: a plain init container's units the containers after it did not reuse,
    held for the pod's life), in the units book only."""
    placements = list(placements)
    live = sorted(
        (p for p in placements
         if p.uid != exclude_uid and now < expiry(p, settle_s, assume_s)),  # fmt: skip
        key=lambda p: (p.started_at if p.started_at is not None else float("inf"), p.placed_at),
    )
    if state is None or state.read_at is None:
        return live
    hidden = [u for p in placements if p.uid != exclude_uid and (u := _unlisted(p, state))]
    return _pending(live, state) + hidden


def _unlisted(p: Placement, state: NodeGpuState) -> Placement | None:
    """The units of ``p``'s slices that the kubelet holds and the reading's holders do not
    list, per GPU, as a placement counting in the units book only; ``None`` when there are none
    (or the pod is not a holder yet, or where its slices are is not known). The kubelet keeps a
    plain init container's units allocated for its pod's life, while its PodResources API lists
    only app containers and sidecars: a 40-unit init container before a 1-unit app holds 40
    units, 1 of them listed, and the device plugin's available list lacks the other 39."""
    if not (p.bound and p.slices and state.units_attributed and _held(p, state)):
        return None
    gpus = p.gpus if len(p.gpus) == len(p.slices) else ()
    listed: dict[int, int] = {}
    for key, index, n in state.slices_held:
        if key == p.key:
            listed[index] = listed.get(index, 0) + n
    if not gpus and len(p.slices) == 1 and len(listed) == 1:
        gpus = tuple(listed)  # one slice: on the GPU its listed units are on
    if not gpus:
        return None
    expected: dict[int, int] = {}
    for index, n in zip(gpus, p.slices, strict=True):
        expected[index] = expected.get(index, 0) + n
    rest = {i: n - listed.get(i, 0) for i, n in expected.items() if n > listed.get(i, 0)}
    if not rest:
        return None
    return replace(p, slices=tuple(rest.values()), gpus=tuple(rest), whole_gpus=(), count=0,
                   exclusive=False, in_memory=False, in_units=True, baselines=(),
                   slice_memory=())  # fmt: skip


def _pending(live: list[Placement], state: NodeGpuState) -> list[Placement]:
    """``pending``'s placements by age, on a reading: each still counting in its books."""
    in_memory = _counting(live, state)
    out: list[Placement] = []
    for p in live:  # two books for slices, as the device plugin keeps them
        memory = id(p) in in_memory
        # whole devices, or slices without holders published: the memory book decides
        if not p.slices or not state.units_attributed:
            if memory:
                out.append(p)
            continue
        units = not _held(p, state)  # the kubelet's books: shown once it is a holder
        if memory and units == p.in_units:
            out.append(p)
        elif memory or units:
            out.append(replace(p, in_memory=memory, in_units=units,
                               gpus=p.gpus if units else _held_on(p, state)))  # fmt: skip
    return out


def live_free_mib(state: NodeGpuState, device: Device) -> int | None:
    """A device's live free MiB in ``state`` (an assigned GPU's by its reading), ``None`` when
    it is not there or not healthy: a drop is judged only on healthy devices."""
    kind, key = device
    found: GpuInfo | None
    if kind == "mig":
        found = next((m for m in state.mig if (m.index, m.mig_index or 0) == key), None)
    else:
        found = next((g for g in (state.shared if kind == "shared" else state.gpus)
                      if g.index == key), None)  # fmt: skip
    if found is None or not found.healthy:
        return None
    return found.assigned_free_mib if found.assigned_free_mib is not None else found.free_mib


def baselines(state: NodeGpuState | None, p: Placement) -> tuple[int | None, ...]:
    """``p``'s devices' live free MiB in ``state`` (``Placement.baselines``)."""
    if state is None:
        return ()
    return tuple(live_free_mib(state, d) for d, _ in p.memory_on(state.share_unit_mib))


def _counting(live: list[Placement], state: NodeGpuState) -> set[int]:
    """The ids of the placements of ``live`` whose memory a reading does not show yet, judged
    per device on each GPU's own free memory as the device plugin's book of slices judges it
    (``core.allocation.shown.still_in_book``: the grants in the order they were made, each added after a
    look at its own baseline): shown once every device it is on shows it, or (whole devices)
    once its pod is a holder read after it started. A device absent or unhealthy then or now
    shows nothing; a placement whose devices are not known is shown only by its holders."""
    read_at = state.read_at or 0.0
    unit = state.share_unit_mib
    on: dict[Device, list[tuple[int, Grant]]] = {}
    counting: set[int] = set()
    for p in sorted(live, key=lambda p: p.placed_at):  # as they were made
        after = p.started_at is not None and read_at > p.started_at
        # a holder's whole GPU is shown by the books; a slice's memory only by its GPU's drop
        # (its units are the other book), as the device plugin's slice book judges it
        held = not p.slices and _held(p, state)
        parts = p.memory_on(unit)
        if not parts or len(parts) < len(p.slices):
            if not held:
                counting.add(id(p))
            continue
        for k, (device, mib) in enumerate(parts):
            base = p.baselines[k] if k < len(p.baselines) else None
            if not mib and not p.slices:  # a drop of nothing shows nothing: a whole device
                base = None  # given with no memory asked is shown by its holder alone
            on.setdefault(device, []).append((id(p), Grant(mib, base, read_after=after, held=held)))
    for device, grants in on.items():
        free_now = live_free_mib(state, device)
        if free_now is None:  # gone or unhealthy now: no drop shows anything
            grants = [(i, replace(g, baseline_free_mib=None)) for i, g in grants]
            free_now = 0
        flags = still_in_book([g for _, g in grants], free_now)
        counting.update(i for (i, _), still in zip(grants, flags, strict=True) if still)
    return counting


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


def adjust(state: NodeGpuState, placements: Sequence[Placement]) -> NodeGpuState:
    """``state`` with each placement's need taken off where it is (``core.allocation.placement.take``):
    its own devices when known and still healthy on the node, else the healthy ones with the
    most free (or room) left; known devices first. A slice comes off each book it still counts
    in (``Placement.in_memory``, ``in_units``); everything is clamped at zero."""
    for p in sorted(placements, key=lambda p: not (p.gpus or p.migs)):  # known devices first
        need = p.need
        state = take(state, need, _where(state, p, need),
                     memory=p.in_memory, units=p.in_units)  # fmt: skip
    return state


def _where(state: NodeGpuState, p: Placement, need: Need) -> Taken:
    """Where ``p`` is on ``state``: its own devices that are there and healthy, the rest on the
    healthy ones with the most free memory (whole GPUs, MIG devices) or room (slices) left."""
    if p.slices:
        unit = state.share_unit_mib or 1
        good = {g.index: g for g in state.shared if g.healthy}
        slices = []
        for k, _ in enumerate(p.slices):
            index = p.gpus[k] if k < len(p.gpus) and p.gpus[k] in good else None
            if index is None and good:
                index = max(good.values(), key=lambda g: (g.room_mib(unit), -g.index)).index
            slices.append(index if index is not None else -1)
        whole = _mine([g.index for g in state.gpus if g.healthy and not g.assigned],
                      p.whole_gpus, need.whole_count, state.gpus)  # fmt: skip
        return Taken(gpus=whole, slices=tuple(slices))
    if p.profile is not None:
        devices = [m for m in state.mig if m.profile == p.profile and m.healthy]
        keys = {(m.index, m.mig_index or 0): m for m in devices}
        mine = [k for k in p.migs if k in keys][: p.count]
        rest = sorted((k for k in keys if k not in mine and not keys[k].assigned),
                      key=lambda k: whole_key(keys[k]))  # fmt: skip
        return Taken(migs=tuple(mine + rest[: p.count - len(mine)]))
    healthy = [g.index for g in state.gpus if g.healthy]
    return Taken(gpus=_mine(healthy, p.gpus, p.count, state.gpus))


def _mine(healthy: list[int], known: tuple[int, ...], count: int,
          gpus: Sequence[GpuInfo]) -> tuple[int, ...]:  # fmt: skip
    """``count`` of ``healthy``: the ``known`` ones first, then in the placement model's order
    of whole devices (``core.allocation.placement.whole_key``: the most free first)."""
    good = set(healthy)
    mine = [i for i in known if i in good][:count]
    if len(mine) < count:
        rest = sorted((g for g in gpus if g.index in good and g.index not in mine), key=whole_key)
        mine += [g.index for g in rest[: count - len(mine)]]
    return tuple(mine)

"""Pure rules of GPU sharing in the device plugin: unit devices, the one GPU a slice goes to,
and the slices handed out that the GPU's reading does not show yet.

A shared GPU is served as ``omaticaya.io/gpu-memory`` units (``core.model.sharing``: one device per
``unit_mib`` of its total memory, IDs ``<GPU UUID>::<k>``). A slice is the units one container
gets; all of them come from one GPU, chosen where both books have room:

- the kubelet's: the GPU's units in the kubelet's ``available`` list (units not handed out);
- the GPU's own: its live free memory (``nvmlDeviceGetMemoryInfo``, memory held by processes
  Kubernetes does not know about counts) minus the slices ``Allocate`` handed out on it that
  the reading does not show yet (``still_pending``).

Which GPU is the placement model's (``core.allocation.placement.pick_slice``, the extender's rule too):
among the healthy GPUs where the slice fits in both books, the one with the least room
(``binpack``, the default: big holes stay whole for big slices) or the most (``spread``); room
is the least of the two books, lowest GPU index on a tie. ``Room`` is a GPU as that choice sees
it, ``choose`` asks the model for one slice.

A slice handed out stops counting against its GPU's live free memory (``still_pending``) when

- the GPU's free memory has dropped, since the slice was handed out (``baseline_free_mib``),
  by at least this slice plus every slice handed out before it that still counts (the memory
  is in use now: the live reading shows it), or
- it is ``settle_s`` old (``OMATICAYA_SHARE_SETTLE_S``: a container that never uses its
  slice, or one deleted before it did; the kubelet's units still count it until the pod goes), or
- a later slice shares a unit with it (``superseded``): the kubelet hands a unit out again only
  once its holder is over, most often a plain init container that ran to completion whose
  units the next init container, a sidecar or an app container of the pod reuses (a subset of
  them, or some of them plus others). A sidecar (an init container with ``restartPolicy:
  Always``) is never over while its pod runs: its units are not reused, and its slice counts
  beside the app containers', as the extender counts it (``scheduler.need.held_slices``).

The first rule is the extender's too (``core.allocation.shown``). It is conservative in what it takes as
shown: memory freed by another process at the same time hides a drop, and the slice then waits
out ``settle_s``; once one slice is not shown, no later one on the GPU is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..core.allocation.mps import LIMIT_ENV, MPS_LIMIT_ENV
from ..core.allocation.placement import pick_slice, whole_key
from ..core.allocation.shown import still_pending
from ..core.model.sharing import parse_unit_id, slice_mib, unit_id
from ..core.schema import GpuInfo
from .allocation import DeviceState

__all__ = [
    "LIMIT_ENV",
    "MPS_LIMIT_ENV",
    "Room",
    "Slice",
    "SliceRefused",
    "choose",
    "expand",
    "gpus_of",
    "preferred_units",
    "released",
    "rooms",
    "slice_envs",
    "still_pending",
    "superseded",
]



class SliceRefused(Exception):
    """``Allocate`` must refuse a slice: ``code`` is the gRPC status name (``INVALID_ARGUMENT``
    for units across GPUs, ``FAILED_PRECONDITION`` for a GPU without the live room)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Slice:
    """A slice handed out by ``Allocate``: its unit IDs, its GPU's UUID, its size (MiB), when
    (``at_s``, the plugin's monotonic clock) and the GPU's live free memory then (MiB, ``None``
    when unknown)."""

    units: frozenset[str]
    gpu: str
    mib: int
    at_s: float
    baseline_free_mib: int | None
    #: from when (the clock of the kubelet's lists: the agent's) a PodResources list that does
    #: not name its units releases it (``released``; ``None``: never)
    listed_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Room:
    """A GPU as a slice's candidate: UUID, index, health, ``free_mib`` (live free memory minus
    the slices pending on it, MiB; ``None`` when unknown) and ``available`` (its unit IDs in the
    kubelet's available list, in unit order)."""

    gpu: str
    index: int
    healthy: bool
    free_mib: int | None
    available: tuple[str, ...]

    def room_mib(self, unit_mib: int) -> int:
        """What a slice could still get here: the least of the two books (MiB; -1 unknown), as
        the placement model reads this GPU (``info``; ``core.model.sharing.gpu_room_mib``, the rule
        the extender judges each shared GPU by)."""
        return -1 if self.free_mib is None else self.info().room_mib(unit_mib)

    def info(self) -> GpuInfo:
        """This GPU as the placement model sees it: its live free MiB less the slices pending
        (-1 when unknown: no slice fits), health, and its available units as ``units_left``."""
        free = self.free_mib if self.free_mib is not None else -1
        return GpuInfo(self.index, free, self.healthy, units_left=len(self.available))


def expand(gpus: Iterable[DeviceState], counts: Mapping[str, int]) -> list[DeviceState]:
    """Each GPU state (``id`` its UUID) as its ``counts[uuid]`` unit devices, which share its
    health, reasons and free memory; in GPU order, then unit order."""
    return [
        DeviceState(unit_id(g.id, k), g.index, g.healthy, g.reasons, g.free_mib)
        for g in gpus
        for k in range(counts.get(g.id, 0))
    ]


def gpus_of(device_ids: Iterable[str]) -> list[str]:
    """The GPU UUIDs ``device_ids`` (unit IDs) are on, in first-seen order; an ID that is not a
    unit ID counts as a GPU of its own name."""
    found: dict[str, None] = {}
    for d in device_ids:
        parsed = parse_unit_id(d)
        found.setdefault(parsed[0] if parsed else d, None)
    return list(found)


def superseded(slices: Iterable[Slice], units: Iterable[str]) -> tuple[Slice, ...]:
    """The slices (of one GPU) that a new slice of unit IDs ``units`` supersedes: those sharing
    a unit with it. The kubelet gives a unit again only once the container holding it is over:
    a plain init container that ran to completion (the pod's next init container, a sidecar or
    its app containers reuse its units, a subset of them or some plus others; a sidecar's own
    units are never reused), or a pod gone. Such a slice counts no more; its units count once,
    in the new slice."""
    new = frozenset(units)
    return tuple(s for s in slices if not s.units.isdisjoint(new))


def released(slices: Sequence[Slice], held_units: frozenset[str], listed_at_s: float
             ) -> tuple[Slice, ...]:  # fmt: skip
    """The slices of ``slices`` the kubelet still holds: one whose units the kubelet's list of
    assigned devices asked for at ``listed_at_s`` (at or after the slice's
    ``listed_after_s``; PodResources lists a container's devices from its ``Allocate`` on)
    does not name (``held_units``) has ended with its container or pod, and stops counting at
    once. The kubelet tells the plugin nothing when units are freed; without this a slice of a
    pod deleted before it used its memory counts until ``settle_s``, while the extender (which
    sees the pod go) counts it no more."""
    return tuple(s for s in slices
                 if s.listed_after_s is None or listed_at_s < s.listed_after_s
                 or s.units & held_units)  # fmt: skip


def rooms(
    gpus: Iterable[DeviceState],
    pending_mib: Mapping[str, int],
    available: Iterable[str],
) -> list[Room]:
    """Each GPU (state ``id`` its UUID) with the units of it in ``available`` (unit IDs from
    the kubelet, untrusted: unknown and repeated IDs are dropped) and its live free memory less
    ``pending_mib[uuid]``."""
    by_gpu: dict[str, dict[int, str]] = {}
    for d in available:
        parsed = parse_unit_id(d)
        if parsed is not None:
            by_gpu.setdefault(parsed[0], {})[parsed[1]] = d
    out = []
    for g in gpus:
        units = by_gpu.get(g.id, {})
        free = None if g.free_mib is None else g.free_mib - pending_mib.get(g.id, 0)
        out.append(Room(g.id, g.index, g.healthy, free, tuple(units[k] for k in sorted(units))))
    return out


def choose(candidates: Sequence[Room], size: int, unit_mib: int, policy: str = "binpack") -> Room | None:
    """The GPU of ``candidates`` a slice of ``size`` units goes to, by the placement model
    (``core.allocation.placement.pick_slice``): healthy, ``size`` units available and ``size * unit_mib``
    MiB of live room; ``binpack`` the least room, ``spread`` the most, lowest index on a tie.
    ``None`` when no GPU has both."""
    infos = [r.info() for r in candidates]
    best = pick_slice(infos, slice_mib(size, unit_mib), unit_mib, policy)
    return next((r for r, g in zip(candidates, infos, strict=True) if g is best), None)


def preferred_units(
    candidates: Sequence[Room],
    must_include: Sequence[str],
    size: int,
    unit_mib: int,
    policy: str = "binpack",
) -> list[str]:
    """The ``size`` unit IDs to prefer: every must-include unit, then more from the must-include
    GPU (that GPU is the one); else all from ``choose``'s GPU. When no GPU has room in both
    books, the healthy GPU with the units that is first by ``core.allocation.placement.whole_key`` (the most
    live room, lowest index; ``Allocate`` then refuses it with the reason); ``[]`` when no single GPU has the units (the kubelet then picks, and
    ``Allocate`` refuses a slice across GPUs)."""
    chosen = list(dict.fromkeys(must_include))
    if chosen:
        gpu = gpus_of(chosen[:1])[0]
        for r in candidates:
            if r.gpu == gpu:
                chosen += [u for u in r.available if u not in chosen][: max(size - len(chosen), 0)]
        return chosen
    best = choose(candidates, size, unit_mib, policy)
    if best is None:  # the placement model's first whole device: the most live free memory
        enough = [r for r in candidates if r.healthy and len(r.available) >= size]
        if not enough:
            return []
        best = min(enough, key=lambda r: whole_key(r.info()))
    return list(best.available[:size])


def slice_envs(units: int, unit_mib: int) -> dict[str, str]:
    """The environment of a container given a slice of ``units`` units without enforcement
    (``OMATICAYA_SHARE_ENFORCEMENT=none``): the MPS limit on its one visible device
    (``0=<N>M``, which nothing enforces without a daemon) and
    ``OMATICAYA_GPU_MEMORY_LIMIT_MIB=<N>`` (N in MiB). Under MPS: ``core.allocation.mps.client_spec``."""
    n = slice_mib(units, unit_mib)
    return {MPS_LIMIT_ENV: f"0={n}M", LIMIT_ENV: str(n)}

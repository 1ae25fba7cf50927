"""The shared resource's state beside the kubelet: unit counts per GPU and the slices handed out.

``Slicer`` is what the servicer of ``omaticaya.io/gpu-memory`` asks (``service.DeviceService``
with ``unit_mib`` set): which units to prefer and whether a slice may be allocated, from the
GPU states of the latest reading and the slices it handed out (``slices.still_pending``). Its
one piece of state is that book of slices, kept in memory: after a restart of the plugin, slices
handed out before it count only once the reading shows them (their units stay counted by the
kubelet, from its checkpoint).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from loguru import logger

from ..core.allocation.memory_limit import slice_edits
from ..core.allocation.mps import ClientSpec, SliceRequest, client_spec, slice_id, thread_pct
from ..core.allocation.placement import POLICIES, fits_slice
from ..core.model.sharing import parse_unit_id, slice_mib
from ..core.schema import GpuInfo
from ..sources.mps import SliceDaemons, SliceUnavailable
from .allocation import DeviceState
from .config import DEFAULT_SETTLE_S, MpsConfig
from .slices import (
    Slice,
    SliceRefused,
    gpus_of,
    preferred_units,
    released,
    rooms,
    slice_envs,
    still_pending,
    superseded,
)

__all__ = ["DEFAULT_SETTLE_S", "Booking", "Enforcement", "KubeletView", "SliceRefused", "Slicer"]

#: a PodResources list asked for this long after a slice's Allocate names it if the kubelet
#: still holds it (the kubelet records the devices as the RPC returns, within milliseconds)
LIST_MARGIN_S = 1.0
#: at most this many slices are kept per GPU (the oldest go first)
MAX_SLICES_PER_GPU = 4096
#: who the device plugin's slice requests are from (``core.allocation.mps.SliceRequest.owner``)
OWNER = "device-plugin"


@dataclass
class Booking:
    """What one ``Allocate`` call booked so far, container by container: the slices ``added``
    and those they ``superseded`` (taken out of the book), so that a refusal of a later
    container of the same call can take the earlier ones back (``Slicer.take_back``)."""

    added: list[Slice] = field(default_factory=list)
    superseded: list[Slice] = field(default_factory=list)


@dataclass(frozen=True)
class KubeletView:
    """What the ``Slicer`` knows of the kubelet's own books: ``held()``, the unit IDs its last
    PodResources list names as assigned and when that list was asked for; ``stamp()``, that
    clock now (both ``None``: not known)."""

    held: Callable[[], tuple[frozenset[str], float] | None] | None = None
    stamp: Callable[[], float | None] | None = None


@dataclass(frozen=True)
class Enforcement:
    """What enforces the ``Slicer``'s slices: ``mps`` (``config.MpsConfig``; ``None``: the
    limit only in the environment), ``daemons`` (the slices' MPS daemons; made from ``mps``
    when ``None``) and ``driver_major()`` (the NVIDIA driver's branch, for its per-container
    limit)."""

    mps: MpsConfig | None = None
    daemons: SliceDaemons | None = None
    driver_major: Callable[[], int | None] | None = None


class Slicer:
    """Slices of shared GPUs: ``unit_mib`` MiB per unit, ``policy`` ``binpack`` or ``spread``,
    ``settle_s`` seconds at most a slice counts unseen, on ``clock`` (monotonic seconds);
    ``kubelet`` (``KubeletView``: ``held`` and ``stamp``) and ``enforcement`` (``Enforcement``:
    ``mps``, ``daemons``, ``driver_major``), as below.

    ``held`` (optional) gives the unit IDs the kubelet's last list names as assigned
    (PodResources, the agent's attribution) and when it was asked for, ``stamp`` that clock now:
    a slice whose units a list asked for ``LIST_MARGIN_S`` or more after its ``Allocate`` does
    not name is over (``slices.released``); ``None``: not known.

    ``mps``: slices are enforced by CUDA MPS (``config.MpsConfig``), one control daemon per slice
    whose default pinned-memory limit is the slice (``core.allocation.mps``): ``allocate`` asks for the
    slice's daemon and waits until it is up (``daemons``: ``sources.mps.SliceDaemons``, made
    from ``mps`` when not given), the answer makes the container its client
    (``core.allocation.mps.client_spec``), and a slice's daemon is let go once the kubelet's list no longer
    names its units (``sweep``, on each tick) or a later slice supersedes it; ``None``: the
    limit is only in the environment (``slices.slice_envs``). The slices' daemons asked for
    before a restart are found again on file.

    ``driver_major``: the NVIDIA driver's branch (``core.allocation.memory_limit.driver_major`` of the
    latest reading's ``nvmlSystemGetDriverVersion``); from r615 on the answer also carries the
    driver's per-container limit (``NVIDIA_GPU_MEMORY_LIMIT`` and ``_REQUEST``, the slice's MiB:
    ``core.allocation.memory_limit.slice_edits``), which the NVIDIA container toolkit's
    ``apply-cuda-memory-limits`` hook applies to the container's cgroup at its creation, for the
    sum of its processes, with or without MPS.

    ``counts`` maps a GPU UUID to its unit count (from its total memory; the servicer keeps it).
    ``slices`` maps a GPU UUID to the slices still counting there (oldest first). Thread-safe.
    """

    def __init__(
        self,
        unit_mib: int,
        *,
        policy: str = "binpack",
        settle_s: float = DEFAULT_SETTLE_S,
        clock: Callable[[], float] = time.monotonic,
        kubelet: KubeletView | None = None,
        enforcement: Enforcement | None = None,
    ) -> None:
        kubelet = kubelet or KubeletView()
        enforcement = enforcement or Enforcement()
        held, stamp = kubelet.held, kubelet.stamp
        mps, daemons, driver_major = enforcement.mps, enforcement.daemons, enforcement.driver_major
        if policy not in POLICIES:
            raise ValueError(f"expected a policy among {', '.join(POLICIES)}; got {policy!r}")
        self.unit_mib = unit_mib
        self.policy = policy
        self.settle_s = settle_s
        self._clock = clock
        self._held = held
        self._stamp = stamp
        self.mps = mps
        self._driver_major = driver_major
        if mps is not None and daemons is None:
            daemons = SliceDaemons(mps.layout, OWNER, mps.stale_s, timeout_s=mps.slice_wait_s)
        self.daemons = daemons if mps is not None else None
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.slices: dict[str, tuple[Slice, ...]] = {}
        #: slice ID -> its units and when a kubelet list can first name them (``clock``
        #: seconds; 0: any list, for the slices found on file after a restart)
        self.daemon_book: dict[str, tuple[frozenset[str], float]] = {}
        if self.daemons is not None:
            for sid, req in self.daemons.requests().items():
                self.daemon_book[sid] = (frozenset(req.holder.split(",")), 0.0)

    def pending_mib(self, gpus: Iterable[DeviceState], skip: frozenset[str] = frozenset()) -> dict[str, int]:
        """MiB handed out per GPU UUID that its reading does not show yet; slices the reading
        shows, older than ``settle_s``, or released by the kubelet (``held``; not on a GPU whose
        free memory is unknown: read with an error) are forgotten. ``skip``: the units of a slice being
        allocated; the slices it supersedes (``slices.superseded``: sharing a unit with it, as an
        app container reusing some or all of its init container's units) count no more."""
        now_s = self._clock()
        listed = self._held() if self._held is not None else None
        out: dict[str, int] = {}
        with self._lock:
            for g in gpus:
                held = self.slices.get(g.id)
                if not held:
                    continue
                if listed is not None and g.free_mib is not None:
                    # a GPU not read this tick keeps its slices (issue 38, fault 6): the list
                    # may leave out its units only because the agent could not read it
                    held = released(held, *listed)
                kept = still_pending(held, g.free_mib, now_s, self.settle_s)
                if kept:
                    self.slices[g.id] = kept
                else:
                    del self.slices[g.id]
                over = superseded(kept, skip)
                out[g.id] = sum(s.mib for s in kept if s not in over)
        return out

    def preferred(
        self,
        gpus: Sequence[DeviceState],
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
    ) -> list[str]:
        """The unit IDs to prefer for a slice of ``size`` units (``slices.preferred_units``)
        out of ``available``, given the GPU states ``gpus`` (``id`` the GPU UUID)."""
        candidates = rooms(gpus, self.pending_mib(gpus), available)
        ids = preferred_units(candidates, must_include, size, self.unit_mib, self.policy)
        logger.info(
            "device plugin: preferred {} units on {} of {} available (must include {})",
            len(ids), ",".join(gpus_of(ids)) or "no GPU", len(available), list(must_include)[:8],
        )
        return ids

    def allocate(self, ids: Sequence[str], gpus: Sequence[DeviceState],
                 booking: Booking | None = None) -> tuple[str, ClientSpec]:  # fmt: skip
        """Hand out the slice of unit IDs ``ids`` (known, healthy: the servicer checked): its
        GPU's UUID and what the container gets besides the GPU (``answer``); the slice then
        counts on that GPU, in place of the slices it supersedes (``slices.superseded``), both
        noted in ``booking`` when given. Raises ``SliceRefused`` when the units are on more than
        one GPU, or when the GPU's live free memory less the slices pending there cannot hold
        it."""
        on = gpus_of(ids)
        by_id = {g.id: g for g in gpus}
        if len(on) != 1:
            named = ", ".join(
                f"GPU {by_id[u].index} {u}" if u in by_id else u[:64] for u in on[:5]
            )
            raise SliceRefused(
                "INVALID_ARGUMENT",
                f"the {len(ids)} units span {len(on)} GPUs ({named}): a slice of "
                f"{self.unit_mib} MiB units comes from one GPU",
            )
        gpu = by_id[on[0]]
        units = frozenset(ids)
        mib = slice_mib(len(units), self.unit_mib)
        sid = slice_id(",".join(sorted(units)))
        pending = self.pending_mib([gpu], skip=units).get(gpu.id, 0)
        # the placement model's rule, on the one GPU the kubelet's units are on (they are
        # its units book: only the live memory less what is pending is asked here)
        if gpu.free_mib is not None and not fits_slice(
                GpuInfo(gpu.index, gpu.free_mib - pending, True), mib, self.unit_mib):  # fmt: skip
            raise SliceRefused(
                "FAILED_PRECONDITION",
                f"GPU {gpu.index} {gpu.id} has {gpu.free_mib} MiB free by its live reading, "
                f"{pending} MiB of it handed out to slices not in use yet: a slice of {mib} MiB "
                "does not fit",
            )
        if self.daemons is not None:
            self._ask_daemon(sid, units, gpu, mib)
        with self._lock:
            held_now = self.slices.get(gpu.id, ())
            over = superseded(held_now, units)
            held = [s for s in held_now if s not in over]
            now = self._stamp() if self._stamp is not None else None
            after = None if now is None else now + LIST_MARGIN_S
            added = Slice(units, gpu.id, mib, self._clock(), gpu.free_mib, after)
            held.append(added)
            self.slices[gpu.id] = tuple(held[-MAX_SLICES_PER_GPU:])
            if booking is not None:
                booking.added.append(added)
                booking.superseded.extend(over)
        for old in over:  # its container is done: its daemon goes (when it is not this one)
            self._let_go(slice_id(",".join(sorted(old.units))), keep=sid)
        return gpu.id, self.answer(gpu.id, len(units), sid)

    def _ask_daemon(self, sid: str, units: frozenset[str], gpu: DeviceState, mib: int) -> None:
        """Ask for slice ``sid``'s daemon and wait until it is up (``sources.mps.SliceDaemons``),
        booking it for ``sweep``. Raises ``SliceRefused`` (``FAILED_PRECONDITION``, with the
        reason) when it does not come up: fail closed, the container is never started without
        its daemon."""
        assert self.daemons is not None and self.mps is not None
        request = SliceRequest(
            sid=sid, gpu_uuid=gpu.id, gpu_index=gpu.index, mib=mib, owner=OWNER,
            holder=",".join(sorted(units)), threads_pct=self._threads(gpu.id, len(units)),
            at_s=time.time(),
        )  # fmt: skip
        try:
            self.daemons.ask(request)
        except (SliceUnavailable, OSError) as exc:
            with self._lock:
                self.daemon_book.pop(sid, None)
            raise SliceRefused(
                "FAILED_PRECONDITION",
                f"GPU {gpu.index} {gpu.id}: the MPS daemon of this {mib} MiB slice did not come "
                f"up: {exc}: the slice cannot be enforced",
            ) from None
        now = self._stamp() if self._stamp is not None else None
        with self._lock:
            self.daemon_book[sid] = (units, 0.0 if now is None else now + LIST_MARGIN_S)

    def _let_go(self, sid: str, keep: str = "") -> None:
        if self.daemons is None or sid == keep:
            return
        with self._lock:
            self.daemon_book.pop(sid, None)
        self.daemons.release(sid)

    def sweep(self) -> list[str]:
        """Let go of the daemons of the slices the kubelet no longer holds: a PodResources list
        (``held``) asked for at or after a slice could first be named, that names none of its
        units (the pod or container went). Returns the slice IDs let go; nothing when no list
        is known (the daemons stay: a slice's enforcement is never dropped on a guess)."""
        if self.daemons is None or self._held is None:
            return []
        listed = self._held()
        if listed is None:
            return []
        held, at_s = listed
        with self._lock:
            gone = [sid for sid, (units, after) in self.daemon_book.items()
                    if at_s >= after and not units & held]  # fmt: skip
        for sid in gone:
            self._let_go(sid)
            logger.info("device plugin: slice {}'s units are no longer held: its MPS daemon "
                        "is let go", sid)  # fmt: skip
        return gone

    def _threads(self, gpu_uuid: str, units: int) -> int | None:
        """The active-thread percentage of a slice of ``units`` units of ``gpu_uuid`` with the
        thread share on (of the GPU's ``counts``; count unknown: all), else ``None``."""
        if self.mps is None or not self.mps.thread_share:
            return None
        return thread_pct(units, self.counts.get(gpu_uuid) or units)

    def answer(self, gpu_uuid: str, units: int, sid: str) -> ClientSpec:
        """What a container given ``units`` units of ``gpu_uuid`` (the slice ``sid``) gets
        besides the GPU: under MPS, the client's environment and mounts
        (``core.allocation.mps.client_spec``: its slice daemon's pipe folder and shared memory, the
        pinned-memory limit of exactly the slice, and with the thread share its compute share
        of the GPU's ``counts``); else the limit in its environment only
        (``slices.slice_envs``); on a driver of r615 or newer, the driver's per-container limit
        too (see the class)."""
        mib = units * self.unit_mib
        major = self._driver_major() if self._driver_major is not None else None
        driver = dict(slice_edits(gpu_uuid, mib, major, name_hook=False).envs)
        if self.mps is None:
            return ClientSpec({**slice_envs(units, self.unit_mib), **driver}, ())
        spec = client_spec(self.mps.layout, sid, mib, threads_pct=self._threads(gpu_uuid, units))
        return ClientSpec({**spec.envs, **driver}, spec.mounts) if driver else spec

    def take_back(self, booking: Booking) -> None:
        """Undo ``booking`` (an ``Allocate`` refused after some of its containers were booked):
        its slices leave the book, and the slices they superseded count again, oldest first
        (unless the book forgot them meanwhile)."""
        added = {id(s) for s in booking.added}
        with self._lock:
            for gpu in {s.gpu for s in [*booking.added, *booking.superseded]}:
                kept = [s for s in self.slices.get(gpu, ()) if id(s) not in added]
                kept += [s for s in booking.superseded if s.gpu == gpu and s not in kept]
                kept.sort(key=lambda s: s.at_s)
                if kept:
                    self.slices[gpu] = tuple(kept)
                else:
                    self.slices.pop(gpu, None)
        booking.added.clear()
        booking.superseded.clear()

    def note_units(self, gpu_uuid: str, count: int) -> None:
        """Record a GPU's unit count (from its total memory); a count of 0 (total unknown)
        keeps the one known."""
        if count > 0:
            self.counts[gpu_uuid] = count

    def learn(self, unit_ids: Iterable[str]) -> dict[str, int]:
        """Record the unit counts that unit IDs known in advance (a trace's) imply; returns
        GPU UUID -> count."""
        found: dict[str, int] = {}
        for d in unit_ids:
            parsed = parse_unit_id(d)
            if parsed is not None:
                found[parsed[0]] = max(found.get(parsed[0], 0), parsed[1] + 1)
        for gpu, n in found.items():
            self.note_units(gpu, n)
        return found

"""The DRA plugin's slices of shared GPUs (``OMATICAYA_SHARED_GPUS``): the book of slices
prepared and not yet shown by the reading (``prepare.PendingSlice``, so that prepare refuses a
slice they leave no room for: ``prepare.live_room``), and, under MPS enforcement, each slice's
own MPS daemon (``sources.mps.SliceDaemons``), asked for at prepare and let go at unprepare."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from loguru import logger

from ..core.publish.dra import DraDevice
from ..sources.mps import SliceDaemons, SliceUnavailable
from .prepare import PendingSlice, PreparedClaim, claim_slice_id, slices_pending

__all__ = ["SliceBook", "SliceDaemonRequests"]


class SliceBook:
    """GPU UUID -> the slices prepared there that the reading does not show yet (oldest
    first), in ``slices``. ``lock`` is held by the caller from the look at them (``pending``)
    to the booking of a new one (``book``). Slices are stamped on ``clock`` (the agent's,
    seconds) and count until the reading shows them or ``settle_s`` seconds pass
    (``OMATICAYA_SHARE_SETTLE_S``; ``prepare.slices_pending``)."""

    def __init__(self, clock: Callable[[], float], settle_s: float) -> None:
        self.clock = clock
        self.settle_s = settle_s
        self.slices: dict[str, tuple[PendingSlice, ...]] = {}
        self.lock = threading.Lock()

    def pending(self, devices: Sequence[DraDevice]) -> dict[str, tuple[PendingSlice, ...]]:
        """GPU UUID -> the slices prepared there that still count against its free memory
        (``prepare.slices_pending`` at each shared device's ``free_memory_mib``, on the agent's
        clock); the book keeps only those. A GPU not in ``devices`` keeps its slices. Called
        under ``lock``."""
        now_s = float(self.clock())
        for d in devices:
            gpu = d.gpu_uuid or d.uuid
            if not d.shared or gpu is None or gpu not in self.slices:
                continue
            kept = slices_pending(self.slices[gpu], d.free_memory_mib, now_s, self.settle_s)
            if kept:
                self.slices[gpu] = kept
            else:
                del self.slices[gpu]
        return dict(self.slices)

    def book(self, prepared: PreparedClaim, devices: Sequence[DraDevice]) -> None:
        """Book the slices of ``prepared`` on their GPUs (at the free memory they were judged
        by), in place of any of the same claim's. Called under ``lock``."""
        known = {d.name: d for d in devices}
        now_s = float(self.clock())
        for p in prepared.devices:
            dev = known.get(p.device)
            gpu = (dev.gpu_uuid or dev.uuid) if dev is not None else None
            if p.mib is None or dev is None or gpu is None:
                continue
            kept = [s for s in self.slices.get(gpu, ()) if s.claim_uid != prepared.ref.uid]
            self.slices[gpu] = (*kept, PendingSlice(prepared.ref.uid, p.mib, now_s, dev.free_memory_mib))

    def unbook(self, claim_uid: str) -> None:
        """Take the claim's slices out of the book (unprepared, or never recorded)."""
        with self.lock:
            for gpu in list(self.slices):
                kept = tuple(s for s in self.slices[gpu] if s.claim_uid != claim_uid)
                if kept:
                    self.slices[gpu] = kept
                else:
                    del self.slices[gpu]


class SliceDaemonRequests:
    """The slices' own MPS daemons (``sources.mps.SliceDaemons``; ``None``: slices not enforced
    by MPS, nothing to do), held by claim (``claim:<uid>:...``, ``prepare.claim_slice_id``)."""

    def __init__(self, daemons: SliceDaemons | None) -> None:
        self.daemons = daemons

    def ask(self, prepared: PreparedClaim) -> str:
        """Ask for the MPS daemon of each slice of ``prepared`` and wait until it is up
        (``sources.mps.SliceDaemons.ask``): ``""``, or why one did not come up (those asked
        are let go again: fail closed, the container never starts without its daemon)."""
        if self.daemons is None:
            return ""
        asked: list[str] = []
        for d in prepared.devices:
            if d.daemon is None:
                continue
            try:
                self.daemons.ask(replace(d.daemon, at_s=time.time()))
            except (SliceUnavailable, OSError) as exc:
                for sid in asked:
                    self.daemons.release(sid)
                return (f"device {d.device}: the MPS daemon of its {d.mib} MiB slice did not "
                        f"come up: {exc}: the slice cannot be enforced")  # fmt: skip
            asked.append(d.daemon.sid)
        return ""

    def let_go(self, claim_uid: str, names: Iterable[object]) -> None:
        """Let go of the MPS daemons of ``claim_uid``'s slices (``names``: its devices' names;
        a device that is no slice has no request: nothing to do)."""
        if self.daemons is None:
            return
        for name in names:
            if isinstance(name, str):
                self.daemons.release(claim_slice_id(claim_uid, name))

    def sweep(self, held: Iterable[str]) -> None:
        """Let go of the daemons asked for by claims not in ``held`` (claim UIDs: those in the
        checkpoint; the others were unprepared while the plugin was down)."""
        if self.daemons is None:
            return
        held = set(held)
        for sid, req in self.daemons.requests().items():
            uid = req.holder.split(":")[1] if req.holder.startswith("claim:") else ""
            if uid not in held:
                self.daemons.release(sid)
                logger.info("DRA: the MPS daemon of slice {} ({}) let go: its claim is not "
                            "prepared here", sid, req.holder[:80])  # fmt: skip

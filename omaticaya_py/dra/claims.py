"""The claims the DRA plugin prepared on this node (as NVIDIA's driver keeps its device state):
each claim's CDI spec file in ``OMATICAYA_DRA_CDI_DIR`` (``prepare.cdi_file_name``) and its
entry in ``<plugin dir>/checkpoint.json`` (``host.Checkpoint``), written together and removed
together, with the slices of shared GPUs booked meanwhile (``sharing.SliceBook``) and their MPS
daemons (``sharing.SliceDaemonRequests``) let go at unprepare."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from ..core.publish.dra import DraDevice
from .host import Checkpoint, Entry, check_checkpointed, remove, write_atomic
from .metrics import DraCounts
from .prepare import (
    ClaimRef,
    PreparedClaim,
    Refused,
    cdi_file_name,
    cdi_spec,
    spec_bytes,
)
from .sharing import SliceBook, SliceDaemonRequests

__all__ = ["ClaimState"]

#: the node's devices now, or ``(None, why)`` (``plugin.DraPlugin.devices``)
DevicesNow = Callable[[], tuple[list[DraDevice] | None, str]]


class ClaimState:
    """The prepared claims: ``checkpoint`` (``host.Checkpoint`` in ``plugin_dir``) and the CDI
    specs in ``cdi_dir``, under ``lock`` (each method takes it); the slices booked for them
    (``book``) and their daemons (``daemons``); ``counts``: the prepare/unprepare counters
    (``metrics.DraCounts``)."""

    def __init__(self, plugin_dir: Path, cdi_dir: Path, counts: DraCounts, book: SliceBook,
                 daemons: SliceDaemonRequests) -> None:  # fmt: skip
        self.checkpoint = Checkpoint(plugin_dir)
        self.cdi_dir = Path(cdi_dir)
        self.counts = counts
        self.book = book
        self.daemons = daemons
        self.lock = threading.Lock()

    def load(self) -> None:
        """Read the checkpoint (``Checkpoint.load``) and let go of the daemons of claims it does
        not hold (unprepared while the plugin was down)."""
        with self.lock:
            self.checkpoint.load()
            self.daemons.sweep(self.checkpoint.claims)

    def device_names(self) -> set[str]:
        """The names of the devices prepared for some claim."""
        with self.lock:
            return {str(d["device_name"]) for e in self.checkpoint.claims.values() for d in e.devices}

    def repeat(self, ref: ClaimRef, now: DevicesNow) -> tuple[list[dict[str, Any]], str] | None:
        """The answer for a claim already in the checkpoint, ``None`` for one that is not: its
        devices once checked to be the same GPUs ``now`` (``host.check_checkpointed``: a GPU
        gone or another one under the name fails the claim with that reason and rewrites no CDI
        spec; its CDI file is written again if it went), or ``([], error)``."""
        with self.lock:
            entry = self.checkpoint.claims.get(ref.uid)
            if entry is None:
                return None
            if entry.devices:
                devices, why = now()
                try:
                    check_checkpointed(entry.devices, devices, why)
                except Refused as exc:
                    self.counts.prepare["refused"] += 1
                    logger.warning("DRA: prepared claim {}/{} ({}) refused: {}", ref.namespace,
                                   ref.name, ref.uid, exc)  # fmt: skip
                    return [], str(exc)
            try:
                self._ensure_file(entry)
            except OSError as exc:
                self.counts.prepare["failed"] += 1
                return [], f"cannot write the CDI spec of claim {ref.uid}: {exc}"
            self.counts.prepare["repeated"] += 1
            return [dict(d) for d in entry.devices], ""

    def record(self, prepared: PreparedClaim) -> tuple[list[dict[str, Any]], str]:
        """Record a claim decided and booked: its CDI file and checkpoint entry (a claim
        recorded meanwhile is answered as recorded). On failure its slices and daemons are let
        go: ``([], error)``."""
        ref = prepared.ref
        with self.lock:
            entry = self.checkpoint.claims.get(ref.uid)
            if entry is None:
                try:
                    entry = self._write(prepared)
                except OSError as exc:
                    self.book.unbook(ref.uid)
                    self.daemons.let_go(ref.uid, [d.device for d in prepared.devices])
                    self.counts.prepare["failed"] += 1
                    logger.error("DRA: claim {} not prepared: {}", ref.uid, exc)
                    return [], f"cannot record claim {ref.uid}: {exc}"
                self.counts.prepare["prepared"] += 1
                logger.info("DRA: prepared claim {}/{} ({}): {}", ref.namespace, ref.name,
                            ref.uid, ", ".join(d.device for d in prepared.devices) or "no device")  # fmt: skip
            else:
                self.counts.prepare["repeated"] += 1
            return [dict(d) for d in entry.devices], ""

    def _write(self, prepared: PreparedClaim) -> Entry:
        """Write the claim's CDI file and its checkpoint entry; undo both on failure. Raises
        ``OSError``."""
        ref = prepared.ref
        devices = tuple(
            {"request_names": list(d.request_names), "pool_name": d.pool, "device_name": d.device,
             "cdi_device_ids": [d.cdi_id], "uuid": d.uuid,
             **({"share_id": d.share_id} if d.share_id else {})}
            for d in prepared.devices
        )  # fmt: skip
        spec = cdi_spec(prepared) if prepared.devices else None
        entry = Entry(ref.namespace, ref.name, devices, spec,
                      cdi_file_name(ref.uid) if spec is not None else None)  # fmt: skip
        path = self.cdi_dir / entry.cdi_file if entry.cdi_file else None
        try:
            if path is not None and spec is not None:
                write_atomic(path, spec_bytes(spec))
            self.checkpoint.claims[ref.uid] = entry
            self.checkpoint.save()
        except OSError:
            self.checkpoint.claims.pop(ref.uid, None)
            if path is not None:
                try:
                    remove(path)
                except OSError:
                    pass
            raise
        return entry

    def _ensure_file(self, entry: Entry) -> None:
        if entry.cdi_file and entry.spec is not None:
            path = self.cdi_dir / entry.cdi_file
            if not path.exists():
                logger.warning("DRA: CDI spec {} went missing: written again", path)
                write_atomic(path, spec_bytes(entry.spec))

    def unprepare(self, ref: ClaimRef) -> str:
        """Remove the claim's CDI file and checkpoint entry, its slices from the book and let go
        of their daemons: ``""`` (a claim not prepared here too: its CDI file is removed if one
        was left), else the error. Raises nothing but the unexpected."""
        with self.lock:
            entry = self.checkpoint.claims.get(ref.uid)
            try:
                remove(self.cdi_dir / cdi_file_name(ref.uid))
                if entry is not None and entry.cdi_file:
                    remove(self.cdi_dir / entry.cdi_file)
            except OSError as exc:
                self.counts.unprepare["failed"] += 1
                return f"cannot remove the CDI spec of claim {ref.uid}: {exc}"
            if entry is None:
                self.book.unbook(ref.uid)
                self.counts.unprepare["unknown"] += 1
                return ""
            self.daemons.let_go(ref.uid, [d.get("device_name") for d in entry.devices])
            del self.checkpoint.claims[ref.uid]
            try:
                self.checkpoint.save()
            except OSError as exc:
                self.checkpoint.claims[ref.uid] = entry
                self.counts.unprepare["failed"] += 1
                return f"cannot update the checkpoint: {exc}"
            self.book.unbook(ref.uid)
            self.counts.unprepare["unprepared"] += 1
            logger.info("DRA: unprepared claim {}/{} ({})", ref.namespace, ref.name, ref.uid)
            return ""

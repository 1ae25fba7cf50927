"""Seed a new agent's Xid window from the Node's own telemetry: the Xids NVML will not replay.

NVML delivers an Xid event once, to the session that waits for it: an agent that restarts
(rolling update, OOM kill) would find a GPU Unhealthy for ``xid-74`` Healthy again at its first
tick. The last agent published each GPU's fatal Xids with their times (``GpuTelemetry.xids``);
``seed_events`` turns them into ``XidEvent``s on the new reader's clock, so that the quiet
window runs on from the original event.

The annotation is untrusted (anyone who may patch the Node can write it). Per GPU entry, all or
nothing:

- only entries whose ``uuid`` is a GPU of the current reading are used (a GPU swapped out, or
  indices that shifted, seed nothing); an entry whose ``uuid`` appears twice is refused;
- an ``xid-N`` reason needs its time in ``xids``; an ``xids`` entry needs its ``xid-N`` reason;
  a document from an agent before ``xids`` existed (no ``xids`` key) dates its reasons at its
  ``read_at`` (no earlier than the event: the window errs long, the safe way);
- a time more than ``MAX_AHEAD_S`` after the current reading is refused; up to that far ahead
  (a small step of the wall clock between the two agents) it counts as now;
- more than ``MAX_XIDS_PER_GPU`` entries on one GPU is refused.

A refused entry seeds nothing for that GPU and is named in ``XidSeed.refused``; a document that
cannot be read at all refuses everything. Which codes count is the policy's business
(``XidLedger.seed`` keeps the fatal ones).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from ..model.snapshot import NodeSnapshot, XidEvent
from ..schema import Telemetry
from ..schema.telemetry import XidTelemetry

__all__ = ["MAX_AHEAD_S", "MAX_XIDS_PER_GPU", "XidSeed", "seed_events"]

#: a seed time at most this far after the current reading is taken as now; further, refused
MAX_AHEAD_S = 60.0
#: more Xid entries than this on one GPU is not what an agent writes
MAX_XIDS_PER_GPU = 64

_REASON = re.compile(r"^xid-(\d{1,6})$")


@dataclass(frozen=True, slots=True)
class XidSeed:
    """What the telemetry seeds: ``events`` (on the current reader's clock, matched to the
    current GPU by UUID) and ``refused`` (one line per GPU entry or document refused)."""

    events: tuple[XidEvent, ...] = ()
    refused: tuple[str, ...] = ()


def seed_events(raw: object, snapshot: NodeSnapshot, *, max_ahead_s: float = MAX_AHEAD_S) -> XidSeed:
    """The Xid events the telemetry annotation value ``raw`` (a string, or ``None`` when the
    Node has none) still holds for the GPUs of ``snapshot`` (the new agent's first good
    reading: its ``read_at`` and ``clock_s`` place the wall-clock times on the reader's clock).
    Never raises; see the module docstring for what is refused."""
    if raw is None:
        return XidSeed()
    doc, problem = Telemetry.parse(raw)
    if doc is None:
        return XidSeed(refused=(problem or "unreadable telemetry annotation",))
    now_wall_s = snapshot.read_at.timestamp()
    current = {g.uuid: g for g in snapshot.gpus if g.uuid and g.error is None}
    seen = Counter(g.uuid for g in doc.gpus if g.uuid)
    events: list[XidEvent] = []
    refused: list[str] = []
    for entry in doc.gpus:
        reasons = {int(m.group(1)) for r in entry.reasons if (m := _REASON.match(r))}
        if not entry.uuid or entry.uuid not in current or not (reasons or entry.xids):
            continue  # nothing to seed for a GPU not read now (or with no Xid)
        if seen[entry.uuid] < 0:
            continue  # a second entry of a GPU refused already
        name = f"GPU {entry.uuid[:64]}"
        if seen[entry.uuid] > 1:  # said once for all its entries
            refused.append(f"{name}: listed {seen[entry.uuid]} times")
            seen[entry.uuid] = -1
            continue
        times, problem = _times(entry.xids, reasons, doc.read_at_s)
        if problem is not None:
            refused.append(f"{name}: {problem}")
            continue
        if any(t - now_wall_s > max_ahead_s for t in times.values()):
            refused.append(f"{name}: an Xid time more than {max_ahead_s:g}s in the future")
            continue
        g = current[entry.uuid]
        events.extend(
            XidEvent(
                index=g.index,
                xid=code,
                at_s=snapshot.clock_s - max(now_wall_s - t, 0.0),
                uuid=g.uuid,
            )
            for code, t in sorted(times.items())
        )
    return XidSeed(tuple(events), tuple(refused))


def _times(
    xids: tuple[XidTelemetry, ...] | None, reasons: set[int], read_at_s: float | None
) -> tuple[dict[int, float], str | None]:
    """``({xid: epoch seconds}, None)`` for one GPU entry, or ``({}, problem)``."""
    if xids is None:  # an agent before xids were published: date the reasons at read_at
        if read_at_s is None:
            return {}, "xid reasons without a readable read_at"
        return dict.fromkeys(reasons, read_at_s), None
    if len(xids) > MAX_XIDS_PER_GPU:
        return {}, f"{len(xids)} Xid entries (at most {MAX_XIDS_PER_GPU})"
    times: dict[int, float] = {}
    for x in xids:
        at_s = x.at_s
        if at_s is None:
            return {}, f"xid {x.xid}: no readable time"
        if x.xid in times:
            return {}, f"xid {x.xid} listed twice"
        times[x.xid] = at_s
    if set(times) != reasons:
        return {}, (
            f"xid times {sorted(times)} do not match the reasons {sorted(reasons)}"
        )
    return times, None

"""The files the MPS supervisor and the plugins exchange (``core.allocation.mps`` says where
and why): a plugin's request for a slice's daemon (``SliceRequest``, written by
``request_json``, read back by ``parse_request``) and the supervisor's state of each daemon
(``DaemonState``: ``state_json``, ``parse_state``), and the rule of whether a GPU or a slice is
enforced now by that state (``enforced``: fail closed).

Every file is untrusted when read back: its size bounded, each field checked, a ``ValueError``
naming what is wrong.

Pure: no I/O but what the callers pass in (the supervisor writes, the device plugin reads).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "DOWN",
    "MAX_STATE_BYTES",
    "MISSING",
    "STALE",
    "STARTING",
    "SUPERVISOR_GONE",
    "UNREADABLE",
    "UP",
    "UUID_RE",
    "DaemonState",
    "SliceRequest",
    "enforced",
    "parse_request",
    "parse_state",
    "request_json",
    "state_json",
]

#: a daemon's states, as the supervisor writes them
UP = "up"
STARTING = "starting"
DOWN = "down"
#: and as the device plugin reads them when the file does not say "up" in time
MISSING = "mps-state-missing"
UNREADABLE = "mps-state-unreadable"
STALE = "mps-state-stale"
#: and when no supervisor holds its lock (``Layout.lock``): it died or never ran
SUPERVISOR_GONE = "mps-supervisor-gone"

#: a GPU's or a MIG device's UUID, as NVML gives it
UUID_RE = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{1,80}$")
#: at most this many bytes of a state file are read (it is a few hundred)
MAX_STATE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class SliceRequest:
    """A plugin's request for a slice's MPS daemon (``<state dir>/slices/<sid>.json``): slice
    ``sid`` (``slice_id``), of ``mib`` MiB (the daemon's default pinned-memory limit) on GPU
    ``gpu_uuid`` (NVML ``gpu_index`` when it was asked), with ``threads_pct`` (the daemon's
    default active-thread percentage; ``None``: all), asked by ``owner`` (``device-plugin`` or
    ``dra``) for ``holder`` (unit IDs or ``claim:<uid>:<device>``: what ``sid`` was made from,
    at most 4 KiB) at ``at_s`` (wall-clock seconds)."""

    sid: str
    gpu_uuid: str
    gpu_index: int
    mib: int
    owner: str
    holder: str = ""
    threads_pct: int | None = None
    at_s: float = 0.0


def request_json(req: SliceRequest) -> str:
    """``req`` as its file's JSON (one object, keys sorted)."""
    return json.dumps(
        {
            "sid": req.sid, "gpu_uuid": req.gpu_uuid, "gpu_index": req.gpu_index,
            "mib": req.mib, "owner": req.owner, "holder": req.holder,
            "threads_pct": req.threads_pct, "at_s": req.at_s,
        },
        sort_keys=True,
    )  # fmt: skip


def parse_request(raw: bytes | str, sid: str) -> SliceRequest:
    """The request file of slice ``sid``, checked: ``request_json``'s keys, for that slice, a
    GPU UUID, at least 1 MiB, a thread percentage of 1 to 100 or none. Raises ``ValueError``
    naming what is wrong (the supervisor skips and counts it)."""
    if len(raw) > MAX_STATE_BYTES * 2:
        raise ValueError(f"over {MAX_STATE_BYTES * 2} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if doc.get("sid") != sid:
        raise ValueError(f"the request of {str(doc.get('sid'))[:32]!r}, not of {sid}")
    uuid = doc.get("gpu_uuid")
    if not isinstance(uuid, str) or not UUID_RE.match(uuid) or not uuid.startswith("GPU-"):
        raise ValueError(f"gpu_uuid: expected a GPU UUID; got {str(uuid)[:64]!r}")
    mib = _int(doc, "mib") or 0
    if mib < 1:
        raise ValueError("mib: expected at least 1")
    threads = _int(doc, "threads_pct", optional=True)
    if threads is not None and not 1 <= threads <= 100:
        raise ValueError(f"threads_pct: expected 1 to 100; got {threads}")
    owner, holder = doc.get("owner"), doc.get("holder", "")
    if not isinstance(owner, str) or not isinstance(holder, str):
        raise ValueError("owner, holder: expected strings")
    return SliceRequest(
        sid=sid, gpu_uuid=uuid, gpu_index=_int(doc, "gpu_index") or 0, mib=mib,
        owner=owner[:32], holder=holder[:4096], threads_pct=threads,
        at_s=_seconds(doc, "at_s"),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class DaemonState:
    """One daemon as the supervisor last saw it: GPU ``uuid`` and ``index``; ``state``
    (``UP``: it answers its control socket, configured; ``STARTING``; ``DOWN``, with
    ``reason``); its ``pid``; the default pinned-memory ``limit_mib`` it was given; how many
    times it was (re)started (``starts``); ``heartbeat_s`` (wall-clock seconds of the check
    that wrote it) and ``since_s`` (of the last change of ``state``). ``sid``: the slice
    whose daemon it is (``""``: the GPU's probe daemon)."""

    uuid: str
    index: int
    state: Literal["up", "starting", "down"]
    reason: str = ""
    pid: int | None = None
    limit_mib: int | None = None
    starts: int = 0
    heartbeat_s: float = 0.0
    since_s: float = 0.0
    sid: str = ""


def state_json(state: DaemonState) -> str:
    """``state`` as its file's JSON (one object, keys sorted)."""
    return json.dumps(
        {
            "uuid": state.uuid, "index": state.index, "state": state.state,
            "reason": state.reason, "pid": state.pid, "limit_mib": state.limit_mib,
            "starts": state.starts, "heartbeat_s": state.heartbeat_s, "since_s": state.since_s,
            "sid": state.sid,
        },
        sort_keys=True,
    )  # fmt: skip


def _int(doc: Mapping[str, Any], key: str, *, optional: bool = False) -> int | None:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key}: expected a non-negative integer; got {str(value)[:32]!r}")
    return value


def _seconds(doc: Mapping[str, Any], key: str) -> float:
    value = doc.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{key}: expected seconds; got {str(value)[:32]!r}")
    return float(value)


def parse_state(raw: bytes | str, uuid: str, sid: str = "") -> DaemonState:
    """The state file of ``uuid``'s daemon (``sid``: of that slice's daemon on it; ``uuid``
    ``""``: any GPU's), checked: a JSON object with the keys ``state_json`` writes, for that GPU
    and slice. Raises ``ValueError`` naming what is wrong (too long, not JSON, another GPU's or
    slice's, a bad field): the caller counts it as unreadable."""
    if len(raw) > MAX_STATE_BYTES:
        raise ValueError(f"over {MAX_STATE_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if uuid and doc.get("uuid") != uuid:
        raise ValueError(f"the state of {str(doc.get('uuid'))[:64]!r}, not of {uuid}")
    if not isinstance(doc.get("uuid"), str) or not UUID_RE.match(doc["uuid"]):
        raise ValueError(f"uuid: expected a GPU UUID; got {str(doc.get('uuid'))[:64]!r}")
    if doc.get("sid", "") != sid:
        raise ValueError(f"the state of slice {str(doc.get('sid'))[:32]!r}, not of {sid!r}")
    state = doc.get("state")
    if state not in (UP, STARTING, DOWN):
        raise ValueError(f"state: expected up, starting or down; got {str(state)[:32]!r}")
    reason = doc.get("reason", "")
    if not isinstance(reason, str):
        raise ValueError("reason: expected a string")
    return DaemonState(
        uuid=doc["uuid"], index=_int(doc, "index") or 0, state=state, reason=reason[:256],
        pid=_int(doc, "pid", optional=True), limit_mib=_int(doc, "limit_mib", optional=True),
        starts=_int(doc, "starts") or 0, heartbeat_s=_seconds(doc, "heartbeat_s"),
        since_s=_seconds(doc, "since_s"), sid=sid,
    )  # fmt: skip


def enforced(state: DaemonState | None, now_s: float, stale_after_s: float, *,
             problem: str | None = None, supervisor_gone: bool = False) -> tuple[bool, str]:  # fmt: skip
    """Whether a shared GPU (or a slice) is enforced now, and if not why (a health reason): no
    supervisor holds its lock (``supervisor_gone``: ``SUPERVISOR_GONE`` at once, whatever the
    file says); else its daemon's ``state`` (``None``: no file, or ``problem`` says why it could
    not be read) says ``UP`` with a heartbeat at most ``stale_after_s`` seconds before
    ``now_s`` (wall clock, the supervisor's and ours: one host). A heartbeat from the future by
    more than that bound is stale too (a clock stepped back)."""
    if supervisor_gone:
        return False, SUPERVISOR_GONE
    if state is None:
        return False, UNREADABLE if problem else MISSING
    if abs(now_s - state.heartbeat_s) > stale_after_s:
        return False, STALE
    if state.state != UP:
        return False, "mps-daemon-starting" if state.state == STARTING else "mps-daemon-down"
    return True, ""

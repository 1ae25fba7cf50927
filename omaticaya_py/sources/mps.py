"""The MPS supervisor's daemon states, read from its state folder (``core.allocation.mps``: the file format,
the layout and the rule that says whether a shared GPU is enforced), and the slices' daemons
asked for there.

``MpsWatch`` is what the device plugin and the agent ask: for each shared GPU UUID, whether its
MPS probe daemon is up now (``enforced``), with the reason when not. Files are read at most
once per ``min_interval_s`` per GPU (a ``ListAndWatch`` stream looks every 0.2 s); an unreadable
file is logged once per GPU and counted (``errors``), and counts as down. A supervisor that
died is seen at the next read, not once its heartbeats go stale: its lock file is there but no
process holds its ``flock`` (``supervisor_gone``).

``SliceDaemons`` is how a plugin gets a slice's daemon: ``ask`` writes the request and waits
(at most its timeout) for the daemon's state to say ``up``; ``release`` removes the request
(the supervisor then stops the daemon); ``requests`` lists a plugin's own requests on file (to
find them again after a restart).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from ..core.allocation.mps import (
    DaemonState,
    Layout,
    SliceRequest,
    enforced,
    parse_request,
    parse_state,
    request_json,
)
from ..core.model.sayonce import SayOnce
from .files import write_atomic

__all__ = ["Enforcement", "MpsWatch", "SliceDaemons", "SliceUnavailable", "read_state",
           "supervisor_gone"]  # fmt: skip


def supervisor_gone(layout: Layout) -> bool:
    """Whether the supervisor died: its lock file (``Layout.lock``) is there, and nobody holds
    its ``flock`` (a shared lock can be taken: taken and let go at once). No lock file: ``False``
    (none ran, or one stopped cleanly and removed its states too: the states say the rest)."""
    try:
        fd = os.open(layout.lock, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False  # held: the supervisor runs
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    finally:
        os.close(fd)


def read_state(layout: Layout, uuid: str) -> tuple[DaemonState | None, str | None]:
    """The state file of ``uuid``'s daemon (``core.allocation.mps.Layout.state``), parsed: ``(state,
    None)``; ``(None, None)`` when there is no file; ``(None, problem)`` when it cannot be read
    or is not a state of that GPU (``core.allocation.mps.parse_state``)."""
    return _read(layout.state(uuid), uuid, "")


def _read(path: Path, uuid: str, sid: str) -> tuple[DaemonState | None, str | None]:
    """The state file at ``path`` parsed for GPU ``uuid`` (``""``: any) and slice ``sid``, as
    ``read_state`` answers."""
    try:
        with open(path, "rb") as f:
            raw = f.read(64 * 1024)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{type(exc).__name__}: {exc.strerror or exc}"
    try:
        return parse_state(raw, uuid, sid), None
    except ValueError as exc:
        return None, str(exc)


@dataclass(frozen=True, slots=True)
class Enforcement:
    """One shared GPU's enforcement now: ``up`` (its daemon answers and its heartbeat is fresh),
    else ``reason`` (a health reason: ``mps-daemon-down``, ``mps-daemon-starting``,
    ``mps-state-missing``, ``mps-state-unreadable``, ``mps-state-stale``); ``state``: the file
    as read (``None``: none could be)."""

    up: bool
    reason: str
    state: DaemonState | None = None


class MpsWatch:
    """The MPS daemons' states under ``layout`` (``core.allocation.mps.Layout``): ``enforcement(uuid)`` per
    shared GPU, from its state file, re-read at most every ``min_interval_s`` seconds (on
    ``monotonic``), judged against ``stale_after_s`` on ``wall`` (the supervisor's clock:
    ``time.time``). ``errors`` counts unreadable state files. Thread-safe."""

    def __init__(self, layout: Layout, stale_after_s: float, *, min_interval_s: float = 1.0,
                 wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.layout = layout
        self.stale_after_s = stale_after_s
        self.min_interval_s = min_interval_s
        self._wall = wall
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, Enforcement]] = {}
        self._said: SayOnce[str, str] = SayOnce()
        self.errors = 0

    def enforcement(self, uuid: str) -> Enforcement:
        """``uuid``'s enforcement now (see ``Enforcement``); a UUID that cannot name a file is
        never enforced."""
        now = self._monotonic()
        with self._lock:
            cached = self._cache.get(uuid)
            if cached is not None and now - cached[0] < self.min_interval_s:
                return cached[1]
            try:
                state, problem = read_state(self.layout, uuid)
            except ValueError as exc:  # not a GPU UUID
                state, problem = None, str(exc)
            if problem is not None:
                self.errors += 1
            up, reason = enforced(state, self._wall(), self.stale_after_s, problem=problem,
                                  supervisor_gone=supervisor_gone(self.layout))  # fmt: skip
            result = Enforcement(up, reason, state)
            self._cache[uuid] = (now, result)
            self._log(uuid, result, problem)
            return result

    def all(self, uuids: Iterable[str]) -> dict[str, Enforcement]:
        """``enforcement`` of each of ``uuids``."""
        return {u: self.enforcement(u) for u in uuids}

    def _log(self, uuid: str, result: Enforcement, problem: str | None) -> None:
        if result.up:
            if self._said.end(uuid) is not None:
                logger.info("MPS: the daemon of GPU {} is up: its slices are enforced again", uuid)
        elif self._said.start(uuid, result.reason):
            logger.warning(
                "MPS: the daemon of GPU {} is not up ({}{}): its slices are not enforced (the "
                "device plugin serves none of its units) until it is",
                uuid,
                result.reason,
                f": {problem}" if problem else "",
            )


class SliceUnavailable(Exception):
    """A slice's daemon did not come up: ``str()`` says why (its state's reason, or the wait
    that ran out)."""


class SliceDaemons:
    """A plugin's slices' daemons under ``layout``, asked for as ``owner`` (``device-plugin``,
    ``dra``): ``ask`` waits at most ``timeout_s`` seconds for a daemon, looking every
    ``poll_s``; a state is fresh within ``stale_after_s`` seconds of ``wall``. Thread-safe (one
    file per slice)."""

    def __init__(self, layout: Layout, owner: str, stale_after_s: float, *,
                 timeout_s: float = 10.0, poll_s: float = 0.02,
                 wall: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.layout = layout
        self.owner = owner
        self.stale_after_s = stale_after_s
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._wall = wall

    def ask(self, request: SliceRequest) -> DaemonState:
        """Write ``request`` (atomically, fsynced: it must outlive a crash of either side) and
        wait until its daemon's state says ``up`` with a fresh heartbeat (and the supervisor
        runs): that state. Raises ``SliceUnavailable`` when the supervisor is gone, the daemon
        is ``down`` after its first start, or ``timeout_s`` runs out (the request is removed
        then: nothing is left asking), ``OSError`` when the request cannot be written."""
        path = self.layout.request(request.sid)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, (request_json(request) + "\n").encode())
        deadline = time.monotonic() + self.timeout_s
        why = "no state yet"
        while True:
            state, problem = read_slice_state(self.layout, request.sid)
            if supervisor_gone(self.layout):
                why = "the MPS supervisor is not running (mps-supervisor-gone)"
            elif state is not None:
                up, reason = enforced(state, self._wall(), self.stale_after_s)
                if up and state.limit_mib == request.mib:
                    return state
                if state.state == "down" and state.starts >= 1 or state.reason.startswith(
                        ("unknown-gpu", "unreadable")):  # fmt: skip
                    why = f"{reason}: {state.reason}" if state.reason else reason
                    self.release(request.sid)
                    raise SliceUnavailable(why)
                why = reason if not up else f"limit {state.limit_mib} MiB, not {request.mib}"
            elif problem:
                why = problem
            if time.monotonic() >= deadline:
                self.release(request.sid)
                if state is None and problem is None:  # nobody answered the request at all
                    why += ("; is the MPS supervisor older than the agent? one from before "
                            "per-slice daemons answers no request: roll its pods (docs/chart.md)")
                raise SliceUnavailable(f"its MPS daemon is not up after {self.timeout_s:g}s ({why})")
            time.sleep(self.poll_s)

    def up(self, sid: str) -> tuple[bool, str]:
        """Whether slice ``sid``'s daemon is up now (fresh, supervisor running), and if not
        why."""
        state, problem = read_slice_state(self.layout, sid)
        return enforced(state, self._wall(), self.stale_after_s, problem=problem,
                        supervisor_gone=supervisor_gone(self.layout))  # fmt: skip

    def release(self, sid: str) -> None:
        """Remove slice ``sid``'s request (the supervisor stops its daemon). Never raises for
        one already gone."""
        with contextlib.suppress(FileNotFoundError, ValueError):
            os.unlink(self.layout.request(sid))

    def requests(self) -> dict[str, SliceRequest]:
        """This owner's requests on file, by slice ID (unreadable ones skipped)."""
        out: dict[str, SliceRequest] = {}
        try:
            names = [e.name for e in os.scandir(self.layout.requests_dir)]
        except OSError:
            return out
        for name in names:
            if not name.endswith(".json") or name.endswith(".state.json"):
                continue
            sid = name[: -len(".json")]
            try:
                with open(self.layout.request(sid), "rb") as f:
                    req = parse_request(f.read(16 * 1024), sid)
            except (OSError, ValueError):
                continue
            if req.owner == self.owner:
                out[sid] = req
        return out


def read_slice_state(layout: Layout, sid: str) -> tuple[DaemonState | None, str | None]:
    """Slice ``sid``'s daemon state file, parsed: as ``read_state`` answers (an ID that names no
    file: ``(None, problem)``)."""
    try:
        path = layout.slice_state(sid)
    except ValueError as exc:
        return None, f"ValueError: {exc}"
    return _read(path, "", sid)


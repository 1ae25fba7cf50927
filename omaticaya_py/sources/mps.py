"""The MPS supervisor's daemon states, read from its state folder (``core.mps``: the file format,
the layout and the rule that says whether a shared GPU is enforced).

``MpsWatch`` is what the device plugin and the agent ask: for each shared GPU UUID, whether its
MPS control daemon is up now (``enforced``), with the reason when not. Files are read at most
once per ``min_interval_s`` per GPU (a ``ListAndWatch`` stream looks every 0.2 s); an unreadable
file is logged once per GPU and counted (``errors``), and counts as down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from loguru import logger

from ..core.mps import DaemonState, Layout, enforced, parse_state
from ..core.sayonce import SayOnce

__all__ = ["Enforcement", "MpsWatch", "read_state"]


def read_state(layout: Layout, uuid: str) -> tuple[DaemonState | None, str | None]:
    """The state file of ``uuid``'s daemon (``core.mps.Layout.state``), parsed: ``(state,
    None)``; ``(None, None)`` when there is no file; ``(None, problem)`` when it cannot be read
    or is not a state of that GPU (``core.mps.parse_state``)."""
    path = layout.state(uuid)
    try:
        with open(path, "rb") as f:
            raw = f.read(64 * 1024)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{type(exc).__name__}: {exc.strerror or exc}"
    try:
        return parse_state(raw, uuid), None
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
    """The MPS daemons' states under ``layout`` (``core.mps.Layout``): ``enforcement(uuid)`` per
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
            up, reason = enforced(state, self._wall(), self.stale_after_s, problem=problem)
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

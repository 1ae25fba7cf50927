"""The agent's shared state: the last tick's result (``core.publish.readings.TickResult``), where the tick in flight is, and the
counters ``/metrics`` reads."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import Histogram

from ..core.publish.readings import TickResult

__all__ = ["AgentStopping", "Runner", "SnapshotCache"]


class AgentStopping(RuntimeError):
    """``tick()`` was called after ``stop()``: nothing is read or written any more."""


class Runner(Protocol):
    """What runs an agent on its schedule (``agent.daemon.Daemon``), as the probes see it."""

    @property
    def running(self) -> bool:
        """True while the schedule runs."""
        ...

    @property
    def watchdog(self) -> Any:
        """The watchdog thread (``agent.watchdog.Watchdog``), or ``None`` before the start."""
        ...


#: the snapshot error of a read that found no NVML library in the container (pynvml's class
#: name for NVML_ERROR_LIBRARY_NOT_FOUND): nvmlInit again cannot help, a new container can
LIBRARY_NOT_FOUND = "NVMLError_LibraryNotFound"


class SnapshotCache:
    """The last tick's results and the times of the last good read and patch.

    Written by the tick thread and the API writer thread, read by ``/metrics``, the probes and
    the device plugin; each attribute is replaced whole, so readers never see a half-written
    value. Times are on ``clock`` (the agent's: ``time.monotonic()`` seconds), except
    ``last_patch_wall_s`` and ``tick_started_wall_s`` (Unix time).

    Tick liveness (``/healthz``, the device plugin): ``last_tick_done_s`` is when the last
    tick's read path (read, assess, render, listeners) finished, ``tick_stage`` and
    ``tick_started_s`` say where the tick in flight is (``None``: none in flight), and
    ``tick_overdue()`` is True once no tick finished for ``stuck_after_s`` (the agent sets it to
    ``stuck_tick_periods`` schedule periods plus the jitter).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.last: TickResult | None = None
        #: when the agent started, or last tick's read path finished (agent clock, seconds)
        self.started_s: float = clock()
        self.last_tick_done_s: float | None = None
        self.tick_stage: str | None = None
        self.tick_started_s: float | None = None
        self.tick_started_wall_s: float | None = None
        self.stuck_after_s: float = float("inf")
        self.writes_superseded = 0  # API rounds a newer reading replaced before they started
        self.last_read_ok_s: float | None = None
        #: since when (agent clock) every read found no NVML library in this container
        #: (``NVMLError_LibraryNotFound``); ``None`` while the last read found one
        self.library_missing_since_s: float | None = None
        self.last_api_ok_s: float | None = None
        self.last_patch_wall_s: float | None = None
        self.patches_sent = 0
        self.patches_held = 0  # ticks whose patch the write budget held back
        #: the DRA ResourceSlice (``agent.resourceslice_writer``): applies sent, ticks whose changes for
        #: the better the write budget held back, requests that failed
        self.slice_writes = 0
        self.slice_held = 0
        self.slice_errors = 0
        self.lease_renewals = 0
        self.lease_failures = 0
        self.lease_fallbacks = 0  # 403 on the Lease: heartbeat back on the Node annotation
        self.labels_changed = 0
        self.ticks = 0
        self.tick_errors = 0
        self.tick_seconds = Histogram(
            "omaticaya_tick_duration_seconds",
            "Wall time of one tick's read path: read, assess, render (the API write runs on "
            "its own thread, omaticaya_api_write_duration_seconds).",
            buckets=_BUCKETS_S,
            registry=None,
        )
        self.write_seconds = Histogram(
            "omaticaya_api_write_duration_seconds",
            "Wall time of one round of API work: Lease renewal, Node patch, Events.",
            buckets=_BUCKETS_S + (30, 60, 120),
            registry=None,
        )

    def store(self, result: TickResult, now_s: float) -> None:
        """Keep ``result`` as the last one; a reading without a library error counts as a
        good read at ``now_s``; one that found no NVML library starts (or continues) the
        ``library_missing_since_s`` episode."""
        with self._lock:
            self.last = result
            error = result.snapshot.error
            if error is None:
                self.last_read_ok_s = now_s
            if error == LIBRARY_NOT_FOUND:
                if self.library_missing_since_s is None:
                    self.library_missing_since_s = now_s
            else:
                self.library_missing_since_s = None

    def replace(self, old: TickResult, new: TickResult) -> bool:
        """Put ``new`` (``old`` after its API write) in place of ``old``, unless a newer reading
        was stored meanwhile (which must never be put back behind). Returns whether it was."""
        with self._lock:
            if self.last is not old:
                return False
            self.last = new
            return True

    # -- tick liveness ------------------------------------------------------------------------

    def stage(self, name: str | None) -> None:
        """The tick in flight entered stage ``name`` (``read``, ``attribution``, ``render``,
        ``listeners``); ``None``: the tick's read path finished now."""
        now_s = self.clock()
        if name is None:
            self.last_tick_done_s = now_s
            self.tick_started_s = self.tick_started_wall_s = None
        elif self.tick_started_s is None:
            self.tick_started_s, self.tick_started_wall_s = now_s, time.time()
        self.tick_stage = name

    def tick_age_s(self, now_s: float | None = None) -> float:
        """Seconds since the last tick's read path finished (since ``started_s`` before the
        first one), on ``clock``."""
        now_s = self.clock() if now_s is None else now_s
        since = self.last_tick_done_s if self.last_tick_done_s is not None else self.started_s
        return max(0.0, now_s - since)

    def tick_overdue(self, now_s: float | None = None) -> bool:
        """True once no tick finished for more than ``stuck_after_s`` seconds: a tick is stuck
        (``tick_stage`` says where) or none starts. ``/healthz`` and the watchdog's log line
        read it; the device plugin times the reading it serves against the same bound."""
        return self.tick_age_s(now_s) > self.stuck_after_s


_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

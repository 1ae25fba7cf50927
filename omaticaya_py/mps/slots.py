"""One supervised MPS daemon's life: its ``Slot`` (a GPU's probe or a slice's daemon, and what
the supervisor knows of it) and the ``Keeper`` that moves it between the states: started
(``starting``), ``up``, ``down`` with the reason and the back-off before its restart, its state
written (``core.allocation.mps.state_json``) for the device plugin.

The back-off: a daemon that failed ``k`` times in a row waits ``min(MAX_BACKOFF_S, check_s *
2**k)`` seconds before its restart. A failure is logged once per episode
(``core.model.sayonce.SayOnce``), its end once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from loguru import logger

from ..core.allocation.mps import DaemonState, Layout, SliceRequest, state_json
from ..core.model.sayonce import SayOnce
from ..sources.files import write_atomic
from .daemon import START_TIMEOUT, ControlDaemon, DaemonError
from .metrics import MpsMetrics

__all__ = [
    "DOWN",
    "MAX_BACKOFF_S",
    "STARTING",
    "UP",
    "Clock",
    "Gpu",
    "Keeper",
    "Slot",
    "SupervisorOptions",
]

#: a daemon's states (``core.allocation.mps.UP``, ``STARTING``, ``DOWN``), typed as ``DaemonState`` wants
UP: Literal["up"] = "up"
STARTING: Literal["starting"] = "starting"
DOWN: Literal["down"] = "down"

#: the longest wait before restarting a daemon that keeps failing, seconds
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True, slots=True)
class Gpu:
    """A shared GPU: NVML ``index``, ``uuid`` (``GPU-...``), and its ``units``
    (``core.model.sharing.unit_count``)."""

    index: int
    uuid: str
    units: int


@dataclass(frozen=True, slots=True)
class SupervisorOptions:
    """How the supervisor runs its daemons (``MpsSettings``'s values): ``control``, the control
    program (a path, or a name on ``PATH``); ``check_s``, seconds between checks;
    ``start_timeout_s``, how long a daemon may take to answer, seconds; ``shm_mib``, each
    slice's tmpfs, MiB (0: a plain folder, no mount); ``host_root``, where the host's root is
    seen in this container (``None``: at the root's own path; ``supervisor``'s module
    docstring)."""

    control: str = "nvidia-cuda-mps-control"
    check_s: float = 2.0
    start_timeout_s: float = 10.0
    shm_mib: int = 1024
    host_root: Path | None = None


@dataclass(frozen=True, slots=True)
class Clock:
    """The supervisor's clocks, seconds: ``wall``, the heartbeats' (the device plugin's:
    ``time.time``); ``monotonic``, the back-off's and the checks' (``time.monotonic``)."""

    wall: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic


class Slot:
    """One daemon (a GPU's probe, or a slice's: ``request``) and what the supervisor knows of
    it: its last ``state``, failures in a row, when it may start again and by when it must
    answer (monotonic seconds), the checks in a row its running process did not answer."""

    def __init__(self, gpu: Gpu, daemon: ControlDaemon, now_s: float,
                 request: SliceRequest | None = None) -> None:  # fmt: skip
        self.gpu = gpu
        self.daemon = daemon
        self.request = request
        self.sid = request.sid if request is not None else ""
        self.state = DaemonState(gpu.uuid, gpu.index, DOWN, reason="not started",
                                 limit_mib=daemon.limit_mib, since_s=now_s, sid=self.sid)  # fmt: skip
        self.failures_in_row = 0
        self.next_start_s = 0.0  # monotonic
        self.start_deadline_s: float | None = None  # monotonic, while starting
        self.silent_checks = 0  # checks in a row its running process did not answer

    @property
    def what(self) -> str:
        """How the logs name it."""
        if self.sid:
            return f"MPS daemon of slice {self.sid} ({self.daemon.limit_mib} MiB) on GPU {self.gpu.index}"
        return f"MPS probe daemon of GPU {self.gpu.index} ({self.gpu.uuid})"


class Keeper:
    """Moves slots between the states (see the module docstring), counts in ``metrics`` and
    writes their states under ``layout``. ``lock`` guards every slot's ``state``: the probes
    read it from other threads; everything else is called from the supervisor's thread."""

    def __init__(self, layout: Layout, options: SupervisorOptions, clock: Clock,
                 metrics: MpsMetrics) -> None:  # fmt: skip
        self.layout = layout
        self.options = options
        self.clock = clock
        self.metrics = metrics
        self.lock = threading.Lock()
        self._said: SayOnce[str, str] = SayOnce()

    def start(self, slot: Slot) -> None:
        """Start ``slot``'s daemon (not waiting): state ``starting``, or ``down`` when it
        cannot be run."""
        if slot.sid:
            self.metrics.slice_started(slot.gpu.index, slot.gpu.uuid)
        else:
            self.metrics.started(slot.gpu.index, slot.gpu.uuid)
        starts = slot.state.starts + 1
        try:
            slot.daemon.start()
        except DaemonError as exc:
            self.set(slot, replace(slot.state, starts=starts))
            self.down(slot, exc)
            return
        except OSError as exc:
            self.set(slot, replace(slot.state, starts=starts))
            self.down(slot, DaemonError("spawn-failed", f"folders: {exc.strerror or exc}"))
            return
        slot.start_deadline_s = self.clock.monotonic() + self.options.start_timeout_s
        self.set(slot, replace(slot.state, state=STARTING, reason="", pid=slot.daemon.pid,
                               starts=starts))  # fmt: skip
        logger.debug("{}: started, pid {}", slot.what, slot.daemon.pid)

    def poll_starting(self, slots: Iterable[Slot]) -> None:
        """One look at each starting daemon of ``slots``: up, still starting, or down."""
        for slot in slots:
            if slot.start_deadline_s is None:
                continue
            try:
                answered = slot.daemon.ready_once()
            except DaemonError as exc:
                self.down(slot, exc)
                continue
            if answered:
                self.up(slot)
            elif self.clock.monotonic() >= slot.start_deadline_s:
                self.down(slot, DaemonError(START_TIMEOUT,
                                            f"no answer within {self.options.start_timeout_s:g}s"))  # fmt: skip

    def up(self, slot: Slot) -> None:
        """``slot``'s daemon answers: state ``up``, its failures forgotten (the end of an
        episode said); a slice's state written at once (a plugin waits for it)."""
        slot.start_deadline_s = None
        slot.failures_in_row = 0
        self.set(slot, replace(slot.state, state=UP, reason="", pid=slot.daemon.pid))
        if not slot.sid:
            self.metrics.up(slot.gpu.index, slot.gpu.uuid, True)
        key = slot.sid or slot.gpu.uuid
        ended = self._said.end(key)
        if ended is not None:
            logger.info("{} is up again (pid {}, start {}) after: {}", slot.what,
                        slot.daemon.pid, slot.state.starts, ended.what)  # fmt: skip
        else:
            logger.info("{} is up: pid {}, default pinned-memory limit {} MiB", slot.what,
                        slot.daemon.pid, slot.daemon.limit_mib)  # fmt: skip
        if slot.sid:
            self.write(slot)  # a plugin waits for it

    def down(self, slot: Slot, error: DaemonError, *, kill: bool = True) -> None:
        """``slot``'s daemon failed: killed (unless ``kill`` is false: a running daemon that did
        not answer once), state ``down`` with the reason, the restart put off by the back-off,
        the failure counted (and said once per episode)."""
        if kill:
            slot.daemon.kill(0.5)
        slot.start_deadline_s = None
        slot.failures_in_row += 1
        wait_s = min(MAX_BACKOFF_S, self.options.check_s * 2**slot.failures_in_row)
        slot.next_start_s = self.clock.monotonic() + wait_s
        self.set(slot, replace(slot.state, state=DOWN, reason=str(error)[:256]))
        if slot.sid:
            self.metrics.slice_failed(slot.gpu.index, slot.gpu.uuid, error.kind)
        else:
            self.metrics.up(slot.gpu.index, slot.gpu.uuid, False)
            self.metrics.failed(slot.gpu.index, slot.gpu.uuid, error.kind)
        if self._said.start(slot.sid or slot.gpu.uuid, error.kind, self.clock.wall()):
            logger.warning("{} is down: {}; restarting it in {:g}s, then with back-off (said "
                           "once until it is up)", slot.what, error, wait_s)  # fmt: skip
        if slot.sid:
            with contextlib.suppress(OSError):
                self.write(slot)

    def set(self, slot: Slot, state: DaemonState) -> None:
        """Replace ``slot``'s state, ``since_s`` moved when the state changes."""
        if state.state != slot.state.state:
            state = replace(state, since_s=self.clock.wall())
        with self.lock:
            slot.state = state

    def write(self, slot: Slot) -> None:
        """``slot``'s state, with a fresh heartbeat, written atomically (rewritten every check:
        not fsynced; a state older than OMATICAYA_MPS_STALE_S is down anyway). Raises
        ``OSError``."""
        self.set(slot, replace(slot.state, heartbeat_s=self.clock.wall()))
        path = self.layout.slice_state(slot.sid) if slot.sid else self.layout.state(slot.gpu.uuid)
        write_atomic(path, (state_json(slot.state) + "\n").encode(), fsync=False)

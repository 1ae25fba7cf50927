"""The supervisor of one CUDA MPS control daemon per shared GPU (``omaticaya mps``).

``Supervisor.start()`` makes the layout's root (``core.mps.Layout``; it remembers each folder
it made, parents such as ``/run/omaticaya`` included, to remove them at ``stop``), mounts the
shared-memory tmpfs, starts every daemon (``daemon.ControlDaemon``) and waits for them (at most
``start_timeout_s``). ``check()``, every ``check_s`` seconds (``run_forever``), asks each daemon:

- it answers: state ``up``, with a fresh heartbeat;
- it does not (its process gone, its socket silent): state ``down`` with the reason; it is
  restarted, a daemon that failed ``k`` times in a row waiting ``min(60, check_s * 2**k)``
  seconds first; while it starts (at most ``start_timeout_s``): ``starting``. A daemon whose
  process runs but does not answer is ``down`` at once (fail closed) but killed only after
  ``SILENT_CHECKS`` checks in a row without an answer (killing it ends its clients' MPS
  server): one slow answer on a busy node costs no running workload.

Each check writes every daemon's state (``core.mps.state_json``) to ``<state dir>/<GPU
UUID>.json`` atomically (a temporary file, then ``os.replace``): the device plugin serves a
shared GPU's units only while it says ``up`` and is fresh (``core.mps.enforced``). A daemon
that starts is asked without blocking the others' checks, so that a slow start never lets a
healthy daemon's heartbeat go stale.

Shared memory: MPS clients and the MPS server their daemon spawns talk through ``/dev/shm``, so
with ``shm_mib > 0`` the supervisor mounts a tmpfs of that size at ``<root>/shm`` (``mount -t
tmpfs -o size=<N>m,mode=1777``; the client containers get it as their ``/dev/shm``) and binds
it over its own ``/dev/shm`` (which its daemons and their servers inherit). Mounting needs
``CAP_SYS_ADMIN`` (the chart's ``mps`` container is privileged); without it ``start`` raises
``MpsError`` saying so. ``shm_mib == 0``: ``<root>/shm`` is a plain folder and nothing is
mounted (tests, runs without privilege): ``/dev/shm`` is then NOT shared with the clients, so
real MPS clients cannot reach their server.

``host_root``: where the host's root is seen in this container when not at the root's own path
(the chart mounts the host's ``/run`` at ``/host/run``, Bidirectional, so that the tmpfs reaches
the host; it does not mount it at ``/run``, where the NVIDIA runtime's own mounts, such as
nvidia-persistenced's socket, would propagate back to the host and stack there): the folders
and the tmpfs are made there, and that folder bound (``mount --rbind``) at the root's path, so
that the daemons' pipe folders have the very paths the clients get.

``stop()`` stops every daemon, removes the state files, unmounts (the ``/dev/shm`` bind, the
root's bind, then the tmpfs) and removes every folder it made: after ``helm uninstall`` no
directory is left.
Failures are logged once per episode (``core.sayonce.SayOnce``), not every check.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from loguru import logger

from ..core.mps import DaemonState, Layout, default_limit_mib, state_json
from ..core.sayonce import SayOnce
from ..sources.files import write_atomic
from .daemon import DIR_MODE, NOT_ANSWERING, START_TIMEOUT, ControlDaemon, DaemonError
from .metrics import MpsMetrics

__all__ = ["MAX_BACKOFF_S", "SILENT_CHECKS", "Gpu", "MpsError", "Supervisor"]

#: a daemon's states (``core.mps.UP``, ``STARTING``, ``DOWN``), typed as ``DaemonState`` wants
UP: Literal["up"] = "up"
STARTING: Literal["starting"] = "starting"
DOWN: Literal["down"] = "down"

#: checks in a row a running daemon may not answer before it is killed and restarted (it is
#: ``down`` from the first: fail closed; killing it would take its clients' MPS server with it)
SILENT_CHECKS = 3

#: the longest wait before restarting a daemon that keeps failing, seconds
MAX_BACKOFF_S = 60.0


class MpsError(Exception):
    """The supervisor cannot set up (a mount refused, a folder that cannot be made); the
    message says what and why, in one line."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """A shared GPU: NVML ``index``, ``uuid`` (``GPU-...``), and its ``units``
    (``core.sharing.unit_count``)."""

    index: int
    uuid: str
    units: int


class _Slot:
    """One daemon and what the supervisor knows of it."""

    def __init__(self, gpu: Gpu, daemon: ControlDaemon, now_s: float) -> None:
        self.gpu = gpu
        self.daemon = daemon
        self.state = DaemonState(gpu.uuid, gpu.index, DOWN, reason="not started",
                                 limit_mib=daemon.limit_mib, since_s=now_s)  # fmt: skip
        self.failures_in_row = 0
        self.next_start_s = 0.0  # monotonic
        self.start_deadline_s: float | None = None  # monotonic, while starting
        self.silent_checks = 0  # checks in a row its running process did not answer


class Supervisor:
    """The MPS control daemons of ``gpus`` (``Gpu`` or ``(index, uuid, units)`` each) under
    ``layout``, each given the default pinned-memory limit of its whole GPU (``units`` x
    ``unit_mib`` MiB, ``core.mps.default_limit_mib``), run from ``control``. ``check_s``:
    seconds between checks; ``start_timeout_s``: how long a daemon may take to answer;
    ``shm_mib``: the shared-memory tmpfs's size, MiB (0: a plain folder, no mount: see the
    module docstring); ``dev_shm``: the ``/dev/shm`` the tmpfs is bound over; ``wall``: the
    heartbeats' clock (seconds, the device plugin's: ``time.time``); ``monotonic``: the
    back-off's. ``metrics``: where to count (a new ``MpsMetrics`` by default).

    ``start``, ``check``, ``run_forever`` and ``stop`` are called from one thread; ``states``,
    ``ready`` and ``healthy`` from any (the probes). Raises ``ValueError`` for a bad UUID or
    a duplicate GPU."""

    def __init__(self, layout: Layout, gpus: Sequence[Gpu | tuple[int, str, int]], unit_mib: int,
                 control: str = "nvidia-cuda-mps-control", check_s: float = 2.0,
                 start_timeout_s: float = 10.0, shm_mib: int = 1024, *,
                 wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 dev_shm: Path = Path("/dev/shm"),
                 host_root: Path | None = None,
                 metrics: MpsMetrics | None = None) -> None:  # fmt: skip
        self.layout = layout
        self.host_root = host_root if host_root is not None and host_root != layout.root else None
        self.gpus = tuple(g if isinstance(g, Gpu) else Gpu(*g) for g in gpus)
        if len({g.uuid for g in self.gpus}) != len(self.gpus):
            raise ValueError("a GPU UUID is given twice")
        self.unit_mib = unit_mib
        self.control = control
        self.check_s = check_s
        self.start_timeout_s = start_timeout_s
        self.shm_mib = shm_mib
        self.dev_shm = dev_shm
        self._wall = wall
        self._monotonic = monotonic
        self.metrics = metrics if metrics is not None else MpsMetrics()
        now = wall()
        self._slots = [
            _Slot(
                g,
                ControlDaemon(
                    layout, g.uuid, g.index, default_limit_mib(g.units, unit_mib), control=control
                ),
                now,
            )  # fmt: skip
            for g in self.gpus
        ]
        for g in self.gpus:
            self.metrics.add_gpu(g.index, g.uuid)
        self._lock = threading.Lock()
        self._said: SayOnce[str, str] = SayOnce()
        self._created: list[Path] = []
        self._mounted: list[tuple[Path, bool]] = []  # (mount point, with its submounts)
        self._last_check_s: float | None = None  # monotonic
        self._started = False

    # -- what the probes read --------------------------------------------------------------

    def states(self) -> dict[str, DaemonState]:
        """GPU UUID -> its daemon's state as last written."""
        with self._lock:
            return {s.gpu.uuid: s.state for s in self._slots}

    def ready(self) -> tuple[bool, str]:
        """``(True, "ok")`` iff every daemon is up; else ``False`` and the GPUs that are not
        (``/readyz``)."""
        not_up = [f"gpu {s.index} {s.state}" + (f" ({s.reason})" if s.reason else "")
                  for s in self.states().values() if s.state != UP]  # fmt: skip
        return (False, "; ".join(not_up)) if not_up else (True, "ok")

    def healthy(self) -> tuple[bool, str]:
        """Whether the checks run: one finished within ``max(30, 10 * check_s)`` seconds plus
        the start timeout (``/healthz``)."""
        last = self._last_check_s
        if last is None:
            return (True, "starting") if not self._started else (False, "no check yet")
        age = self._monotonic() - last
        bound = max(30.0, 10 * self.check_s) + self.start_timeout_s
        return (True, "ok") if age <= bound else (False, f"no check finished for {age:.0f}s")

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Make the folders, mount the shared memory (``shm_mib > 0``), start every daemon and
        wait for them (at most ``start_timeout_s``; one that does not come up is ``down`` and
        will be restarted by ``check``). Raises ``MpsError`` when a folder cannot be made or a
        mount fails (what was set up so far is undone)."""
        self._started = True
        try:
            if self.host_root is not None:  # the host's folder, seen elsewhere in here
                self._makedirs(self.host_root / "shm")
                if self.shm_mib > 0:
                    self._mount_tmpfs(self.host_root / "shm")
                self._makedirs(self.layout.root)
                self._mount(["--rbind", str(self.host_root), str(self.layout.root)],
                            f"binding {self.host_root} at {self.layout.root}")  # fmt: skip
                self._mounted.append((self.layout.root, True))
            else:
                self._makedirs(self.layout.shm)
                if self.shm_mib > 0:
                    self._mount_tmpfs(self.layout.shm)
            self._makedirs(self.layout.state_dir)
            if self.shm_mib > 0:
                self._mount(["--bind", str(self.layout.shm), str(self.dev_shm)],
                            f"binding {self.layout.shm} over {self.dev_shm}")  # fmt: skip
                self._mounted.append((self.dev_shm, False))
        except MpsError:
            self.stop()
            raise
        for slot in self._slots:
            self._start(slot)
        deadline = self._monotonic() + self.start_timeout_s + 1.0
        while any(s.start_deadline_s is not None for s in self._slots):
            self._poll_starting()
            if self._monotonic() > deadline:
                break
            time.sleep(0.05)
        self._write_all()
        self._last_check_s = self._monotonic()

    def check(self) -> None:
        """One round: each daemon asked (see the module docstring), restarted when due, every
        state written with a fresh heartbeat."""
        now = self._monotonic()
        for slot in self._slots:
            if slot.start_deadline_s is not None:
                self._poll_starting(slot)
                continue
            if slot.state.state == UP or slot.silent_checks:
                problem = slot.daemon.problem()
                if problem is None:
                    if slot.state.state != UP:  # it answers again: no restart was needed
                        self._up(slot)
                    slot.silent_checks = 0
                    continue
                silent = problem.kind == NOT_ANSWERING and slot.daemon.running()
                slot.silent_checks = slot.silent_checks + 1 if silent else 0
                if slot.state.state == UP:
                    self._down(slot, problem, kill=not silent)
                if 0 < slot.silent_checks < SILENT_CHECKS:
                    continue  # down (fail closed), not killed yet: its clients keep running
                if slot.silent_checks:
                    slot.daemon.kill(0.5)
                    slot.silent_checks = 0
                    slot.next_start_s = now  # silent long enough: restarted now
            if now >= slot.next_start_s:
                self._start(slot)
                self._poll_starting(slot)
        self._write_all()
        self._last_check_s = self._monotonic()

    def run_forever(self, stop_event: threading.Event) -> None:
        """``check()`` every ``check_s`` seconds (every 0.1 s while a daemon starts) until
        ``stop_event`` is set. Does not call ``stop``."""
        while not stop_event.is_set():
            starting = any(s.start_deadline_s is not None for s in self._slots)
            if stop_event.wait(min(self.check_s, 0.1) if starting else self.check_s):
                break
            try:
                self.check()
                self._said.end("")
            except OSError as exc:  # a state file that cannot be written: said, retried
                if self._said.start("", f"{type(exc).__name__}"):
                    logger.error("MPS supervisor: a check failed: {}", exc)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every daemon (``quit``, then signals; ``timeout_s`` each at most), remove the
        state files, unmount, and remove every folder ``start`` made. Never raises: what cannot
        be undone is logged."""
        for slot in self._slots:
            try:
                slot.daemon.stop(timeout_s)
            except OSError as exc:
                logger.warning("MPS daemon of GPU {} ({}): stop: {}", slot.gpu.index,
                               slot.gpu.uuid, exc)  # fmt: skip
            slot.start_deadline_s = None
            self._set(slot, replace(slot.state, state=DOWN, reason="stopped"))
            self.metrics.up(slot.gpu.index, slot.gpu.uuid, False)
            try:
                self.layout.state(slot.gpu.uuid).unlink(missing_ok=True)
            except OSError as exc:
                logger.warning("MPS state file of GPU {}: {}", slot.gpu.index, exc)
        for path, recursive in reversed(self._mounted):
            args = ["umount", "--recursive", str(path)] if recursive else ["umount", str(path)]
            done = subprocess.run(args, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                logger.warning("umount {}: {}", path, done.stderr.strip() or done.returncode)
        self._mounted.clear()
        for path in reversed(self._created):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("MPS supervisor: cannot remove {}: {}", path, exc.strerror or exc)
        self._created.clear()

    # -- the steps -------------------------------------------------------------------------

    def _makedirs(self, path: Path) -> None:
        """Make ``path`` and its missing parents (``DIR_MODE``), remembering each one made."""
        missing = []
        p = path
        while not p.exists():
            missing.append(p)
            if p.parent == p:
                break
            p = p.parent
        for p in reversed(missing):
            try:
                p.mkdir()
                os.chmod(p, DIR_MODE)
            except FileExistsError:
                continue
            except OSError as exc:
                raise MpsError(f"cannot make the folder {p}: {exc.strerror or exc}") from None
            self._created.append(p)

    def _mount(self, args: list[str], what: str) -> None:
        done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise MpsError(
                f"{what} failed (mount {' '.join(args)}: "
                f"{said[-1] if said else f'exit {done.returncode}'}): mounting needs "
                "CAP_SYS_ADMIN (the chart's mps container is privileged); or set "
                "OMATICAYA_MPS_SHM_MIB=0 to mount nothing (then /dev/shm is not shared with "
                "the clients)"
            )

    def _mount_tmpfs(self, shm: Path) -> None:
        self._mount(["-t", "tmpfs", "-o", f"size={self.shm_mib}m,mode=1777", "tmpfs", str(shm)],
                    f"mounting the shared-memory tmpfs at {shm}")  # fmt: skip
        self._mounted.append((shm, False))
        logger.info("MPS shared memory: a {} MiB tmpfs at {}, bound over {}", self.shm_mib, shm,
                    self.dev_shm)  # fmt: skip

    def _start(self, slot: _Slot) -> None:
        """Start ``slot``'s daemon (not waiting): state ``starting``, or ``down`` when it
        cannot be run."""
        self.metrics.started(slot.gpu.index, slot.gpu.uuid)
        starts = slot.state.starts + 1
        try:
            slot.daemon.start()
        except DaemonError as exc:
            self._set(slot, replace(slot.state, starts=starts))
            self._down(slot, exc)
            return
        except OSError as exc:
            self._set(slot, replace(slot.state, starts=starts))
            self._down(slot, DaemonError("spawn-failed", f"folders: {exc.strerror or exc}"))
            return
        slot.start_deadline_s = self._monotonic() + self.start_timeout_s
        self._set(slot, replace(slot.state, state=STARTING, reason="", pid=slot.daemon.pid,
                                starts=starts))  # fmt: skip
        logger.debug("MPS daemon of GPU {} ({}): started, pid {}", slot.gpu.index, slot.gpu.uuid,
                     slot.daemon.pid)  # fmt: skip

    def _poll_starting(self, only: _Slot | None = None) -> None:
        """One look at each starting daemon (or ``only``): up, still starting, or down."""
        for slot in (only,) if only is not None else self._slots:
            if slot.start_deadline_s is None:
                continue
            try:
                answered = slot.daemon.ready_once()
            except DaemonError as exc:
                self._down(slot, exc)
                continue
            if answered:
                self._up(slot)
            elif self._monotonic() >= slot.start_deadline_s:
                self._down(slot, DaemonError(START_TIMEOUT,
                                             f"no answer within {self.start_timeout_s:g}s"))  # fmt: skip

    def _up(self, slot: _Slot) -> None:
        slot.start_deadline_s = None
        slot.failures_in_row = 0
        self._set(slot, replace(slot.state, state=UP, reason="", pid=slot.daemon.pid))
        self.metrics.up(slot.gpu.index, slot.gpu.uuid, True)
        ended = self._said.end(slot.gpu.uuid)
        if ended is not None:
            logger.info("MPS daemon of GPU {} ({}) is up again (pid {}, start {}) after: {}",
                        slot.gpu.index, slot.gpu.uuid, slot.daemon.pid, slot.state.starts,
                        ended.what)  # fmt: skip
        else:
            logger.info("MPS daemon of GPU {} ({}) is up: pid {}, default pinned-memory limit "
                        "{} MiB", slot.gpu.index, slot.gpu.uuid, slot.daemon.pid,
                        slot.daemon.limit_mib)  # fmt: skip

    def _down(self, slot: _Slot, error: DaemonError, *, kill: bool = True) -> None:
        """``slot``'s daemon failed: killed (unless ``kill`` is false: a running daemon that did
        not answer once), state ``down`` with the reason, the restart put off by the back-off,
        the failure counted (and said once per episode)."""
        if kill:
            slot.daemon.kill(0.5)
        slot.start_deadline_s = None
        slot.failures_in_row += 1
        wait_s = min(MAX_BACKOFF_S, self.check_s * 2**slot.failures_in_row)
        slot.next_start_s = self._monotonic() + wait_s
        self._set(slot, replace(slot.state, state=DOWN, reason=str(error)[:256]))
        self.metrics.up(slot.gpu.index, slot.gpu.uuid, False)
        self.metrics.failed(slot.gpu.index, slot.gpu.uuid, error.kind)
        if self._said.start(slot.gpu.uuid, error.kind, self._wall()):
            logger.warning("MPS daemon of GPU {} ({}) is down: {}; restarting it in {:g}s, then "
                           "with back-off (said once until it is up)", slot.gpu.index,
                           slot.gpu.uuid, error, wait_s)  # fmt: skip

    def _set(self, slot: _Slot, state: DaemonState) -> None:
        """Replace ``slot``'s state, ``since_s`` moved when the state changes."""
        if state.state != slot.state.state:
            state = replace(state, since_s=self._wall())
        with self._lock:
            slot.state = state

    def _write_all(self) -> None:
        """Every state, with a fresh heartbeat, written atomically. Raises ``OSError``."""
        now = self._wall()
        for slot in self._slots:
            self._set(slot, replace(slot.state, heartbeat_s=now))
            # rewritten every check: not fsynced (a state older than OMATICAYA_MPS_STALE_S is
            # down anyway)
            write_atomic(self.layout.state(slot.gpu.uuid), (state_json(slot.state) + "\n").encode(),
                         fsync=False)  # fmt: skip

"""The supervisor of the CUDA MPS control daemons (``omaticaya mps``): one per slice, and one
probe per shared GPU.

Why one daemon per slice (issue 47): the limit a tenant cannot raise comes from the daemon's
side. A client's ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` can only lower its daemon's default, and
the container owns its environment; so each slice's daemon is given the slice as its default
pinned-memory limit (``core.allocation.mps``'s module docstring says the rest).

``Supervisor.start()`` takes the supervisor's lock (an exclusive ``flock`` on ``<state
dir>/supervisor.lock``, held until the process ends: a reader that can take it knows no
supervisor runs, ``sources.mps``), makes the layout's root (``core.allocation.mps.Layout``; it remembers
each folder it made, parents such as ``/run/omaticaya`` included, to remove them at ``stop``),
starts every GPU's probe daemon and waits for them (at most ``start_timeout_s``), then starts
the daemons of the slices already asked for (a restarted supervisor finds its requests again).

The slices: a plugin writes a request (``core.allocation.mps.SliceRequest``) to ``<state dir>/slices/<slice
id>.json``; ``sync()`` (every 0.1 s in ``run_forever``: a folder listing) starts a daemon for
each new request (its folder ``<root>/slices/<slice id>``, its default pinned-memory limit the
slice's MiB, its active-thread percentage when asked, and with ``shm_mib > 0`` a tmpfs of that
size as its and its clients' ``/dev/shm``), and stops the daemon of each request removed (its
tmpfs unmounted, its folder and state file removed). A request that cannot be read, or that
names a GPU not shared here, is skipped and counted, its state written ``down`` with the reason
(so that the plugin waiting for it learns why at once).

``check()``, every ``check_s`` seconds, asks each daemon (probes and slices alike):

- it answers: state ``up``, with a fresh heartbeat;
- it does not (its process gone, its socket silent): state ``down`` with the reason; it is
  restarted, a daemon that failed ``k`` times in a row waiting ``min(60, check_s * 2**k)``
  seconds first; while it starts (at most ``start_timeout_s``): ``starting``. A daemon whose
  process runs but does not answer is ``down`` at once (fail closed) but killed only after
  ``SILENT_CHECKS`` checks in a row without an answer, and only when its control socket is
  still there: a daemon whose socket was removed (by a tenant, in its own pipe folder) keeps
  serving the clients it has (killing it would end their MPS server; it answers nobody new,
  so it stays ``down``) until it has no MPS server left, then it is restarted.

A restarted daemon keeps its pipe folder (the same inode: a running container's bind mount of
it sees the new daemon's sockets) and its slice's tmpfs (a restarted supervisor finds a slice's
tmpfs still mounted, after a crash, and keeps it): a running container's next CUDA process
reaches it.

Each check writes every daemon's state (``core.allocation.mps.state_json``) atomically: a probe's to
``<state dir>/<GPU UUID>.json``, a slice's to ``<state dir>/slices/<slice id>.state.json``. The
device plugin serves a shared GPU's units only while its probe says ``up`` and is fresh, and
hands a slice out only once its daemon says ``up`` (``core.allocation.mps.enforced``).

Mounting needs ``CAP_SYS_ADMIN`` (the chart's ``mps`` container is privileged); without it a
slice's daemon cannot start (``spawn-failed``, said once). ``shm_mib == 0``: nothing is mounted
(tests, runs without privilege): ``<root>/slices/<id>/shm`` is a plain folder, and ``/dev/shm``
is NOT shared with the clients, so real MPS clients cannot reach their server.

``host_root``: where the host's root is seen in this container when not at the root's own path
(the chart mounts the host's ``/run`` at ``/host/run``, Bidirectional, so that the tmpfs mounts
reach the host; it does not mount it at ``/run``, where the NVIDIA runtime's own mounts, such as
nvidia-persistenced's socket, would propagate back to the host and stack there): the folders
and the tmpfs mounts are made there, and that folder bound (``mount --rbind``) at the root's
path, so that the daemons' pipe folders have the very paths the clients get.

``stop()`` stops every daemon, removes the state files (not the plugins' requests), unmounts
and removes every folder it made: after ``helm uninstall`` no directory is left.
Failures are logged once per episode (``core.model.sayonce.SayOnce``), not every check.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Literal

from loguru import logger
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_fixed

from ..core.allocation.mps import (
    SLICE_ID_RE,
    DaemonState,
    Layout,
    SliceRequest,
    parse_request,
    probe_limit_mib,
    state_json,
)
from ..core.model.sayonce import SayOnce
from ..sources.files import write_atomic
from .daemon import DIR_MODE, NOT_ANSWERING, START_TIMEOUT, ControlDaemon, DaemonError
from .metrics import MpsMetrics

__all__ = ["MAX_BACKOFF_S", "SILENT_CHECKS", "Gpu", "MpsError", "Supervisor"]

#: a daemon's states (``core.allocation.mps.UP``, ``STARTING``, ``DOWN``), typed as ``DaemonState`` wants
UP: Literal["up"] = "up"
STARTING: Literal["starting"] = "starting"
DOWN: Literal["down"] = "down"

#: checks in a row a running daemon may not answer before it is killed and restarted (it is
#: ``down`` from the first: fail closed; killing it would take its clients' MPS server with it)
SILENT_CHECKS = 3

#: the longest wait before restarting a daemon that keeps failing, seconds
MAX_BACKOFF_S = 60.0

#: how often ``run_forever`` looks for new and removed slice requests, seconds
SYNC_S = 0.1

#: the reasons a slice request is skipped (``omaticaya_mps_slice_requests_skipped_total``)
UNREADABLE = "unreadable"
UNKNOWN_GPU = "unknown-gpu"


class MpsError(Exception):
    """The supervisor cannot set up (a mount refused, a folder that cannot be made, another
    supervisor holding the lock); the message says what and why, in one line."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """A shared GPU: NVML ``index``, ``uuid`` (``GPU-...``), and its ``units``
    (``core.model.sharing.unit_count``)."""

    index: int
    uuid: str
    units: int


class _Slot:
    """One daemon (a GPU's probe, or a slice's: ``request``) and what the supervisor knows of
    it."""

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


class Supervisor:
    """The MPS control daemons of ``gpus`` (``Gpu`` or ``(index, uuid, units)`` each: one probe
    each, its default limit one unit, ``core.allocation.mps.probe_limit_mib``) and of the slices asked for
    on them, under ``layout``, run from ``control``. ``unit_mib``: MiB per unit. ``check_s``:
    seconds between checks; ``start_timeout_s``: how long a daemon may take to answer;
    ``shm_mib``: each slice's tmpfs, MiB (0: a plain folder, no mount: see the module
    docstring); ``wall``: the heartbeats' clock (seconds, the device plugin's: ``time.time``);
    ``monotonic``: the back-off's. ``metrics``: where to count (a new ``MpsMetrics`` by
    default).

    ``start``, ``sync``, ``check``, ``run_forever`` and ``stop`` are called from one thread;
    ``states``, ``slice_states``, ``ready`` and ``healthy`` from any (the probes). Raises
    ``ValueError`` for a bad UUID or a duplicate GPU."""

    def __init__(self, layout: Layout, gpus: Sequence[Gpu | tuple[int, str, int]], unit_mib: int,
                 control: str = "nvidia-cuda-mps-control", check_s: float = 2.0,
                 start_timeout_s: float = 10.0, shm_mib: int = 1024, *,
                 wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
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
        self._wall = wall
        self._monotonic = monotonic
        self.metrics = metrics if metrics is not None else MpsMetrics()
        now = wall()
        self._by_uuid = {g.uuid: g for g in self.gpus}
        self._slots = [
            _Slot(g, ControlDaemon(layout, g.uuid, g.index, probe_limit_mib(unit_mib),
                                   control=control), now)  # fmt: skip
            for g in self.gpus
        ]
        self._slices: dict[str, _Slot] = {}
        self._skipped: dict[str, str] = {}  # slice ID -> why its request was skipped
        for g in self.gpus:
            self.metrics.add_gpu(g.index, g.uuid)
        self._lock = threading.Lock()
        self._said: SayOnce[str, str] = SayOnce()
        self._created: list[Path] = []
        self._mounted: list[tuple[Path, bool]] = []  # (mount point, with its submounts)
        self._lock_file: IO[bytes] | None = None
        self._last_check_s: float | None = None  # monotonic
        self._started = False

    # -- what the probes read --------------------------------------------------------------

    def states(self) -> dict[str, DaemonState]:
        """GPU UUID -> its probe daemon's state as last written."""
        with self._lock:
            return {s.gpu.uuid: s.state for s in self._slots}

    def slice_states(self) -> dict[str, DaemonState]:
        """Slice ID -> its daemon's state as last written."""
        with self._lock:
            return {sid: s.state for sid, s in self._slices.items()}

    def ready(self) -> tuple[bool, str]:
        """``(True, "ok")`` iff every GPU's probe daemon is up; else ``False`` and the GPUs
        that are not (``/readyz``). A slice's daemon does not make the pod unready: its
        slice's container is told, not the node."""
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
        """Take the lock, make the folders, start every probe daemon and wait for them (at
        most ``start_timeout_s``; one that does not come up is ``down`` and will be restarted
        by ``check``), then the daemons of the slices already asked for. Raises ``MpsError``
        when another supervisor holds the lock, a folder cannot be made or a mount fails (what
        was set up so far is undone)."""
        self._started = True
        try:
            self._makedirs(self.layout.state_dir)
            self._take_lock()
            if self.host_root is not None:  # the host's folder, seen elsewhere in here
                self._makedirs(self.host_root / "slices")
                self._makedirs(self.layout.root)
                self._mount(["--rbind", str(self.host_root), str(self.layout.root)],
                            f"binding {self.host_root} at {self.layout.root}")  # fmt: skip
                self._mounted.append((self.layout.root, True))
            self._makedirs(self.layout.slices_dir)
            self._makedirs(self.layout.requests_dir)
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
        self.sync()
        self._write_all()
        self._last_check_s = self._monotonic()

    def sync(self) -> None:
        """Match the slices' daemons to the requests (see the module docstring): new ones
        started, removed ones stopped, starting ones looked at; their states written."""
        wanted = self._requests()
        for sid in [sid for sid in self._slices if sid not in wanted]:
            self._drop(self._slices[sid])
        for sid, request in wanted.items():
            if sid not in self._slices:
                self._add(request)
        changed = False
        for slot in self._slices.values():
            if slot.start_deadline_s is not None:
                before = slot.state.state
                self._poll_starting(slot)
                changed |= slot.state.state != before
        if changed:
            self._write_all()

    def check(self) -> None:
        """One round: each daemon asked (see the module docstring), restarted when due, every
        state written with a fresh heartbeat."""
        self.sync()
        now = self._monotonic()
        for slot in [*self._slots, *self._slices.values()]:
            self._check(slot, now)
        for g in self.gpus:
            up = sum(1 for s in self._slices.values() if s.gpu.uuid == g.uuid and s.state.state == UP)
            self.metrics.slices_up(g.index, g.uuid, up)
        self._write_all()
        self._last_check_s = self._monotonic()

    def _check(self, slot: _Slot, now: float) -> None:
        if slot.start_deadline_s is not None:
            self._poll_starting(slot)
            return
        if slot.state.state == UP or slot.silent_checks:
            problem = slot.daemon.problem()
            if problem is None:
                if slot.state.state != UP:  # it answers again: no restart was needed
                    self._up(slot)
                slot.silent_checks = 0
                return
            silent = problem.kind == NOT_ANSWERING and slot.daemon.running()
            slot.silent_checks = slot.silent_checks + 1 if silent else 0
            if slot.state.state == UP:
                self._down(slot, problem, kill=not silent)
            if 0 < slot.silent_checks < SILENT_CHECKS:
                return  # down (fail closed), not killed yet: its clients keep running
            if slot.silent_checks:
                if not (slot.daemon.pipe / "control").exists() and _serves(slot.daemon.pid):
                    # its socket was removed: it answers nobody new, but its MPS server still
                    # serves the clients it has; it is restarted once that server is gone
                    slot.silent_checks = SILENT_CHECKS
                    return
                slot.daemon.kill(0.5)
                slot.silent_checks = 0
                slot.next_start_s = now  # silent long enough: restarted now
        if now >= slot.next_start_s:
            self._start(slot)
            self._poll_starting(slot)

    def run_forever(self, stop_event: threading.Event) -> None:
        """``sync()`` every ``SYNC_S`` seconds and ``check()`` every ``check_s`` seconds until
        ``stop_event`` is set. Does not call ``stop``."""
        next_check = self._monotonic() + self.check_s
        while not stop_event.wait(min(self.check_s, SYNC_S)):
            try:
                if self._monotonic() >= next_check or any(
                        s.start_deadline_s is not None for s in self._slots):  # fmt: skip
                    next_check = self._monotonic() + self.check_s
                    self.check()
                else:
                    self.sync()
                self._said.end("")
            except OSError as exc:  # a state file that cannot be written: said, retried
                if self._said.start("", f"{type(exc).__name__}"):
                    logger.error("MPS supervisor: a check failed: {}", exc)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every daemon (``quit``, then signals; ``timeout_s`` each at most), remove the
        state files (the plugins' requests stay), unmount, remove every folder ``start`` made,
        and let go of the lock. Never raises: what cannot be undone is logged."""
        for slot in list(self._slices.values()):
            self._drop(slot, timeout_s=timeout_s, forget=False)
        for slot in self._slots:
            try:
                slot.daemon.stop(timeout_s)
            except OSError as exc:
                logger.warning("{}: stop: {}", slot.what, exc)
            slot.start_deadline_s = None
            self._set(slot, replace(slot.state, state=DOWN, reason="stopped"))
            self.metrics.up(slot.gpu.index, slot.gpu.uuid, False)
            try:
                self.layout.state(slot.gpu.uuid).unlink(missing_ok=True)
            except OSError as exc:
                logger.warning("MPS state file of GPU {}: {}", slot.gpu.index, exc)
        self._sweep_slices()
        for path, recursive in reversed(self._mounted):
            self._umount(path, recursive)
        self._mounted.clear()
        if self._lock_file is not None:
            # removed first, while held: a reader finds no lock file (a clean stop), not a
            # lock nobody holds (a supervisor that died)
            with contextlib.suppress(OSError):
                self.layout.lock.unlink()
            self._lock_file.close()  # the flock goes with it
            self._lock_file = None
        for path in reversed(self._created):
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY and path in (self.layout.requests_dir,
                                                             *self.layout.requests_dir.parents):  # fmt: skip
                    continue  # the plugins' slice requests: theirs to remove
                logger.warning("MPS supervisor: cannot remove {}: {}", path, exc.strerror or exc)
        self._created.clear()

    # -- the slices ------------------------------------------------------------------------

    def _requests(self) -> dict[str, SliceRequest]:
        """The slice requests on file, checked; one that is not a request, or names a GPU not
        shared here, is skipped (said once, counted once, its state written down)."""
        out: dict[str, SliceRequest] = {}
        try:
            names = [e.name for e in os.scandir(self.layout.requests_dir)]
        except FileNotFoundError:
            return out
        seen = set()
        for name in names:
            if not name.endswith(".json") or name.endswith(".state.json"):
                continue
            sid = name[: -len(".json")]
            seen.add(sid)
            try:
                path = self.layout.request(sid)
                with open(path, "rb") as f:
                    request = parse_request(f.read(16 * 1024), sid)
            except FileNotFoundError:
                continue  # removed meanwhile
            except (OSError, ValueError) as exc:
                self._skip(sid, UNREADABLE, f"{type(exc).__name__}: {exc}")
                continue
            gpu = self._by_uuid.get(request.gpu_uuid)
            if gpu is None:
                self._skip(sid, UNKNOWN_GPU, f"GPU {request.gpu_uuid} is not a shared GPU here",
                           request)  # fmt: skip
                continue
            self._skipped.pop(sid, None)
            out[sid] = request
        for sid in [sid for sid in self._skipped if sid not in seen]:
            del self._skipped[sid]
            with contextlib.suppress(OSError, ValueError):
                self.layout.slice_state(sid).unlink(missing_ok=True)
        return out

    def _skip(self, sid: str, reason: str, detail: str,
              request: SliceRequest | None = None) -> None:  # fmt: skip
        if self._skipped.get(sid) == reason:
            return
        self._skipped[sid] = reason
        self.metrics.skipped(reason)
        logger.warning("MPS supervisor: slice request {} skipped ({}): {}", sid[:32], reason,
                       detail[:200])  # fmt: skip
        try:
            uuid = request.gpu_uuid if request is not None else self.gpus[0].uuid if self.gpus else ""
            if uuid:
                state = DaemonState(uuid, request.gpu_index if request else 0, DOWN,
                                    reason=f"{reason}: {detail}"[:256], heartbeat_s=self._wall(),
                                    since_s=self._wall(), sid=sid)  # fmt: skip
                write_atomic(self.layout.slice_state(sid), (state_json(state) + "\n").encode(),
                             fsync=False)  # fmt: skip
        except (OSError, ValueError):
            pass

    def _add(self, request: SliceRequest) -> None:
        """A new slice: its tmpfs mounted (``shm_mib > 0``), its daemon started."""
        gpu = self._by_uuid[request.gpu_uuid]
        shm = self._host(self.layout.slice_shm(request.sid))
        daemon = ControlDaemon(self.layout, gpu.uuid, gpu.index, request.mib, control=self.control,
                               sid=request.sid, threads_pct=request.threads_pct,
                               shm=shm if self.shm_mib > 0 else None)  # fmt: skip
        slot = _Slot(gpu, daemon, self._wall(), request)
        self._slices[request.sid] = slot
        logger.info("{}: asked for by {} ({})", slot.what, request.owner, request.holder[:120])
        if self.shm_mib > 0:
            try:
                shm.mkdir(parents=True, exist_ok=True)
                if not os.path.ismount(shm):  # a restarted supervisor keeps the slice's tmpfs
                    self._mount(["-t", "tmpfs", "-o", f"size={self.shm_mib}m,mode=1777", "tmpfs",
                                 str(shm)], f"mounting slice {request.sid}'s tmpfs at {shm}")  # fmt: skip
            except (MpsError, OSError) as exc:
                self._down(slot, DaemonError("spawn-failed", str(exc)))
                return
        else:
            self.layout.slice_shm(request.sid).mkdir(parents=True, exist_ok=True)
        self._start(slot)
        self._poll_starting(slot)

    def _drop(self, slot: _Slot, *, timeout_s: float = 5.0, forget: bool = True) -> None:
        """A slice no longer asked for (or the supervisor stopping): its daemon stopped, its
        tmpfs unmounted, its folder and state file removed."""
        try:
            if slot.daemon.running():
                with contextlib.suppress(DaemonError):
                    slot.daemon.command("quit", max(0.1, min(2.0, timeout_s / 2)))
            slot.daemon.kill(max(0.1, timeout_s / 2))
            shm = self._host(self.layout.slice_shm(slot.sid))
            if os.path.ismount(shm):
                self._umount(shm, False)
            slot.daemon.stop(0.1)
        except OSError as exc:
            logger.warning("{}: stop: {}", slot.what, exc)
        self._remove_slice_folder(slot.sid)
        with contextlib.suppress(OSError):
            self.layout.slice_state(slot.sid).unlink(missing_ok=True)
        self._slices.pop(slot.sid, None)
        if forget:
            logger.info("{}: stopped (its request was removed)", slot.what)

    def _remove_slice_folder(self, sid: str) -> bool:
        """Remove slice ``sid``'s folder (``<root>/slices/<sid>``, seen from the host's side):
        its tmpfs (and any mount left on its pipe folder) unmounted first, lazily when busy, the
        whole tree then removed, tried ``_REMOVE_TRIES`` times ``_REMOVE_WAIT_S`` apart (a dying
        MPS server can still write in it). Returns ``True`` when nothing is left; a folder that
        stays is logged with the reason (``ControlDaemon.stop`` removes it quietly, and a
        leftover seen after ``helm uninstall`` had no trace in the logs). Never raises."""
        folder = self._host(self.layout.slice_dir(sid))
        try:
            _remove_tree(folder)
        except OSError as exc:
            logger.warning("MPS supervisor: cannot remove slice {}'s folder {}: {}", sid, folder,
                           exc.strerror or exc)  # fmt: skip
            return False
        return True

    def _sweep_slices(self) -> None:
        """At ``stop``: remove every slice folder still under ``<root>/slices`` (one whose
        daemon's removal failed, or one a dead supervisor left and no request names now), so
        that ``stop`` leaves no directory. Entries that are not slice IDs are left (not ours)."""
        where = self._host(self.layout.slices_dir)
        try:
            names = [e.name for e in os.scandir(where) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return
        for name in names:
            if SLICE_ID_RE.match(name):
                self._remove_slice_folder(name)

    def _host(self, path: Path) -> Path:
        """``path`` under the root as made on the host's side (``host_root``), else itself."""
        if self.host_root is None:
            return path
        return self.host_root / path.relative_to(self.layout.root)

    # -- the steps -------------------------------------------------------------------------

    def _take_lock(self) -> None:
        """The exclusive ``flock`` on ``Layout.lock``, held until ``stop`` (or the process
        ends). Raises ``MpsError`` when another supervisor holds it."""
        try:
            f = open(self.layout.lock, "ab")  # noqa: SIM115 (kept open: the lock)
        except OSError as exc:
            raise MpsError(f"cannot open {self.layout.lock}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            raise MpsError(f"another MPS supervisor holds {self.layout.lock}: one per node") from None
        self._lock_file = f

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

    @staticmethod
    def _umount(path: Path, recursive: bool) -> None:
        args = ["umount", "--recursive", str(path)] if recursive else ["umount", str(path)]
        done = subprocess.run(args, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            logger.warning("umount {}: {}", path, done.stderr.strip() or done.returncode)

    def _start(self, slot: _Slot) -> None:
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
        logger.debug("{}: started, pid {}", slot.what, slot.daemon.pid)

    def _poll_starting(self, only: _Slot | None = None) -> None:
        """One look at each starting probe daemon (or ``only``): up, still starting, or down."""
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
            self._write(slot)  # a plugin waits for it

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
        if slot.sid:
            self.metrics.slice_failed(slot.gpu.index, slot.gpu.uuid, error.kind)
        else:
            self.metrics.up(slot.gpu.index, slot.gpu.uuid, False)
            self.metrics.failed(slot.gpu.index, slot.gpu.uuid, error.kind)
        if self._said.start(slot.sid or slot.gpu.uuid, error.kind, self._wall()):
            logger.warning("{} is down: {}; restarting it in {:g}s, then with back-off (said "
                           "once until it is up)", slot.what, error, wait_s)  # fmt: skip
        if slot.sid:
            with contextlib.suppress(OSError):
                self._write(slot)

    def _set(self, slot: _Slot, state: DaemonState) -> None:
        """Replace ``slot``'s state, ``since_s`` moved when the state changes."""
        if state.state != slot.state.state:
            state = replace(state, since_s=self._wall())
        with self._lock:
            slot.state = state

    def _write(self, slot: _Slot) -> None:
        """``slot``'s state, with a fresh heartbeat, written atomically (rewritten every check:
        not fsynced; a state older than OMATICAYA_MPS_STALE_S is down anyway). Raises
        ``OSError``."""
        self._set(slot, replace(slot.state, heartbeat_s=self._wall()))
        path = self.layout.slice_state(slot.sid) if slot.sid else self.layout.state(slot.gpu.uuid)
        write_atomic(path, (state_json(slot.state) + "\n").encode(), fsync=False)

    def _write_all(self) -> None:
        """Every state, with a fresh heartbeat. Raises ``OSError``."""
        for slot in [*self._slots, *self._slices.values()]:
            self._write(slot)


def _serves(pid: int | None) -> bool:
    """Whether the process ``pid`` (a control daemon) has a child still running, not a zombie
    (its MPS server: the daemon spawns one per user while clients are connected), from
    ``/proc/<pid>/task/*/children`` and each child's ``/proc/<child>/stat``."""
    if pid is None:
        return False
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children = f.read().split()
        except OSError:
            continue
        for child in children:
            try:
                with open(f"/proc/{child}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in ("Z", "X"):
                return True
    return False


#: tries and the wait between them of ``_remove_tree``
_REMOVE_TRIES = 5
_REMOVE_WAIT_S = 0.2


@retry(stop=stop_after_attempt(_REMOVE_TRIES), wait=wait_fixed(_REMOVE_WAIT_S),
       retry=retry_if_exception_type(OSError), reraise=True)  # fmt: skip
def _remove_tree(folder: Path) -> None:
    """Unmount what is mounted on ``folder``'s ``shm`` and ``pipe`` (``umount``, then ``umount
    --lazy`` when busy) and remove the tree. A folder already gone is done. Raises ``OSError``
    (the first failure of ``shutil.rmtree``) when something stays."""
    if not folder.exists():
        return
    for sub in (folder / "shm", folder / "pipe"):
        if os.path.ismount(sub):
            done = subprocess.run(["umount", str(sub)], capture_output=True, check=False)
            if done.returncode != 0:
                subprocess.run(["umount", "--lazy", str(sub)], capture_output=True, check=False)
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        return

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
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from loguru import logger

from ..core.allocation.mps import DaemonState, Layout, SliceRequest, probe_limit_mib
from ..core.model.sayonce import SayOnce
from .daemon import (
    NOT_ANSWERING,
    ControlDaemon,
    DaemonError,
    DaemonProgram,
    SliceSpec,
    serves_clients,
)
from .host import HostFolders, MpsError, umount
from .metrics import MpsMetrics
from .slice_requests import SliceRequests
from .slots import DOWN, MAX_BACKOFF_S, UP, Clock, Gpu, Keeper, Slot, SupervisorOptions

__all__ = [
    "MAX_BACKOFF_S",
    "SILENT_CHECKS",
    "Clock",
    "Gpu",
    "MpsError",
    "Supervisor",
    "SupervisorOptions",
]

#: checks in a row a running daemon may not answer before it is killed and restarted (it is
#: ``down`` from the first: fail closed; killing it would take its clients' MPS server with it)
SILENT_CHECKS = 3

#: how often ``run_forever`` looks for new and removed slice requests, seconds
SYNC_S = 0.1


class Supervisor:
    """The MPS control daemons of ``gpus`` (``Gpu`` or ``(index, uuid, units)`` each: one probe
    each, its default limit one unit, ``core.allocation.mps.probe_limit_mib``) and of the slices
    asked for on them, under ``layout``. ``unit_mib``: MiB per unit. ``options``: the control
    program, the check period, the start timeout, the slices' tmpfs size and the host's root
    (``SupervisorOptions``, its defaults when ``None``; see the module docstring). ``clock``:
    the heartbeats' wall clock and the back-off's monotonic one (``Clock``: ``time.time`` and
    ``time.monotonic`` when ``None``). ``metrics``: where to count (a new
    ``MpsMetrics`` by default).

    ``start``, ``sync``, ``check``, ``run_forever`` and ``stop`` are called from one thread;
    ``states``, ``slice_states``, ``ready`` and ``healthy`` from any (the probes). Raises
    ``ValueError`` for a bad UUID or a duplicate GPU."""

    def __init__(self, layout: Layout, gpus: Sequence[Gpu | tuple[int, str, int]], unit_mib: int,
                 options: SupervisorOptions | None = None, *,
                 clock: Clock | None = None, metrics: MpsMetrics | None = None) -> None:  # fmt: skip
        self.layout = layout
        self.options = options = options if options is not None else SupervisorOptions()
        self.clock = clock = clock if clock is not None else Clock()
        self.gpus = tuple(g if isinstance(g, Gpu) else Gpu(*g) for g in gpus)
        if len({g.uuid for g in self.gpus}) != len(self.gpus):
            raise ValueError("a GPU UUID is given twice")
        self.unit_mib = unit_mib
        self.metrics = metrics if metrics is not None else MpsMetrics()
        self.host = HostFolders(layout, options.host_root)
        self._program = DaemonProgram(options.control)
        self._keeper = Keeper(layout, options, clock, self.metrics)
        self._requests = SliceRequests(layout, self.gpus, self.metrics, clock.wall)
        now = clock.wall()
        self._slots = [
            Slot(g, ControlDaemon(layout, g.uuid, g.index, probe_limit_mib(unit_mib),
                                  program=self._program), now)  # fmt: skip
            for g in self.gpus
        ]
        self._slices: dict[str, Slot] = {}
        for g in self.gpus:
            self.metrics.add_gpu(g.index, g.uuid)
        self._said: SayOnce[str, str] = SayOnce()
        self._last_check_s: float | None = None  # monotonic
        self._started = False

    # -- what the probes read --------------------------------------------------------------

    def states(self) -> dict[str, DaemonState]:
        """GPU UUID -> its probe daemon's state as last written."""
        with self._keeper.lock:
            return {s.gpu.uuid: s.state for s in self._slots}

    def slice_states(self) -> dict[str, DaemonState]:
        """Slice ID -> its daemon's state as last written."""
        with self._keeper.lock:
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
        age = self.clock.monotonic() - last
        bound = max(30.0, 10 * self.options.check_s) + self.options.start_timeout_s
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
            self.host.set_up()
        except MpsError:
            self.stop()
            raise
        for slot in self._slots:
            self._keeper.start(slot)
        deadline = self.clock.monotonic() + self.options.start_timeout_s + 1.0
        while any(s.start_deadline_s is not None for s in self._slots):
            self._keeper.poll_starting(self._slots)
            if self.clock.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.sync()
        self._write_all()
        self._last_check_s = self.clock.monotonic()

    def sync(self) -> None:
        """Match the slices' daemons to the requests (see the module docstring): new ones
        started, removed ones stopped, starting ones looked at; their states written."""
        wanted = self._requests.read()
        for sid in [sid for sid in self._slices if sid not in wanted]:
            self._drop(self._slices[sid])
        for sid, request in wanted.items():
            if sid not in self._slices:
                self._add(request)
        changed = False
        for slot in self._slices.values():
            if slot.start_deadline_s is not None:
                before = slot.state.state
                self._keeper.poll_starting((slot,))
                changed |= slot.state.state != before
        if changed:
            self._write_all()

    def check(self) -> None:
        """One round: each daemon asked (see the module docstring), restarted when due, every
        state written with a fresh heartbeat."""
        self.sync()
        now = self.clock.monotonic()
        for slot in [*self._slots, *self._slices.values()]:
            self._check(slot, now)
        for g in self.gpus:
            up = sum(1 for s in self._slices.values() if s.gpu.uuid == g.uuid and s.state.state == UP)
            self.metrics.slices_up(g.index, g.uuid, up)
        self._write_all()
        self._last_check_s = self.clock.monotonic()

    def _check(self, slot: Slot, now: float) -> None:
        """One daemon's check (see the module docstring): looked at while starting, asked
        while up or silent, restarted when due."""
        if slot.start_deadline_s is not None:
            self._keeper.poll_starting((slot,))
            return
        if (slot.state.state == UP or slot.silent_checks) and not self._ask(slot, now):
            return
        if now >= slot.next_start_s:
            self._keeper.start(slot)
            self._keeper.poll_starting((slot,))

    def _ask(self, slot: Slot, now: float) -> bool:
        """Ask ``slot``'s daemon (up, or silent in the last checks): ``False`` when it stays as
        it is (it answers; or it is silent and not killed yet, or its socket was removed while
        its MPS server still serves its clients); ``True`` when it is down and may be restarted
        (killed, a silent one with its restart due ``now``)."""
        problem = slot.daemon.problem()
        if problem is None:
            if slot.state.state != UP:  # it answers again: no restart was needed
                self._keeper.up(slot)
            slot.silent_checks = 0
            return False
        silent = problem.kind == NOT_ANSWERING and slot.daemon.running()
        slot.silent_checks = slot.silent_checks + 1 if silent else 0
        if slot.state.state == UP:
            self._keeper.down(slot, problem, kill=not silent)
        if 0 < slot.silent_checks < SILENT_CHECKS:
            return False  # down (fail closed), not killed yet: its clients keep running
        if slot.silent_checks:
            if not (slot.daemon.pipe / "control").exists() and serves_clients(slot.daemon.pid):
                # its socket was removed: it answers nobody new, but its MPS server still
                # serves the clients it has; it is restarted once that server is gone
                slot.silent_checks = SILENT_CHECKS
                return False
            slot.daemon.kill(0.5)
            slot.silent_checks = 0
            slot.next_start_s = now  # silent long enough: restarted now
        return True

    def run_forever(self, stop_event: threading.Event) -> None:
        """``sync()`` every ``SYNC_S`` seconds and ``check()`` every ``check_s`` seconds until
        ``stop_event`` is set. Does not call ``stop``."""
        check_s = self.options.check_s
        next_check = self.clock.monotonic() + check_s
        while not stop_event.wait(min(check_s, SYNC_S)):
            try:
                if self.clock.monotonic() >= next_check or any(
                        s.start_deadline_s is not None for s in self._slots):  # fmt: skip
                    next_check = self.clock.monotonic() + check_s
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
            self._keeper.set(slot, replace(slot.state, state=DOWN, reason="stopped"))
            self.metrics.up(slot.gpu.index, slot.gpu.uuid, False)
            try:
                self.layout.state(slot.gpu.uuid).unlink(missing_ok=True)
            except OSError as exc:
                logger.warning("MPS state file of GPU {}: {}", slot.gpu.index, exc)
        self.host.tear_down()

    # -- the slices ------------------------------------------------------------------------

    def _add(self, request: SliceRequest) -> None:
        """A new slice: its tmpfs mounted (``shm_mib > 0``), its daemon started."""
        gpu = self._requests.by_uuid[request.gpu_uuid]
        shm_mib = self.options.shm_mib
        shm = self.host.host(self.layout.slice_shm(request.sid))
        spec = SliceSpec(request.sid, request.threads_pct, shm if shm_mib > 0 else None)
        daemon = ControlDaemon(self.layout, gpu.uuid, gpu.index, request.mib,
                               program=self._program, slice_spec=spec)  # fmt: skip
        slot = Slot(gpu, daemon, self.clock.wall(), request)
        self._slices[request.sid] = slot
        logger.info("{}: asked for by {} ({})", slot.what, request.owner, request.holder[:120])
        if shm_mib > 0:
            try:
                shm.mkdir(parents=True, exist_ok=True)
                if not os.path.ismount(shm):  # a restarted supervisor keeps the slice's tmpfs
                    self.host.mount(["-t", "tmpfs", "-o", f"size={shm_mib}m,mode=1777", "tmpfs",
                                     str(shm)], f"mounting slice {request.sid}'s tmpfs at {shm}")  # fmt: skip
            except (MpsError, OSError) as exc:
                self._keeper.down(slot, DaemonError("spawn-failed", str(exc)))
                return
        else:
            self.layout.slice_shm(request.sid).mkdir(parents=True, exist_ok=True)
        self._keeper.start(slot)
        self._keeper.poll_starting((slot,))

    def _drop(self, slot: Slot, *, timeout_s: float = 5.0, forget: bool = True) -> None:
        """A slice no longer asked for (or the supervisor stopping): its daemon stopped, its
        tmpfs unmounted, its folder and state file removed."""
        try:
            if slot.daemon.running():
                with contextlib.suppress(DaemonError):
                    slot.daemon.command("quit", max(0.1, min(2.0, timeout_s / 2)))
            slot.daemon.kill(max(0.1, timeout_s / 2))
            shm = self.host.host(self.layout.slice_shm(slot.sid))
            if os.path.ismount(shm):
                umount(shm, False)
            slot.daemon.stop(0.1)
        except OSError as exc:
            logger.warning("{}: stop: {}", slot.what, exc)
        self.host.remove_slice_folder(slot.sid)
        with contextlib.suppress(OSError):
            self.layout.slice_state(slot.sid).unlink(missing_ok=True)
        self._slices.pop(slot.sid, None)
        if forget:
            logger.info("{}: stopped (its request was removed)", slot.what)

    def _write_all(self) -> None:
        """Every state, with a fresh heartbeat. Raises ``OSError``."""
        for slot in [*self._slots, *self._slices.values()]:
            self._keeper.write(slot)

"""One CUDA MPS control daemon (a slice's, or a shared GPU's probe): started, asked, stopped.

``ControlDaemon`` runs ``<control> -f`` (NVIDIA's ``nvidia-cuda-mps-control`` in the
foreground) with ``CUDA_VISIBLE_DEVICES`` the GPU's UUID (the daemon sees it as device 0),
``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` its folders under the layout's root
(``core.allocation.mps.Layout``: ``<root>/slices/<slice id>`` for a slice, ``<root>/<GPU UUID>`` for a
GPU's probe), in a session of its own (so that stopping it reaches the MPS servers it spawns),
its stdout and stderr appended to ``<log>/supervisor-daemon.log``. It is asked through the same
program's client mode (``<control>`` with the command on stdin), as an operator would.

Shared memory of its own: given ``shm`` (the slice's tmpfs, mounted by the supervisor), the
daemon runs in a mount namespace of its own (``unshare --mount --propagation private``) with
that tmpfs bound over its ``/dev/shm``, which the MPS servers it spawns inherit; the slice's
clients get the same tmpfs as their ``/dev/shm``. One tenant can fill only its own.

A restart keeps the folders: ``start`` empties the pipe folder of a dead daemon's sockets but
never removes the folder itself, so that a client container's bind mount of it (the same
inode) sees the new daemon's sockets: its next CUDA process reaches the restarted daemon.

Folder modes: ``<root>/<GPU UUID>``, its ``pipe`` and ``log`` are ``0o755`` whatever the umask:
a client container of any uid must be able to reach the daemon's sockets in ``pipe`` (the
sockets' own modes are the daemon's); only the supervisor writes there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..core.allocation.mps import LOG_ENV, PIPE_ENV, Layout, limit_value

__all__ = [
    "DIR_MODE",
    "EXITED",
    "LIMIT_NOT_SET",
    "NOT_ANSWERING",
    "REASONS",
    "SPAWN_FAILED",
    "START_TIMEOUT",
    "ControlDaemon",
    "DaemonError",
    "DaemonProgram",
    "SliceSpec",
    "parse_limit_mib",
    "serves_clients",
]

#: the mode of a daemon's folders (see the module docstring)
DIR_MODE = 0o755

#: why a daemon is down: a small fixed set (a metrics label)
SPAWN_FAILED = "spawn-failed"  # the program could not be run (not found, not executable)
EXITED = "exited"  # the process is gone
NOT_ANSWERING = "not-answering"  # running, but its control socket does not answer
START_TIMEOUT = "start-timeout"  # never answered within the start timeout
LIMIT_NOT_SET = "limit-not-set"  # the default pinned-memory limit could not be set or read back
REASONS = (SPAWN_FAILED, EXITED, NOT_ANSWERING, START_TIMEOUT, LIMIT_NOT_SET)

_LIMIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_MIB_PER = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}


class DaemonError(Exception):
    """A daemon is not usable: ``kind`` is one of ``REASONS``, ``detail`` says more (one line,
    at most 200 characters). ``str()``: ``"<kind>: <detail>"``."""

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = " ".join(detail.split())[:200]
        super().__init__(f"{kind}: {self.detail}" if self.detail else kind)


def parse_limit_mib(text: str) -> int | None:
    """A pinned-memory limit as the control daemon prints it (``8192M``, ``8G``, ``8 GB``, a
    plain number of bytes), in MiB, rounded down; ``None`` for anything else."""
    m = _LIMIT.match(text)
    if not m:
        return None
    return int(float(m.group(1)) * _MIB_PER[m.group(2).upper()])


@dataclass(frozen=True, slots=True)
class DaemonProgram:
    """How a control daemon is run and asked: ``control``, the program (a path, or a name on
    ``PATH``); ``answer_timeout_s``, how long one client command may take, seconds; ``env``, the
    environment its processes get besides the MPS variables (``None``: this process's ``PATH``
    and ``HOME``)."""

    control: str = "nvidia-cuda-mps-control"
    answer_timeout_s: float = 2.0
    env: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """What makes a daemon a slice's: ``sid``, the slice ID (its folder
    ``<root>/slices/<sid>``); ``threads_pct``, the default active-thread percentage (``None``:
    the daemon's own); ``shm``, a tmpfs to bind over the daemon's ``/dev/shm`` in a mount
    namespace of its own (``None``: the supervisor's ``/dev/shm``)."""

    sid: str
    threads_pct: int | None = None
    shm: Path | None = None


class ControlDaemon:
    """An MPS control daemon on GPU ``uuid`` (NVML ``index``) under ``layout``, run as
    ``program`` says (``DaemonProgram``; its defaults when ``None``), given the default pinned-memory limit ``limit_mib``
    (MiB per client, device 0: the slice; the probe's, ``core.allocation.mps.probe_limit_mib``).
    ``slice_spec``: the slice it serves, its active-thread percentage and its ``/dev/shm``
    (``SliceSpec``; ``None``: the GPU's probe). Raises ``ValueError`` for a bad UUID or slice
    ID.

    Not thread-safe: one owner (the ``Supervisor``) calls it."""

    def __init__(self, layout: Layout, uuid: str, index: int, limit_mib: int, *,
                 program: DaemonProgram | None = None,
                 slice_spec: SliceSpec | None = None) -> None:  # fmt: skip
        self.layout = layout
        self.uuid = uuid
        self.index = index
        self.limit_mib = limit_mib
        program = program if program is not None else DaemonProgram()
        self.control = program.control
        self.answer_timeout_s = program.answer_timeout_s
        self.sid = slice_spec.sid if slice_spec is not None else ""
        self.threads_pct = slice_spec.threads_pct if slice_spec is not None else None
        self.shm = slice_spec.shm if slice_spec is not None else None
        layout.gpu_dir(uuid)  # raises ValueError for a bad UUID
        self.folder = layout.slice_dir(self.sid) if self.sid else layout.gpu_dir(uuid)
        self.pipe = self.folder / "pipe"
        self.log = self.folder / "log"
        base = program.env if program.env is not None else {
            k: v for k, v in os.environ.items() if k in ("PATH", "HOME")
        }  # fmt: skip
        self.env = {
            **base,
            "CUDA_VISIBLE_DEVICES": uuid,
            PIPE_ENV: str(self.pipe),
            LOG_ENV: str(self.log),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The daemon's process id while one was started (``None`` before)."""
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        """Whether the process started last is still running (not reaped)."""
        return self.proc is not None and self.proc.poll() is None

    def argv(self) -> list[str]:
        """The daemon's command line: ``<control> -f``, in a mount namespace of its own with
        ``shm`` bound over ``/dev/shm`` when ``shm`` is set (``unshare`` execs ``sh``, which
        execs the daemon: one pid)."""
        if self.shm is None:
            return [self.control, "-f"]
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                'mount --bind "$0" /dev/shm && exec "$1" -f', str(self.shm), self.control]  # fmt: skip

    def start(self) -> None:
        """Start the daemon (``argv``): any earlier process of it killed first, its folders made
        (``DIR_MODE``). The pipe folder is kept, only emptied of a dead daemon's sockets: a
        client container's bind mount of it sees the new daemon. Returns at once
        (``wait_ready`` waits for it). Raises ``DaemonError`` (``SPAWN_FAILED``) when the
        program cannot be run, ``OSError`` when the folders cannot be made."""
        self.kill()
        for path in (self.folder, self.pipe, self.log):
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, DIR_MODE)
        for entry in os.scandir(self.pipe):  # a dead daemon's sockets and pid file
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        self._out = open(self.log / "supervisor-daemon.log", "ab")  # noqa: SIM115 (kept open)
        try:
            self.proc = subprocess.Popen(
                self.argv(), env=self.env, stdin=subprocess.DEVNULL, stdout=self._out,
                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
            )  # fmt: skip
        except OSError as exc:
            self._close_out()
            raise DaemonError(SPAWN_FAILED, f"{self.control}: {exc.strerror or exc}") from None

    def command(self, line: str, timeout_s: float | None = None) -> str:
        """Send one command (``get_server_list``) through the client mode; its answer, stripped.
        Raises ``DaemonError`` (``NOT_ANSWERING``) when the client fails or takes longer than
        ``timeout_s`` (default ``answer_timeout_s``)."""
        try:
            done = subprocess.run(
                [self.control], input=line + "\n", env=self.env, capture_output=True, text=True,
                timeout=timeout_s or self.answer_timeout_s, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise DaemonError(NOT_ANSWERING, f"'{line}' got no answer in time") from None
        except OSError as exc:
            raise DaemonError(SPAWN_FAILED, f"{self.control}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise DaemonError(
                NOT_ANSWERING,
                f"'{line}': client exit {done.returncode}" + (f": {said[-1]}" if said else ""),
            )
        return done.stdout.strip()

    def problem(self) -> DaemonError | None:
        """Why the daemon is not usable now (``EXITED``, ``NOT_ANSWERING``...), or ``None``: its
        process runs and a command (``get_server_list``) answers."""
        if self.proc is None:
            return DaemonError(EXITED, "never started")
        code = self.proc.poll()
        if code is not None:
            return DaemonError(EXITED, f"status {code}{self._last_words()}")
        try:
            self.command("get_server_list")
        except DaemonError as exc:
            return exc
        return None

    def alive(self) -> bool:
        """Whether the process runs and answers a command (``problem()`` is ``None``)."""
        return self.problem() is None

    def configure(self) -> None:
        """Set the default pinned-memory limit of device 0 to ``limit_mib`` and read it back;
        with ``threads_pct``, the default active-thread percentage too. Raises
        ``DaemonError``: ``LIMIT_NOT_SET`` when the daemon refuses either or reads back another
        value, ``NOT_ANSWERING`` when it does not answer."""
        value = limit_value(self.limit_mib)
        said = self.command(f"set_default_device_pinned_mem_limit 0 {value}")
        got = self.command("get_default_device_pinned_mem_limit 0")
        if parse_limit_mib(got.splitlines()[-1] if got else "") != self.limit_mib:
            raise DaemonError(
                LIMIT_NOT_SET, f"set {value} (answer {said[:60]!r}), read back {got[:60]!r}"
            )
        if self.threads_pct is not None:
            said = self.command(f"set_default_active_thread_percentage {self.threads_pct}")
            got = self.command("get_default_active_thread_percentage")
            try:
                read = float((got.splitlines() or [""])[-1])
            except ValueError:
                read = -1.0
            if round(read) != self.threads_pct:
                raise DaemonError(LIMIT_NOT_SET, f"active threads {self.threads_pct} (answer "
                                                 f"{said[:60]!r}), read back {got[:60]!r}")  # fmt: skip

    def wait_ready(self, timeout_s: float, *, poll_s: float = 0.05) -> None:
        """Wait until the daemon answers (at most ``timeout_s`` seconds), then ``configure``.
        Raises ``DaemonError``: ``EXITED`` when the process ends, ``START_TIMEOUT`` when it
        never answers, or what ``configure`` raises."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.ready_once() is not None:
                return
            if time.monotonic() >= deadline:
                raise DaemonError(START_TIMEOUT, f"no answer within {timeout_s:g}s")
            time.sleep(poll_s)

    def ready_once(self) -> bool | None:
        """One look at a starting daemon: ``True`` when it answers and is configured now,
        ``None`` when it does not answer yet. Raises ``DaemonError`` when it exited or could
        not be configured."""
        if self.proc is None or self.proc.poll() is not None:
            raise self.problem() or DaemonError(EXITED, "")
        try:
            self.command("get_server_list", min(self.answer_timeout_s, 1.0))
        except DaemonError:
            return None
        self.configure()
        return True

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the daemon to ``quit``, wait for it (at most ``timeout_s`` seconds in all), then
        SIGTERM and SIGKILL its session (its MPS servers with it); its folder is removed (but a
        mount in it: the supervisor unmounts a slice's tmpfs first). Never raises for a daemon
        already gone."""
        deadline = time.monotonic() + timeout_s
        if self.running():
            try:
                self.command("quit", max(0.1, min(2.0, timeout_s / 2)))
            except DaemonError:
                pass
            self._wait(deadline - time.monotonic())
        self.kill(max(0.1, deadline - time.monotonic()))
        shutil.rmtree(self.folder, ignore_errors=True)

    def kill(self, grace_s: float = 1.0) -> None:
        """SIGTERM the daemon's session, SIGKILL it after ``grace_s`` seconds if it still runs,
        and reap it. Nothing to do when none was started."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            self._wait(grace_s)
        self._signal(signal.SIGKILL)  # the process and whatever of its session is left
        self._wait(5.0)
        self._close_out()

    def _signal(self, sig: int) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            os.killpg(proc.pid, sig)  # its session's group: start_new_session made it leader
        except (ProcessLookupError, PermissionError):
            if proc.poll() is None:
                proc.send_signal(sig)

    def _wait(self, timeout_s: float) -> None:
        if self.proc is None:
            return
        try:
            self.proc.wait(max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            pass

    def _close_out(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def _last_words(self) -> str:
        """The last line the daemon wrote to its output log, as ``': <line>'``, or empty."""
        path: Path = self.log / "supervisor-daemon.log"
        try:
            with open(path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 512))
                lines = f.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return f": {lines[-1][-150:]}" if lines else ""


def serves_clients(pid: int | None) -> bool:
    """Whether the process ``pid`` (a control daemon) has a child still running, not a zombie
    (its MPS server: the daemon spawns one per user while clients are connected), from
    ``/proc/<pid>/task/*/children`` and each child's ``/proc/<child>/stat``. ``None``: no."""
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

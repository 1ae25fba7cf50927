"""Processes of the dev cluster: started in their own session (``start_new_session``: pid =
process group id), known by pid and start time, stopped with ``killpg``; and ``wait_until``,
the one readiness helper.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from devtools.devcluster.state import DevClusterError, Proc

STOP_TIMEOUT_S = 10.0
KILL_TIMEOUT_S = 5.0
POLL_S = 0.1


def log(msg: str) -> None:
    """One progress line on stderr, ``[dev-cluster HH:MM:SS] msg`` (stdout is for ``export``)."""
    print(f"[dev-cluster {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, process group id, start time in ticks)`` from ``/proc/<pid>/stat``; None when
    there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm (field 2) may hold spaces and parentheses: the fields after it follow the last ")"
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[2]), int(fields[19])


def identify(pid: int, argv: Sequence[str]) -> Proc:
    """The ``Proc`` of a process just started. Raises ``DevClusterError`` when it is gone."""
    st = _stat(pid)
    if st is None:
        raise DevClusterError(f"{argv[0]} (pid {pid}) exited at once")
    return Proc(pid, st[2], tuple(argv))


def _reap(pid: int) -> None:
    """Collect the exit status when ``pid`` is our own child (started in this process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def alive(proc: Proc | None) -> bool:
    """True while ``proc`` runs: a process with its pid and start time exists and is no zombie
    (a reused pid has another start time)."""
    if proc is None:
        return False
    _reap(proc.pid)
    st = _stat(proc.pid)
    return st is not None and st[0] != "Z" and st[2] == proc.start_ticks


def _group_exists(pgid: int) -> bool:
    """True while any process of group ``pgid`` is alive (zombies do not count)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st is not None and st[1] == pgid and st[0] != "Z":
                return True
    return False


def spawn(
    name: str, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> Proc:
    """Start ``argv`` detached: its own session and process group, stdin from /dev/null, stdout
    and stderr appended to ``log_path``, the environment ``env`` (None: ours). Returns its
    ``Proc``; raises ``DevClusterError`` when it cannot be started."""
    try:
        with open(log_path, "ab") as out:
            p = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                env=None if env is None else dict(env),
            )
    except OSError as e:
        raise DevClusterError(f"could not start {name}: {e}") from e
    proc = identify(p.pid, argv)
    # the supervisor may exit before it: nobody waits on it here (``alive`` reaps it if we are
    # still its parent); keep the Popen object from warning that it still runs
    p.returncode = 0
    return proc


def stop(name: str, proc: Proc | None) -> None:
    """Stop ``proc`` and everything in its process group: SIGTERM, then SIGKILL after
    ``STOP_TIMEOUT_S``. Nothing is signalled unless ``proc`` is still the process that was
    started (same pid and start time)."""
    if not alive(proc):
        return
    assert proc is not None
    log(f"stopping {name} (pid {proc.pid})")
    for sig, timeout_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, KILL_TIMEOUT_S)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            wait_until(
                f"{name} to stop",
                lambda: not alive(proc) and not _group_exists(proc.pid),
                timeout_s,
            )
            return
        except DevClusterError:
            if sig == signal.SIGTERM:
                log(f"{name} did not stop in {timeout_s:.0f} s; SIGKILL")
    raise DevClusterError(f"{name} (pid {proc.pid}) still runs after SIGKILL")


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ('' when there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


#: a component's last words, as klog, containerd (logrus) and etcd (zap) write them
_FATAL = re.compile(r'"command failed"|^F\d{4} |level=fatal|"level":"fatal"|^Error: ')


def why(log_path: Path) -> str:
    """The reason a component gave for exiting, one line: the last line of ``log_path`` that
    says it failed (klog's ``"command failed" err=...`` or an ``F`` line, logrus's
    ``level=fatal``, zap's ``"level":"fatal"``, cobra's ``Error:``); ``""`` when none does."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    found = [line for line in lines[-200:] if _FATAL.search(line)]
    if not found:
        return ""
    line = found[-1].strip()
    m = re.search(r'err="(.*)"\s*$', line)
    return (m.group(1) if m else line)[:400]


def wait_until(
    what: str,
    ready: Callable[[], bool],
    timeout_s: float,
    *,
    proc: Proc | None = None,
    log_path: Path | None = None,
    poll_s: float = POLL_S,
) -> float:
    """Call ``ready()`` every ``poll_s`` until it returns True; returns the seconds it took.
    Raises ``DevClusterError`` (with the tail of ``log_path``) when ``timeout_s`` passes first,
    or when ``proc`` (the process that should become ready) exits, then saying in the same line
    the reason it gave (``why``: a kubelet refusing cgroup v1, a port taken). ``ready`` raising ``OSError``
    counts as not ready."""
    start = time.monotonic()
    where = f" (log: {log_path})" if log_path else ""
    while True:
        try:
            if ready():
                return time.monotonic() - start
        except OSError:
            pass
        if proc is not None and not alive(proc):
            reason = ""
            if log_path:
                print(tail(log_path), file=sys.stderr)
                reason = why(log_path)
            name = Path(proc.argv[0]).name
            raise DevClusterError(f"{what}: {name} exited{f': {reason}' if reason else ''}{where}")
        if time.monotonic() - start >= timeout_s:
            if log_path:
                print(tail(log_path), file=sys.stderr)
            raise DevClusterError(f"{what}: not after {timeout_s:g} s{where}")
        time.sleep(poll_s)


def https_ok(url: str) -> bool:
    """True when ``url`` (a component's /healthz, self-signed: not verified) answers ``ok``.
    Raises ``OSError`` when nothing answers."""
    ctx = ssl._create_unverified_context()
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
            return bytes(r.read()).strip() == b"ok"
    except http.client.HTTPException as e:
        raise OSError(str(e)) from e


def free_port(avoid: Sequence[int] = ()) -> int:
    """A TCP port free on 127.0.0.1 now, not in ``avoid``."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in avoid:
            return port


def run(
    argv: Sequence[str], *, check: bool = True, quiet: bool = False, **kw: Any
) -> subprocess.CompletedProcess[str]:
    """Run a helper command (openssl, ctr, ip, iptables) to the end: stdout captured (unless
    ``stdout=`` says otherwise), stderr to ours (``quiet``: to /dev/null). Raises
    ``DevClusterError`` when ``check`` and it fails, or when it cannot be started."""
    opts: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE, "text": True}
    if quiet:
        opts["stderr"] = subprocess.DEVNULL
    opts.update(kw)
    try:
        res = subprocess.run(list(argv), check=False, **opts)
    except OSError as e:
        raise DevClusterError(f"{argv[0]}: {e}") from e
    if check and res.returncode != 0:
        raise DevClusterError(f"{' '.join(argv)} exited {res.returncode}")
    return res

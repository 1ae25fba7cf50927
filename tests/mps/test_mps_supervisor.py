"""``omaticaya mps`` (issues 39, 47): a probe CUDA MPS control daemon per shared GPU and one
daemon per slice asked for, supervised, run against the stand-in of ``nvidia-cuda-mps-control``
(devtools/mps-standin: real processes, real sockets; nothing of ours mocked). The probes come
up with one unit as their default limit, their states are what the device plugin reads
(``sources.mps.read_state``), a daemon killed is said down and restarted, one that cannot start
backs off, ``/readyz`` follows them, and ``stop`` (SIGTERM for the command) leaves no folder
behind. The slices' daemons: tests/mps/test_mps_slices.py."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from omaticaya_py.core.allocation.mps import DOWN, UP, Layout, probe_limit_mib
from omaticaya_py.mps import metrics
from omaticaya_py.mps.daemon import (
    EXITED,
    NOT_ANSWERING,
    SPAWN_FAILED,
    ControlDaemon,
    DaemonProgram,
)
from omaticaya_py.mps.supervisor import Clock, Gpu, MpsError, Supervisor, SupervisorOptions
from omaticaya_py.sources.mps import MpsWatch, read_state
from tests.helpers import MULTI_TRACE, free_port, run_cli
from tests.mps_rig import STANDIN, Running
from tests.waiting import wait_for

# not in `scripts/test --quick`: real MPS stand-in daemons under the supervisor (processes, sockets)
pytestmark = pytest.mark.slow

UUID0 = "GPU-00000000-0000-0000-0000-000000000001"
UUID1 = "GPU-00000000-0000-0000-0000-000000000002"
GPUS = (Gpu(0, UUID0, 79), Gpu(1, UUID1, 40))
UNIT_MIB = 1024


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A short temporary folder: a unix socket's path is at most 107 bytes, and pytest's
    ``tmp_path`` with a GPU UUID and ``pipe/control`` under it is longer (the real daemon has
    the same bound)."""
    path = Path(tempfile.mkdtemp(prefix="om-mps-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _layout(tmp: Path) -> Layout:
    return Layout(tmp / "run" / "omaticaya" / "mps", tmp / "state" / "mps")


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_probes_come_up_with_one_unit_as_limit_and_stop_leaves_nothing(tmp: Path):
    before = _tree(tmp)
    layout = _layout(tmp)
    sup = Supervisor(layout, GPUS, UNIT_MIB,
                     SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=5, shm_mib=0))  # fmt: skip
    with Running(sup):
        for g in GPUS:
            state, problem = read_state(layout, g.uuid)
            assert problem is None and state is not None
            assert (state.state, state.index, state.starts) == (UP, g.index, 1)
            # a probe's limit is one unit: no client is given it, and one that found it could
            # hold no more than the least slice
            assert state.limit_mib == probe_limit_mib(UNIT_MIB) == UNIT_MIB
            assert state.pid is not None and state.reason == ""
            # what the daemon holds, asked as an operator would
            asked = ControlDaemon(layout, g.uuid, g.index, 1, program=DaemonProgram(str(STANDIN)))
            assert asked.command("get_default_device_pinned_mem_limit 0") == f"{UNIT_MIB}M"
            assert stat.S_IMODE(os.stat(layout.pipe(g.uuid)).st_mode) == 0o755
            assert (layout.pipe(g.uuid) / "control").exists()
        assert layout.slices_dir.is_dir() and layout.requests_dir.is_dir()
        assert layout.lock.exists()
        # the device plugin's view: enforced, with fresh heartbeats
        watch = MpsWatch(layout, stale_after_s=5, min_interval_s=0)
        assert all(watch.enforcement(g.uuid).up for g in GPUS)
        first = read_state(layout, UUID0)[0]
        assert first is not None
        wait_for("a newer heartbeat", lambda: (s := read_state(layout, UUID0)[0]) is not None
                 and s.heartbeat_s > first.heartbeat_s)  # fmt: skip
        text = generate_latest(sup.metrics.registry).decode()
        for g in GPUS:
            assert f'omaticaya_mps_daemon_up{{gpu="{g.index}",uuid="{g.uuid}"}} 1.0' in text
            assert (
                f'omaticaya_mps_daemon_starts_total{{gpu="{g.index}",uuid="{g.uuid}"}} 1.0' in text
            )
        assert sup.ready() == (True, "ok")
        pids = [s.pid for s in sup.states().values()]
    # stopped: the daemons gone, no state file, no folder it made
    assert _tree(tmp) == before == []
    for pid in pids:
        assert pid is not None
        wait_for(f"daemon {pid} gone", lambda pid=pid: not Path(f"/proc/{pid}").exists(), 5)


def test_stop_removes_a_slice_folder_no_daemon_owns_with_what_is_in_it(tmp: Path):
    """A slice folder the supervisor does not track at its stop (its daemon's quiet removal
    failed, or a supervisor that died left it and no request names it now) is swept: before,
    ``<root>/slices`` stayed (ENOTEMPTY) and with it the root and ``/run/omaticaya``, as seen
    once after ``helm uninstall`` in CI. A folder not named as a slice is not ours: left."""
    layout = _layout(tmp)
    sup = Supervisor(layout, GPUS, UNIT_MIB,
                     SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=5, shm_mib=0))  # fmt: skip
    with Running(sup):
        left = layout.slice_dir("0123456789abcdef")
        for sub, name in (("pipe", "control"), ("shm", "cuda.shm.1"), ("log", "control.log")):
            (left / sub).mkdir(parents=True)
            (left / sub / name).write_text("x")
    assert _tree(tmp) == []


def test_a_slice_folder_that_stays_is_logged_with_the_reason(tmp: Path, monkeypatch):
    """What cannot be removed is tried again (``REMOVE_TRIES``), then logged with the folder
    and the reason, and ``stop`` goes on (the rest is removed as far as it can be)."""
    from loguru import logger

    from omaticaya_py.mps import host as host_mod

    layout = _layout(tmp)
    sup = Supervisor(layout, GPUS, UNIT_MIB,
                     SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=5, shm_mib=0))  # fmt: skip
    tries = []

    def busy(path, *args, **kwargs):
        tries.append(path)
        raise OSError(16, "Device or resource busy")

    said: list[str] = []
    sink = logger.add(lambda m: said.append(str(m)), level="WARNING")
    try:
        with Running(sup):
            layout.slice_dir("fedcba9876543210").mkdir(parents=True)
            monkeypatch.setattr(host_mod.shutil, "rmtree", busy)
    finally:
        logger.remove(sink)
    # (shutil is one module: the probes' own removals are refused too)
    assert [t for t in tries if str(t).endswith("fedcba9876543210")] == [
        layout.slice_dir("fedcba9876543210")
    ] * host_mod.REMOVE_TRIES
    assert any("cannot remove slice fedcba9876543210's folder" in m and "busy" in m
               for m in said), said  # fmt: skip


def test_a_killed_daemon_is_said_down_restarted_and_readyz_follows(tmp: Path):
    layout = _layout(tmp)
    # check_s 0.5: the first restart waits 1 s (check_s * 2), long enough to be seen down
    sup = Supervisor(layout, GPUS, UNIT_MIB,
                     SupervisorOptions(str(STANDIN), check_s=0.5, start_timeout_s=5, shm_mib=0))  # fmt: skip
    server = metrics.serve(sup.metrics.registry, sup.healthy, sup.ready, "127.0.0.1", 0)
    try:
        with Running(sup):
            assert _get(server.port, "/readyz")[0] == 200
            assert _get(server.port, "/healthz")[0] == 200
            before = sup.states()
            pid0 = before[UUID0].pid
            assert pid0 is not None
            os.kill(pid0, signal.SIGKILL)
            down = wait_for("GPU 0's state down", lambda: (s := read_state(layout, UUID0)[0])
                            is not None and s.state == DOWN and s, 5, 0.02)  # fmt: skip
            assert down.reason.startswith(EXITED), down.reason
            code, body = _get(server.port, "/readyz")
            assert code == 503 and "gpu 0 down" in body, body
            assert not MpsWatch(layout, 5, min_interval_s=0).enforcement(UUID0).up
            up = wait_for("GPU 0 up again", lambda: (s := read_state(layout, UUID0)[0])
                          is not None and s.state == UP and s, 10)  # fmt: skip
            assert up.starts == 2 and up.pid not in (None, pid0)
            other = read_state(layout, UUID1)[0]
            assert other is not None
            assert (other.state, other.starts, other.pid) == (UP, 1, before[UUID1].pid)
            wait_for("/readyz 200", lambda: _get(server.port, "/readyz")[0] == 200, 5)
            text = _get(server.port, "/metrics")[1]
            assert f'omaticaya_mps_daemon_starts_total{{gpu="0",uuid="{UUID0}"}} 2.0' in text
            assert f'omaticaya_mps_daemon_starts_total{{gpu="1",uuid="{UUID1}"}} 1.0' in text
            assert (f'omaticaya_mps_daemon_failures_total{{gpu="0",reason="exited",uuid="{UUID0}"}}'
                    " 1.0") in text  # fmt: skip
    finally:
        server.shutdown()
    assert _tree(tmp) == []


def test_a_daemon_that_cannot_start_stays_down_and_backs_off(tmp: Path):
    failing = tmp / "bin" / "failing-control"
    failing.parent.mkdir()
    failing.write_text("#!/bin/sh\necho 'no GPU here' >&2\nexit 1\n")
    failing.chmod(0o755)
    layout = _layout(tmp)
    sup = Supervisor(layout, GPUS[:1], UNIT_MIB,
                     SupervisorOptions(str(failing), check_s=0.05, start_timeout_s=2, shm_mib=0))  # fmt: skip
    running = Running(sup)
    with running:
        state = read_state(layout, UUID0)[0]
        assert state is not None and state.state == DOWN
        assert state.reason.startswith(EXITED) and "no GPU here" in state.reason, state.reason
        assert sup.ready()[0] is False
        # 1.5 s of checks every 0.05 s: back-off 0.1, 0.2, 0.4, 0.8 s gives about 5 starts,
        # none would give about 30
        running.stop_event.wait(1.5)
        starts = sup.states()[UUID0].starts
        assert 2 <= starts <= 7, starts
        assert sup.states()[UUID0].state == DOWN
    assert _tree(tmp) == ["bin", "bin/failing-control"]


def test_a_control_program_that_is_not_there_is_said(tmp: Path):
    layout = _layout(tmp)
    sup = Supervisor(layout, GPUS[:1], UNIT_MIB,
                     SupervisorOptions(str(tmp / "nowhere"), check_s=0.05, start_timeout_s=1, shm_mib=0))  # fmt: skip
    sup.start()
    try:
        state = read_state(layout, UUID0)[0]
        assert state is not None and state.state == DOWN and state.reason.startswith(SPAWN_FAILED)
        assert "nowhere" in state.reason
    finally:
        sup.stop()
    assert _tree(tmp) == []


def _is_mount(path: Path) -> bool:
    """Whether ``path`` is a mount point (``/proc/self/mountinfo``: a bind mount of a folder of
    the same file system is one, which ``os.path.ismount`` cannot tell)."""
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


def test_the_host_root_seen_elsewhere_is_bound_at_the_roots_path(tmp: Path):
    """As in the chart: the host's folder is seen at another path (``host_root``, the host's
    /run at /host/run); the folders are made there and bound at the root's path, so the
    daemons' pipe folders have the clients' paths; at stop nothing is mounted and no folder is
    left on either side. Needs CAP_SYS_ADMIN (CI runs as root); without it ``start`` says so."""
    host_root = tmp / "host" / "run" / "omaticaya" / "mps"
    (tmp / "host" / "run").mkdir(parents=True)
    (tmp / "ctr").mkdir()
    layout = Layout(tmp / "ctr" / "omaticaya" / "mps", tmp / "state")
    sup = Supervisor(layout, GPUS[:1], UNIT_MIB,
                     SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=5, shm_mib=8, host_root=host_root))  # fmt: skip
    try:
        sup.start()
    except MpsError as exc:  # no CAP_SYS_ADMIN here
        assert "CAP_SYS_ADMIN" in str(exc)
    else:
        try:
            assert sup.states()[UUID0].state == UP
            assert _is_mount(layout.root)
            # the daemon listens where a client is told to look, and that is the host's folder
            assert (layout.pipe(UUID0) / "control").is_socket()
            assert (host_root / UUID0 / "pipe" / "control").is_socket()
        finally:
            sup.stop()
        assert not _is_mount(layout.root)
    assert _tree(tmp) == ["ctr", "host", "host/run"]


def _mps_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("OMATICAYA_") and k != "NODE_NAME"
    }
    return {
        **env,
        "OMATICAYA_TRACE": str(MULTI_TRACE),
        "OMATICAYA_SHARED_GPUS": "0-1",
        "OMATICAYA_MPS_CONTROL": str(STANDIN),
        "OMATICAYA_MPS_ROOT": str(tmp / "run" / "omaticaya" / "mps"),
        "OMATICAYA_MPS_STATE_DIR": str(tmp / "state"),
        "OMATICAYA_MPS_SHM_MIB": "0",
        "OMATICAYA_MPS_CHECK_S": "0.2",
        **extra,
    }


def _start_cli(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "omaticaya_py", "mps"], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def _sigterm(proc: subprocess.Popen[str]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    return proc.returncode, out


def test_the_command_runs_the_trace_s_shared_gpus_until_sigterm(tmp: Path):
    from omaticaya_py.sources.replay import TraceReader

    gpus = {g.index: g for g in TraceReader(MULTI_TRACE, at_s=0).read().gpus}
    port = free_port()
    proc = _start_cli(_mps_env(tmp, OMATICAYA_MPS_METRICS_PORT=str(port)))
    try:
        layout = Layout(tmp / "run" / "omaticaya" / "mps", tmp / "state")
        for index in (0, 1):
            uuid = gpus[index].uuid
            assert uuid is not None
            state = wait_for(f"GPU {index} up", lambda uuid=uuid: (s := read_state(layout, uuid)[0])
                             is not None and s.state == UP and s, 15)  # fmt: skip
            assert state.limit_mib == 1024  # a probe: one unit
        assert sorted(p.name for p in layout.state_dir.iterdir()) == sorted(
            [f"{gpus[i].uuid}.json" for i in (0, 1)] + ["slices", "supervisor.lock"]
        )  # GPUs 2-7 are not shared
        assert wait_for("/readyz 200", lambda: _get(port, "/readyz")[0] == 200, 10)
        assert "omaticaya_mps_daemon_up" in _get(port, "/metrics")[1]
    finally:
        code, out = _sigterm(proc)
    assert code == 0, out
    assert _tree(tmp) == [], out


def test_the_command_idles_ready_without_a_shared_gpu(tmp: Path):
    port = free_port()
    env = _mps_env(tmp, OMATICAYA_SHARED_GPUS="none", OMATICAYA_MPS_METRICS_PORT=str(port))
    proc = _start_cli(env)
    try:
        assert wait_for("/readyz 200", lambda: _get(port, "/readyz")[0] == 200, 15)
        assert "no shared GPU" in _get(port, "/readyz")[1]
    finally:
        code, out = _sigterm(proc)
    assert code == 0, out
    assert "no MPS daemon to run" in out
    assert _tree(tmp) == []


@pytest.mark.parametrize(
    ("variable", "value"),
    [("OMATICAYA_MPS_CHECK_S", "abc"), ("OMATICAYA_MPS_SHM_MIB", "-1"),
     ("OMATICAYA_MPS_ROOT", "relative/mps")],
)  # fmt: skip
def test_a_bad_variable_is_named(tmp: Path, variable: str, value: str):
    done = run_cli("mps", env=_mps_env(tmp, **{variable: value}))
    assert done.returncode == 2, done.stderr
    assert f"omaticaya mps: invalid setting {variable}=" in done.stderr
    assert "Traceback" not in done.stderr
    assert _tree(tmp) == []


def test_heartbeats_are_on_the_wall_clock_given(tmp: Path):
    layout = _layout(tmp)
    sup = Supervisor(layout, GPUS[:1], UNIT_MIB,
                     SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=5, shm_mib=0), clock=Clock(wall=lambda: 1000.0))  # fmt: skip
    sup.start()
    try:
        state = read_state(layout, UUID0)[0]
        assert state is not None and state.heartbeat_s == 1000.0 and state.state == UP
        sup.check()
        assert time.time() > 1000.0  # the heartbeat is the clock given, not the machine's
        assert read_state(layout, UUID0)[0] == state
    finally:
        sup.stop()


def test_a_stopped_daemon_is_down_at_once_and_kept_when_it_answers_again(tmp: Path):
    """A running daemon that does not answer (SIGSTOP: a node too busy to answer in time) is
    down at once, fail closed, but not killed before ``SILENT_CHECKS`` checks: its clients'
    MPS server lives on, and when it answers again it is up without a restart."""
    layout = _layout(tmp)
    sup = Supervisor(layout, GPUS[:1], UNIT_MIB,
                     SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=5, shm_mib=0))  # fmt: skip
    with Running(sup):
        pid = sup.states()[UUID0].pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            down = wait_for("GPU 0 down", lambda: (s := read_state(layout, UUID0)[0]) is not None
                            and s.state == DOWN and s, 10, 0.02)  # fmt: skip
            assert down.reason.startswith(NOT_ANSWERING) and down.pid == pid, down
        finally:
            os.kill(pid, signal.SIGCONT)
        up = wait_for("GPU 0 up again", lambda: (s := read_state(layout, UUID0)[0]) is not None
                      and s.state == UP and s, 10)  # fmt: skip
        assert (up.pid, up.starts) == (pid, 1)
    assert _tree(tmp) == []

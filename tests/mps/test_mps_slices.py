"""One CUDA MPS control daemon per slice (issue 47, items 1, 3, 4 and 8), against the stand-in
of ``nvidia-cuda-mps-control`` (devtools/mps-standin: real processes, real sockets, its
``start_server`` a real child process standing for an MPS server with clients).

- a slice's daemon has the slice as its default pinned-memory limit (the limit a client's own
  variable can only lower: the tenant cannot raise it), its folder of its own, and goes with
  its request;
- a restarted daemon keeps its pipe folder (the same inode a client container's bind mount
  holds) and the client finds the new daemon there;
- a supervisor that dies is seen at once by its lock, not once its heartbeats go stale;
- a removed control socket does not get a daemon killed while its server serves clients;
- each slice has a tmpfs of its own as its daemon's ``/dev/shm`` (where this runs with
  CAP_SYS_ADMIN: CI runs as root), kept across a restart of the supervisor;
- bad requests are skipped, counted and answered.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from omaticaya_py.core.allocation.mps import (
    DOWN,
    SUPERVISOR_GONE,
    UP,
    Layout,
    SliceRequest,
    client_spec,
    parse_request,
    request_json,
    slice_id,
)
from omaticaya_py.mps.daemon import NOT_ANSWERING, ControlDaemon, DaemonProgram, SliceSpec
from omaticaya_py.mps.supervisor import SILENT_CHECKS, Gpu, Supervisor, SupervisorOptions
from omaticaya_py.sources.mps import (
    MpsWatch,
    SliceDaemons,
    SliceUnavailable,
    read_slice_state,
    read_state,
    supervisor_gone,
)
from tests.helpers import MULTI_TRACE
from tests.mps_rig import STANDIN, Running
from tests.waiting import wait_for

# not in `scripts/test --quick`: real MPS stand-in daemons, one per slice (processes, sockets)
pytestmark = pytest.mark.slow

UUID0 = "GPU-00000000-0000-0000-0000-000000000001"
UUID1 = "GPU-00000000-0000-0000-0000-000000000002"
GPUS = (Gpu(0, UUID0, 79), Gpu(1, UUID1, 40))
UNIT_MIB = 1024


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A short temporary folder (a unix socket's path is at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="om-sl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _layout(tmp: Path) -> Layout:
    return Layout(tmp / "run" / "mps", tmp / "state")


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _request(units: int, gpu: Gpu = GPUS[0], *, threads: int | None = None,
             owner: str = "device-plugin") -> SliceRequest:  # fmt: skip
    ids = ",".join(f"{gpu.uuid}::{k}" for k in range(units))
    return SliceRequest(slice_id(ids), gpu.uuid, gpu.index, units * UNIT_MIB, owner, ids,
                        threads, time.time())  # fmt: skip


def _ask(layout: Layout, sid: str, line: str) -> str:
    """One command to slice ``sid``'s daemon, as an operator would."""
    daemon = ControlDaemon(layout, UUID0, 0, 1, program=DaemonProgram(str(STANDIN)),
                           slice_spec=SliceSpec(sid))  # fmt: skip
    return daemon.command(line)


# -- the pure part ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        ({"sid": "0123456789abcdef"}, "not of"),
        ({"gpu_uuid": "MIG-1234"}, "gpu_uuid"),
        ({"gpu_uuid": "../../etc"}, "gpu_uuid"),
        ({"mib": 0}, "mib"),
        ({"mib": -5}, "mib"),
        ({"threads_pct": 0}, "threads_pct"),
        ({"threads_pct": 101}, "threads_pct"),
        ({"owner": 3}, "owner"),
        ({"at_s": "soon"}, "at_s"),
    ],
)  # fmt: skip
def test_a_bad_request_is_refused_naming_the_field(mutate: dict[str, object], error: str) -> None:
    req = _request(8)
    doc = json.loads(request_json(req))
    assert parse_request(json.dumps(doc), req.sid) == req  # the round trip
    doc.update(mutate)
    with pytest.raises(ValueError, match=error):
        parse_request(json.dumps(doc), req.sid)


def test_a_slice_id_is_stable_and_names_no_other_path(tmp: Path) -> None:
    layout = _layout(tmp)
    sid = slice_id(f"{UUID0}::0,{UUID0}::1")
    assert sid == slice_id(f"{UUID0}::0,{UUID0}::1") and len(sid) == 16
    assert sid != slice_id(f"{UUID0}::0,{UUID0}::2")
    assert layout.slice_pipe(sid) == tmp / "run" / "mps" / "slices" / sid / "pipe"
    for bad in ("../x", "GPU-1", "0123456789ABCDEF", "", "0123456789abcdef0"):
        with pytest.raises(ValueError, match="slice ID"):
            layout.slice_dir(bad)
    # the longest socket path stays within a unix socket's 107 bytes at the longest root
    root = Path("/" + "r" * 41)
    assert len(str(Layout(root).slice_pipe(sid) / "control_privileged").encode()) <= 107


def test_a_client_is_given_its_slice_daemons_folders(tmp: Path) -> None:
    layout = _layout(tmp)
    sid = slice_id("x")
    spec = client_spec(layout, sid, 8192, threads_pct=26)
    assert dict(spec.envs) == {
        "CUDA_MPS_PIPE_DIRECTORY": str(layout.slice_pipe(sid)),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",
        "OMATICAYA_GPU_MEMORY_LIMIT_MIB": "8192",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "26",
    }
    assert [(m.container_path, m.host_path) for m in spec.mounts] == [
        (str(layout.slice_pipe(sid)), str(layout.slice_pipe(sid))),
        ("/dev/shm", str(layout.slice_shm(sid))),
    ]


# -- the daemons -----------------------------------------------------------------------------


def test_a_slice_gets_a_daemon_whose_default_limit_is_the_slice(tmp: Path) -> None:
    """Item 1: the limit comes from the daemon's side. Two slices on one GPU: two daemons, each
    with its slice as the default pinned-memory limit (a client's own variable can only lower
    it: NVIDIA's MPS documentation, measured on an H200), its own pipe folder; the request
    removed, the daemon and its folder go."""
    layout = _layout(tmp)
    daemons = SliceDaemons(layout, "device-plugin", 5.0, timeout_s=10)
    with Running(Supervisor(layout, GPUS, UNIT_MIB,
                            SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=5, shm_mib=0))) as sup:  # fmt: skip
        small, large = _request(8, threads=11), _request(16)
        got = daemons.ask(small)
        assert (got.state, got.limit_mib, got.uuid, got.sid) == (UP, 8192, UUID0, small.sid)
        assert daemons.ask(large).limit_mib == 16384
        assert _ask(layout, small.sid, "get_default_device_pinned_mem_limit 0") == "8192M"
        assert _ask(layout, large.sid, "get_default_device_pinned_mem_limit 0") == "16384M"
        assert _ask(layout, small.sid, "get_default_active_thread_percentage") == "11.0"
        assert (layout.slice_pipe(small.sid) / "control").is_socket()
        assert layout.slice_pipe(small.sid) != layout.slice_pipe(large.sid)
        assert set(daemons.requests()) == {small.sid, large.sid}
        pid = got.pid
        assert pid is not None
        text = generate_latest(sup.metrics.registry).decode()
        assert f'omaticaya_mps_slice_daemon_starts_total{{gpu="0",uuid="{UUID0}"}} 2.0' in text
        sup.check()
        text = generate_latest(sup.metrics.registry).decode()
        assert f'omaticaya_mps_slice_daemons{{gpu="0",uuid="{UUID0}"}} 2.0' in text
        daemons.release(small.sid)
        wait_for("the small slice's daemon gone",
                 lambda: not layout.slice_dir(small.sid).exists()
                 and read_slice_state(layout, small.sid) == (None, None), 5)  # fmt: skip
        wait_for(f"daemon {pid} gone", lambda: not Path(f"/proc/{pid}").exists(), 5)
        assert daemons.up(large.sid) == (True, "")
    assert _tree(tmp) == ["state", "state/slices", f"state/slices/{large.sid}.json"]


def test_a_restarted_daemon_serves_the_same_pipe_folder(tmp: Path) -> None:
    """Item 3: a daemon killed is restarted in the same pipe folder (the same inode, which a
    running container's bind mount holds), so the container's next process reaches it."""
    layout = _layout(tmp)
    daemons = SliceDaemons(layout, "device-plugin", 5.0, timeout_s=10)
    with Running(Supervisor(layout, GPUS[:1], UNIT_MIB,
                            SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=5, shm_mib=0))):  # fmt: skip
        req = _request(4)
        first = daemons.ask(req)
        pipe = layout.slice_pipe(req.sid)
        held = os.open(pipe, os.O_RDONLY | os.O_DIRECTORY)  # what a bind mount holds
        try:
            inode = os.fstat(held).st_ino
            assert first.pid is not None
            os.kill(first.pid, signal.SIGKILL)
            again = wait_for("the slice's daemon up again", lambda: (s := read_slice_state(
                layout, req.sid)[0]) is not None and s.state == UP and s.pid != first.pid and s, 10)  # fmt: skip
            assert again.starts == 2 and again.limit_mib == 4096
            assert os.stat(pipe).st_ino == inode
            # through the folder held open, as a client container sees it: the new socket
            assert "control" in os.listdir(held)
            assert os.stat(f"/proc/self/fd/{held}/control").st_ino == os.stat(pipe / "control").st_ino
        finally:
            os.close(held)


def test_a_removed_control_socket_does_not_end_a_serving_daemon(tmp: Path) -> None:
    """Item 4: a tenant removes its pipe folder's ``control`` socket (the folder is mounted in
    its container). The daemon answers nobody new: down at once (fail closed), but its MPS
    server still serves the clients it has, so it is not killed (here well past
    ``SILENT_CHECKS`` checks); once its server is gone it is restarted, its socket back."""
    layout = _layout(tmp)
    daemons = SliceDaemons(layout, "device-plugin", 5.0, timeout_s=10)
    with Running(Supervisor(layout, GPUS[:1], UNIT_MIB,
                            SupervisorOptions(str(STANDIN), check_s=0.1, start_timeout_s=5, shm_mib=0))):  # fmt: skip
        req = _request(4)
        state = daemons.ask(req)
        _ask(layout, req.sid, "start_server -uid 0")
        server = int(_ask(layout, req.sid, "get_server_list").split()[0])
        (layout.slice_pipe(req.sid) / "control").unlink()
        down = wait_for("down", lambda: (s := read_slice_state(layout, req.sid)[0]) is not None
                        and s.state == DOWN and s, 5, 0.02)  # fmt: skip
        assert down.reason.startswith(NOT_ANSWERING) and down.pid == state.pid
        assert daemons.up(req.sid)[0] is False
        time.sleep(0.1 * (SILENT_CHECKS + 5))  # checks that would have killed it before
        s = read_slice_state(layout, req.sid)[0]
        assert s is not None and s.pid == state.pid and s.state == DOWN and s.starts == 1
        assert state.pid is not None and Path(f"/proc/{state.pid}").exists()
        os.kill(server, signal.SIGKILL)  # its clients are gone, and so is its server
        up = wait_for("restarted", lambda: (s := read_slice_state(layout, req.sid)[0])
                      is not None and s.state == UP and s, 10)  # fmt: skip
        assert up.pid != state.pid and (layout.slice_pipe(req.sid) / "control").is_socket()


def test_a_dead_supervisor_fails_closed_at_once(tmp: Path) -> None:
    """Item 3: a supervisor killed (SIGKILL: no clean stop) is seen by the next read, by its
    lock, not once its heartbeats are older than ``OMATICAYA_MPS_STALE_S``: every shared GPU
    and slice is ``mps-supervisor-gone``, and a slice asked for now is refused at once. A clean
    stop removes the lock file and the states."""
    layout = _layout(tmp)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OMATICAYA_")},
        "OMATICAYA_TRACE": str(MULTI_TRACE),
        "OMATICAYA_SHARED_GPUS": "0",
        "OMATICAYA_MPS_CONTROL": str(STANDIN),
        "OMATICAYA_MPS_ROOT": str(layout.root),
        "OMATICAYA_MPS_STATE_DIR": str(layout.state_dir),
        "OMATICAYA_MPS_SHM_MIB": "0",
        "OMATICAYA_MPS_CHECK_S": "0.2",
        "OMATICAYA_MPS_METRICS_PORT": "0",
    }
    proc = subprocess.Popen([sys.executable, "-m", "omaticaya_py", "mps"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    pids: list[int] = []
    try:
        uuid = wait_for("a probe state", lambda: next(
            (p.name[:-5] for p in layout.state_dir.glob("GPU-*.json")), None), 20)  # fmt: skip
        watch = MpsWatch(layout, stale_after_s=3600, min_interval_s=0)  # stale: never, here
        wait_for("the probe up", lambda: watch.enforcement(uuid).up, 20)
        daemons = SliceDaemons(layout, "dra", 3600, timeout_s=10)
        gpu = Gpu(0, uuid, 79)
        req = _request(2, gpu, owner="dra")
        state = daemons.ask(req)
        pids = [p for p in (state.pid, read_state(layout, uuid)[0].pid) if p]  # type: ignore[union-attr]
        assert not supervisor_gone(layout)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        # the states still say up, with heartbeats far from stale; the lock says the rest
        assert read_state(layout, uuid)[0].state == UP  # type: ignore[union-attr]
        assert supervisor_gone(layout)
        assert (watch.enforcement(uuid).up, watch.enforcement(uuid).reason) == (False, SUPERVISOR_GONE)
        assert daemons.up(req.sid) == (False, SUPERVISOR_GONE)
        started = time.monotonic()
        with pytest.raises(SliceUnavailable, match="mps-supervisor-gone"):
            SliceDaemons(layout, "dra", 3600, timeout_s=1).ask(_request(3, gpu, owner="dra"))
        assert time.monotonic() - started < 5
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in pids:  # orphans of a supervisor killed outside a container
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


def test_bad_and_foreign_requests_are_skipped_counted_and_answered(tmp: Path) -> None:
    layout = _layout(tmp)
    daemons = SliceDaemons(layout, "device-plugin", 5.0, timeout_s=5)
    with Running(Supervisor(layout, GPUS[:1], UNIT_MIB,
                            SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=5, shm_mib=0))) as sup:  # fmt: skip
        foreign = _request(4, GPUS[1])  # GPU 1 is not shared by this supervisor
        with pytest.raises(SliceUnavailable, match="unknown-gpu"):
            daemons.ask(foreign)
        assert not layout.request(foreign.sid).exists()  # nothing left asking
        bad = slice_id("bad")
        layout.request(bad).write_text("{not json")
        good = daemons.ask(_request(2))  # the bad one blocks nobody
        assert good.state == UP
        wait_for("the bad request counted", lambda: 'reason="unreadable"} 1.0' in
                 generate_latest(sup.metrics.registry).decode(), 5)  # fmt: skip
        text = generate_latest(sup.metrics.registry).decode()
        assert 'omaticaya_mps_slice_requests_skipped_total{reason="unknown-gpu"} 1.0' in text
        s = read_slice_state(layout, bad)[0]
        assert s is not None and s.state == DOWN and s.reason.startswith("unreadable")


def _mount_of(pid: int | str, point: str) -> str | None:
    """The ``major:minor`` of the file system mounted at ``point`` in ``pid``'s mount
    namespace (``/proc/<pid>/mountinfo``), or ``None``."""
    with open(f"/proc/{pid}/mountinfo") as f:
        found = [line.split()[2] for line in f if line.split()[4] == point]
    return found[-1] if found else None


def test_each_slice_has_shared_memory_of_its_own(tmp: Path) -> None:
    """Item 8: with ``shm_mib`` > 0, each slice gets a tmpfs of that size, which is its daemon's
    ``/dev/shm`` (a mount namespace of its own) and its clients'; another slice's is another
    tmpfs. A supervisor that restarts without a clean stop (a crash) finds the tmpfs still
    mounted and keeps it (what the client containers hold). Needs CAP_SYS_ADMIN (CI runs as
    root): skipped, saying so, without."""
    layout = _layout(tmp)
    probe = tmp / "probe"
    probe.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(probe)],
                      capture_output=True, check=False).returncode != 0:  # fmt: skip
        pytest.skip("mounting a tmpfs needs CAP_SYS_ADMIN, which this run does not have")
    subprocess.run(["umount", str(probe)], check=True)
    probe.rmdir()
    daemons = SliceDaemons(layout, "device-plugin", 5.0, timeout_s=10)
    sup = Supervisor(layout, GPUS[:1], UNIT_MIB,
                     SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=5, shm_mib=8))  # fmt: skip
    running = Running(sup)
    running.__enter__()
    crashed = False
    try:
        a, b = _request(2), _request(3)
        sa, sb = daemons.ask(a), daemons.ask(b)
        shm_a, shm_b = layout.slice_shm(a.sid), layout.slice_shm(b.sid)
        assert os.path.ismount(shm_a) and os.path.ismount(shm_b)
        assert os.statvfs(shm_a).f_blocks * os.statvfs(shm_a).f_frsize == 8 << 20
        dev_a, dev_b = _mount_of("self", str(shm_a)), _mount_of("self", str(shm_b))
        assert dev_a and dev_b and dev_a != dev_b
        assert sa.pid and sb.pid
        assert _mount_of(sa.pid, "/dev/shm") == dev_a
        assert _mount_of(sb.pid, "/dev/shm") == dev_b
        assert _mount_of("self", "/dev/shm") not in (dev_a, dev_b)  # ours is untouched
        (shm_a / "seen").write_text("x")
        # a crash of the supervisor (no clean stop: its daemons die with its container), then
        # the next one: it keeps the slice's tmpfs
        running.stop_event.set()
        running.thread.join(10)
        for slot in [*sup._slots, *sup._slices.values()]:
            slot.daemon.kill(0.5)
        assert sup.host.lock_file is not None
        sup.host.lock_file.close()
        crashed = True
        again = Supervisor(layout, GPUS[:1], UNIT_MIB,
                           SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=5, shm_mib=8))  # fmt: skip
        again.start()
        try:
            wait_for("a back", lambda: (s := read_slice_state(layout, a.sid)[0]) is not None
                     and s.state == UP and s.pid != sa.pid, 10)  # fmt: skip
            assert (shm_a / "seen").read_text() == "x"
            assert _mount_of("self", str(shm_a)) == dev_a
        finally:
            again.stop()
        assert not os.path.ismount(shm_a) and not layout.slice_dir(a.sid).exists()
    finally:
        if not crashed:
            running.__exit__()
        for line in open("/proc/self/mountinfo").read().splitlines():
            point = line.split()[4]
            if point.startswith(str(tmp)):
                subprocess.run(["umount", "-l", point], check=False)


def test_the_device_plugin_lets_go_of_a_slice_the_kubelet_released(tmp: Path) -> None:
    """A slice's daemon lives as long as the kubelet holds its units: the first PodResources
    list asked for after its ``Allocate`` that names none of them (its pod went) lets it go, and
    the supervisor stops it; a slice superseded by a later one on its units (an app container
    reusing its init container's) goes too. A restarted plugin finds its requests on file."""
    from omaticaya_py.deviceplugin.allocation import DeviceState
    from omaticaya_py.deviceplugin.config import MpsConfig
    from omaticaya_py.deviceplugin.slicer import Enforcement, KubeletView, Slicer

    layout = _layout(tmp)
    t = [500.0]
    listed: list[tuple[frozenset[str], float]] = [(frozenset(), 499.0)]
    mps = MpsConfig(layout, 5.0, slice_wait_s=10)
    gpu = DeviceState(UUID0, 0, True, free_mib=79 * UNIT_MIB)
    units = [f"{UUID0}::{k}" for k in range(8)]
    with Running(Supervisor(layout, GPUS[:1], UNIT_MIB,
                            SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=5, shm_mib=0))):  # fmt: skip
        slicer = Slicer(UNIT_MIB, kubelet=KubeletView(lambda: listed[-1], lambda: t[0]),
                        enforcement=Enforcement(mps))
        _, spec = slicer.allocate(units[:4], [gpu])
        sid = slice_id(",".join(sorted(units[:4])))
        assert spec.envs["CUDA_MPS_PIPE_DIRECTORY"] == str(layout.slice_pipe(sid))
        assert slicer.sweep() == []  # a list from before its Allocate says nothing of it
        listed.append((frozenset(units[:4]), 502.0))  # its pod runs
        assert slicer.sweep() == []
        # a later slice on some of its units supersedes it (the init container is done)
        t[0] = 503.0
        slicer.allocate(units[2:6], [gpu])
        later = slice_id(",".join(sorted(units[2:6])))
        wait_for("the superseded slice's daemon gone", lambda: not layout.slice_dir(sid).exists(), 5)
        assert (layout.slice_pipe(later) / "control").is_socket()
        # a restarted plugin: the request is found again, and let go with its units
        again = Slicer(UNIT_MIB, kubelet=KubeletView(lambda: listed[-1], lambda: t[0]),
                       enforcement=Enforcement(mps))
        assert set(again.daemon_book) == {later}
        listed.append((frozenset(), 510.0))  # the pod deleted: the kubelet lists nothing
        assert again.sweep() == [later]
        wait_for("its daemon gone", lambda: not layout.slice_dir(later).exists(), 5)
        assert list(layout.requests_dir.glob("*.json")) == []

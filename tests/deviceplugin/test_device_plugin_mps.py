"""The device plugin under MPS enforcement (issues 39, 47), over gRPC on the sharing rig: a
slice container becomes the client of its slice's own MPS daemon (environment and mounts), a
shared GPU whose probe daemon is not up serves no units (fail closed), back when it is, and a
slice whose daemon does not come up is refused.

The probes' states are written here as the supervisor writes them (``core.allocation.mps.state_json``),
and the slices' daemons are answered by ``_SliceAnswerer`` the way the supervisor answers
(their states ``up`` with the slice's limit): a stand-in beside the real thing. The supervisor
itself, against the stand-in ``nvidia-cuda-mps-control``, is tests/mps/test_mps_supervisor.py and
tests/mps/test_mps_slices.py, and the two together tests/mps/test_mps_seam.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from omaticaya_py.core.allocation.mps import (
    DOWN,
    UP,
    DaemonState,
    Layout,
    enforced,
    limit_value,
    parse_request,
    parse_state,
    probe_limit_mib,
    slice_id,
    state_json,
    thread_pct,
)
from omaticaya_py.deviceplugin.v1beta1 import api_pb2
from omaticaya_py.sources.mps import MpsWatch
from tests.deviceplugin.device_plugin_mps_support import (  # the names moved out, for this file's tests
    allocate,  # noqa: F401
    health_by_gpu,  # noqa: F401
)
from tests.deviceplugin.device_plugin_sharing_support import UUID, Rig, units_of
from tests.deviceplugin.device_plugin_support import folder  # noqa: F401

# -- the pure rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("units", "total", "pct"),
    [(1, 79, 2), (20, 79, 26), (79, 79, 100), (40, 80, 50), (1, 0, 100), (200, 79, 100)],
)
def test_thread_pct_is_the_slice_share_rounded_up(units: int, total: int, pct: int) -> None:
    assert thread_pct(units, total) == pct


def test_limits_are_written_as_mps_reads_them() -> None:
    assert probe_limit_mib(1024) == 1024 and probe_limit_mib(0) == 1
    assert limit_value(8192) == "8192M"
    with pytest.raises(ValueError):
        limit_value(0)


@pytest.mark.parametrize(
    "bad", ["GPU-../../etc", "../x", "", "GPU-a/b", "nvidia0", "GPU-" + "a" * 200]
)
def test_a_uuid_that_is_no_uuid_names_no_folder(bad: str) -> None:
    with pytest.raises(ValueError, match="not a GPU UUID"):
        Layout().pipe(bad)


def test_layout_wants_absolute_short_folders() -> None:
    with pytest.raises(ValueError, match="OMATICAYA_MPS_ROOT"):
        Layout(Path("run/mps"))
    with pytest.raises(ValueError, match="at most 42 bytes"):
        Layout(Path("/var/lib/kubelet/plugins/omaticaya.io/mps/root"))
    socket = Layout(Path("/" + "r" * 41)).pipe("GPU-" + "0" * 36) / "control_privileged"
    assert len(str(socket)) <= 107
    with pytest.raises(ValueError, match="OMATICAYA_MPS_STATE_DIR"):
        Layout(Path("/run/mps"), Path("/run/../etc"))


def _state(uuid: str = UUID[0], state: str = UP, heartbeat_s: float = 1000.0, **kw) -> DaemonState:
    return DaemonState(uuid=uuid, index=0, state=state, heartbeat_s=heartbeat_s, since_s=990.0, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "problem", "now_s", "expected"),
    [
        (_state(), None, 1005.0, (True, "")),
        (_state(), None, 1016.0, (False, "mps-state-stale")),
        (_state(), None, 980.0, (False, "mps-state-stale")),  # from the future: a clock step
        (_state(state=DOWN, reason="exited 1"), None, 1001.0, (False, "mps-daemon-down")),
        (_state(state="starting"), None, 1001.0, (False, "mps-daemon-starting")),
        (None, None, 1001.0, (False, "mps-state-missing")),
        (None, "not JSON", 1001.0, (False, "mps-state-unreadable")),
    ],
)
def test_enforced_fails_closed(state, problem, now_s, expected) -> None:
    assert enforced(state, now_s, 15.0, problem=problem) == expected


def test_state_round_trips_and_bad_files_are_refused() -> None:
    s = _state(pid=42, limit_mib=80896, starts=3, reason="")
    assert parse_state(state_json(s), UUID[0]) == s
    for raw, why in [
        (b"{", "not JSON"),
        (b"[]", "not a JSON object"),
        (state_json(s).encode(), "not of"),  # another GPU's file
        (b'{"uuid": "%s", "state": "fine"}' % UUID[1].encode(), "state"),
        (b" " * 5000, "over"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_state(raw, UUID[1])
    bad_pid = state_json(_state(pid=-1))
    with pytest.raises(ValueError, match="pid"):
        parse_state(bad_pid, UUID[0])


# -- over gRPC -------------------------------------------------------------------------------


def write_state(layout: Layout, gpu: int, state: str = UP, *, age_s: float = 0.0, reason: str = "") -> None:
    """``gpu``'s daemon state as the supervisor writes it, ``age_s`` seconds old."""
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    now = time.time() - age_s
    doc = DaemonState(UUID[gpu], gpu, state, reason, 4242, 80896, 1, now, now)  # type: ignore[arg-type]
    tmp = layout.state(UUID[gpu]).with_suffix(".tmp")
    tmp.write_text(state_json(doc))
    os.replace(tmp, layout.state(UUID[gpu]))


@pytest.fixture
def short() -> Iterator[Path]:
    """A short folder: the MPS root is at most ``core.allocation.mps.MAX_ROOT_BYTES`` (pytest's
    ``tmp_path`` is longer)."""
    path = Path(tempfile.mkdtemp(prefix="om-dp-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class _SliceAnswerer:
    """Answers the slice requests under ``layout`` as the supervisor does once a slice's daemon
    is up (its state ``up``, its limit the slice's MiB), every 10 ms in a thread; ``requests``
    keeps every request seen."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.requests: dict[str, object] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _SliceAnswerer:
        self.layout.requests_dir.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            for path in self.layout.requests_dir.glob("*.json"):
                if path.name.endswith(".state.json"):
                    continue
                sid = path.name[:-5]
                try:
                    req = parse_request(path.read_bytes(), sid)
                except (OSError, ValueError):
                    continue
                self.requests[sid] = req
                now = time.time()
                doc = DaemonState(req.gpu_uuid, req.gpu_index, UP, "", 4343, req.mib, 1, now, now,
                                  sid=sid)  # fmt: skip
                tmp = self.layout.slice_state(sid).with_suffix(".tmp")
                tmp.write_text(state_json(doc))
                os.replace(tmp, self.layout.slice_state(sid))


@pytest.fixture
def mps_rig(folder: Path, short: Path) -> Iterator[tuple[Rig, Layout]]:  # noqa: F811
    layout = Layout(short / "root", short / "state")
    rig = Rig(folder, share_enforcement="mps", mps_root=str(layout.root),
              mps_state_dir=str(layout.state_dir), mps_stale_s=5.0)  # fmt: skip
    plugin = rig.set.shared_plugin
    assert plugin is not None and plugin.mps is not None
    plugin.mps.min_interval_s = 0.0  # each look reads the files (the tests change them)
    rig.at(0.0)
    rig.kubelet.start()
    rig.set.start()
    assert rig.set.wait_registered(10), "the plugins did not register"
    with _SliceAnswerer(layout):
        yield rig, layout
    for channel in rig.channels:
        channel.close()
    rig.set.stop(0)
    rig.kubelet.stop()






def test_no_daemon_no_units(mps_rig: tuple[Rig, Layout]) -> None:
    rig, _ = mps_rig
    assert health_by_gpu(rig) == {g: {("Unhealthy", ("mps-state-missing",))} for g in range(4)}
    units = next(rig.stub().ListAndWatch(api_pb2.Empty(), timeout=10))
    assert {d.health for d in units.devices} == {"Unhealthy"}
    with pytest.raises(grpc.RpcError) as err:
        allocate(rig, units_of(0, 8))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "mps-state-missing" in err.value.details()
    # whole GPUs are never MPS clients and never wait for a daemon
    whole = allocate(rig, [UUID[4]], shared=False)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in whole.envs and not any(
        m.container_path == "/dev/shm" for m in whole.mounts
    )


def test_a_slice_container_is_a_client_of_its_gpus_daemon(mps_rig: tuple[Rig, Layout]) -> None:
    rig, layout = mps_rig
    write_state(layout, 0)
    assert health_by_gpu(rig)[0] == {("Healthy", ())}
    assert health_by_gpu(rig)[1] == {("Unhealthy", ("mps-state-missing",))}
    for units in (8, 16):
        answer = allocate(rig, units_of(0, units))
        sid = slice_id(",".join(sorted(units_of(0, units))))
        pipe = str(layout.slice_pipe(sid))
        # the slice's daemon was asked for with exactly the slice as its limit
        assert parse_request(layout.request(sid).read_bytes(), sid).mib == units * 1024
        assert answer.envs["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        assert answer.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={units * 1024}M"
        assert answer.envs["OMATICAYA_GPU_MEMORY_LIMIT_MIB"] == str(units * 1024)
        assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == UUID[0]
        assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in answer.envs  # off by default
        mounts = {m.container_path: (m.host_path, m.read_only) for m in answer.mounts}
        assert mounts[pipe] == (pipe, False)
        assert mounts["/dev/shm"] == (str(layout.slice_shm(sid)), False)


def test_a_slice_whose_daemon_does_not_come_up_is_refused(folder: Path, short: Path) -> None:  # noqa: F811
    """Fail closed: no supervisor answers the slice's request (its daemon never comes up), so
    ``Allocate`` refuses the slice, and nothing is left asking."""
    layout = Layout(short / "root", short / "state")
    rig = Rig(folder, share_enforcement="mps", mps_root=str(layout.root),
              mps_state_dir=str(layout.state_dir), mps_stale_s=5.0)  # fmt: skip
    plugin = rig.set.shared_plugin
    assert plugin is not None and plugin.mps is not None and plugin.slicer is not None
    assert plugin.slicer.daemons is not None
    plugin.slicer.daemons.timeout_s = 0.5
    plugin.mps.min_interval_s = 0.0
    rig.at(0.0)
    rig.kubelet.start()
    rig.set.start()
    try:
        assert rig.set.wait_registered(10), "the plugins did not register"
        write_state(layout, 0)
        with pytest.raises(grpc.RpcError) as err:
            allocate(rig, units_of(0, 4))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "MPS daemon of this 4096 MiB slice did not come up" in err.value.details()
        assert list(layout.requests_dir.glob("*.json")) == []
    finally:
        for channel in rig.channels:
            channel.close()
        rig.set.stop(0)
        rig.kubelet.stop()


def test_the_units_follow_the_daemon(mps_rig: tuple[Rig, Layout]) -> None:
    rig, layout = mps_rig
    write_state(layout, 1)
    assert health_by_gpu(rig)[1] == {("Healthy", ())}
    write_state(layout, 1, DOWN, reason="the daemon exited (status 1)")
    assert health_by_gpu(rig)[1] == {("Unhealthy", ("mps-daemon-down",))}
    with pytest.raises(grpc.RpcError) as err:
        allocate(rig, units_of(1, 4))
    assert "mps-daemon-down" in err.value.details()
    write_state(layout, 1, age_s=60)  # the supervisor stopped writing: stale
    assert health_by_gpu(rig)[1] == {("Unhealthy", ("mps-state-stale",))}
    write_state(layout, 1)
    assert health_by_gpu(rig)[1] == {("Healthy", ())}
    assert allocate(rig, units_of(1, 4)).envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"


def test_a_bad_state_file_is_skipped_and_counted(mps_rig: tuple[Rig, Layout]) -> None:
    rig, layout = mps_rig
    write_state(layout, 0)
    layout.state(UUID[2]).write_text("{not json")
    layout.state(UUID[3]).write_text(state_json(DaemonState(UUID[0], 0, UP, heartbeat_s=time.time())))
    health = health_by_gpu(rig)
    assert health[0] == {("Healthy", ())}
    assert health[2] == health[3] == {("Unhealthy", ("mps-state-unreadable",))}
    plugin = rig.set.shared_plugin
    assert plugin is not None and plugin.mps is not None and plugin.mps.errors >= 2
    assert allocate(rig, units_of(0, 2)).envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"


def test_an_unhealthy_gpu_says_both_reasons(mps_rig: tuple[Rig, Layout]) -> None:
    rig, _ = mps_rig
    rig.at(1.0)  # GPU 2's remapped rows pending, and no daemon
    reasons = {r for _, r in health_by_gpu(rig)[2]}
    assert len(reasons) == 1 and "mps-state-missing" in next(iter(reasons))
    assert len(next(iter(reasons))) == 2


def test_thread_share_gives_a_compute_share(folder: Path, short: Path) -> None:  # noqa: F811
    layout = Layout(short / "root", short / "state")
    rig = Rig(folder, share_enforcement="mps", mps_root=str(layout.root),
              mps_state_dir=str(layout.state_dir), mps_thread_share=True)  # fmt: skip
    plugin = rig.set.shared_plugin
    assert plugin is not None and plugin.slicer is not None
    rig.at(0.0)
    plugin.devices()  # learns the unit counts
    sid = slice_id("x")
    assert plugin.slicer.answer(UUID[0], 20, sid).envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "26"
    assert plugin.slicer.answer(UUID[0], 79, sid).envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"


def test_the_watch_reads_at_most_once_an_interval(short: Path) -> None:
    layout = Layout(short / "root", short / "state")
    t = [0.0]
    watch = MpsWatch(layout, 15.0, min_interval_s=1.0, monotonic=lambda: t[0])
    assert watch.enforcement(UUID[0]).reason == "mps-state-missing"
    write_state(layout, 0)
    assert watch.enforcement(UUID[0]).reason == "mps-state-missing"  # cached
    t[0] = 1.5
    assert watch.enforcement(UUID[0]).up

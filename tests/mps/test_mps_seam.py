"""The supervisor and the device plugin together (issues 39, 47): the real ``mps.Supervisor`` runs
the stand-in ``nvidia-cuda-mps-control`` (devtools/mps-standin: real processes and sockets) for
the rig's shared GPUs 0 and 1 (GPUs 2 and 3 have none), and the device plugin over gRPC serves
the units of exactly the GPUs whose probe daemon is up; a killed probe takes its GPU's units
out until the supervisor has it up again; the client answer names the pipe folder of the
slice's own daemon, which listens there with the slice as its default limit.
On a real GPU the same, with CUDA processes: tests/mps/test_mps_nvml.py."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from omaticaya_py.core.allocation.mps import UP, Layout, slice_id
from omaticaya_py.deviceplugin.v1beta1 import api_pb2
from omaticaya_py.mps.supervisor import Gpu, Supervisor, SupervisorOptions
from tests.deviceplugin.device_plugin_mps_support import allocate, health_by_gpu
from tests.deviceplugin.device_plugin_sharing_support import UUID, Rig, units_of
from tests.deviceplugin.device_plugin_support import folder  # noqa: F401
from tests.mps_rig import STANDIN
from tests.waiting import wait_for


@pytest.fixture
def seam(folder: Path) -> Iterator[tuple[Rig, Supervisor]]:  # noqa: F811
    # a short root: a unix socket's path is at most 107 bytes
    tmp = Path(tempfile.mkdtemp(prefix="om-seam-", dir="/tmp"))
    layout = Layout(tmp / "mps", tmp / "state")
    sup = Supervisor(layout, [Gpu(0, UUID[0], 79), Gpu(1, UUID[1], 79)], 1024,
                     SupervisorOptions(str(STANDIN), check_s=0.2, start_timeout_s=10.0, shm_mib=0))  # fmt: skip
    stop = threading.Event()
    thread = threading.Thread(target=sup.run_forever, args=(stop,), daemon=True)
    rig = Rig(folder, share_enforcement="mps", mps_root=str(layout.root),
              mps_state_dir=str(layout.state_dir), mps_stale_s=5.0)  # fmt: skip
    plugin = rig.set.shared_plugin
    assert plugin is not None and plugin.mps is not None
    plugin.mps.min_interval_s = 0.0
    try:
        sup.start()
        thread.start()
        rig.at(0.0)
        rig.kubelet.start()
        rig.set.start()
        assert rig.set.wait_registered(10), "the plugins did not register"
        yield rig, sup
    finally:
        for channel in rig.channels:
            channel.close()
        rig.set.stop(0)
        rig.kubelet.stop()
        stop.set()
        thread.join(10)
        sup.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def test_units_are_served_while_the_daemon_is_up(seam: tuple[Rig, Supervisor]) -> None:
    rig, sup = seam
    assert {s.state for s in sup.states().values()} == {UP}
    health = health_by_gpu(rig)
    assert health[0] == health[1] == {("Healthy", ())}
    assert health[2] == health[3] == {("Unhealthy", ("mps-state-missing",))}
    answer = allocate(rig, units_of(0, 8))
    pipe = Path(answer.envs["CUDA_MPS_PIPE_DIRECTORY"])
    sid = slice_id(",".join(sorted(units_of(0, 8))))
    assert pipe == sup.layout.slice_pipe(sid)
    assert (pipe / "control").is_socket()  # the daemon the client will talk to listens there
    assert answer.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    # the limit is the daemon's: its default is the slice, whatever the client's variable says
    state = sup.slice_states()[sid]
    assert (state.state, state.limit_mib, state.uuid) == (UP, 8192, UUID[0])
    units = next(rig.stub().ListAndWatch(api_pb2.Empty(), timeout=10))
    healthy = {d.ID.split("::")[0] for d in units.devices if d.health == "Healthy"}
    assert healthy == {UUID[0], UUID[1]}


def test_a_killed_daemon_takes_its_units_out_until_it_is_back(seam: tuple[Rig, Supervisor]) -> None:
    rig, sup = seam
    first = sup.states()[UUID[1]]
    assert first.state == UP and first.pid
    os.kill(first.pid, signal.SIGKILL)
    wait_for("GPU 1's units to leave", lambda: health_by_gpu(rig)[1] != {("Healthy", ())}, 10)
    reasons = {r for _, r in health_by_gpu(rig)[1]}
    assert reasons <= {("mps-daemon-down",), ("mps-daemon-starting",)}, reasons
    with pytest.raises(grpc.RpcError) as err:
        allocate(rig, units_of(1, 4))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert health_by_gpu(rig)[0] == {("Healthy", ())}  # the other GPU's daemon untouched
    wait_for("GPU 1's units back", lambda: health_by_gpu(rig)[1] == {("Healthy", ())}, 20)
    again = sup.states()[UUID[1]]
    assert again.pid != first.pid and again.starts == first.starts + 1
    assert allocate(rig, units_of(1, 4)).envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"

"""Slices enforced by CUDA MPS, proven on a real GPU (issues 39, 47): the product's supervisor
runs the real ``nvidia-cuda-mps-control`` for GPU 0 (its probe daemon, and one daemon per slice
whose default pinned-memory limit is the slice), the device plugin over the real NVML reading
hands out an 8 GiB and a 16 GiB slice over gRPC, and real CUDA processes started with exactly
those answers are held to their slice, even one that sets its own
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` to the whole GPU, while a process without an answer is not.

Run it on a machine with an NVIDIA GPU (as root; ``nvidia-cuda-mps-control``, ``unshare``,
``nsenter`` and ``mount`` on PATH)::

    scripts/test -m nvml tests/mps/test_mps_nvml.py -s

(``-s`` shows the figures it prints for docs: daemon start and restart times, each client's
allocation results, the MPS servers' memory and a fresh context's from NVML). Everywhere else it
is skipped, saying why (no NVML/GPU as in tests/sources/test_nvml.py, not root, a tool missing).

What it does, step by step (``test_slices_are_enforced_by_mps_on_gpu_0``):

1. ``mps.Supervisor`` starts GPU 0's probe daemon as on a node (UUID and memory from the
   project's NVML reader, units = total // 1024, one unit as the probe's limit, root and state
   folder in a temporary folder, a 64 MiB tmpfs per slice) and its loop.
2. The device plugin (``DevicePluginSet`` over an ``Agent`` with the NVML reader;
   ``OMATICAYA_SHARED_GPUS=0``, ``OMATICAYA_SHARE_ENFORCEMENT=mps``) registers with a fake
   kubelet and is asked over gRPC to ``Allocate`` 8 units and 16 units of GPU 0: each slice's
   daemon is up with the slice as its default limit before the answer comes.
3. Each answer is applied as a container runtime would: its environment (plus
   ``CUDA_VISIBLE_DEVICES`` from its ``NVIDIA_VISIBLE_DEVICES``) and its mounts (its daemon's
   pipe folder, its tmpfs at ``/dev/shm``), in a mount namespace of the client's own
   (``unshare --mount``). The 8 GiB client is hostile: it sets
   ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` to the whole GPU. Both hold memory at once (6 GiB and 12
   GiB), then try: the 8 GiB client is refused 12 GiB, the 16 GiB one 20 GiB
   (CUDA_ERROR_OUT_OF_MEMORY, with 40+ GiB free on the GPU); NVML's process lists are recorded.
4. Two processes with the 8 GiB answer (one container's torchrun workers) each hold 6 GiB: the
   limit is per process below driver r615, so both get it (12 GiB in an 8 GiB slice: what the
   agent's check reports, tests/agent/test_sharing_mps_enforcement.py); the figures are recorded.
5. The same client without an answer (no MPS variables) allocates 20 GiB: the GPU has the room,
   only the slice's limit refused it.
6. A running container (a mount namespace that lives on, with the 8 GiB answer's mounts): the
   slice's daemon is SIGKILLed and restarted by the supervisor in the same pipe folder; a new
   process in that container (``nsenter``) reaches the new daemon and is held to the slice.
7. The probe daemon is SIGKILLed: the plugin's GPU 0 units are Unhealthy (``mps-daemon-down``)
   and ``Allocate`` is refused; the supervisor restarts it and the units are Healthy again.
8. Everything is undone (the supervisor stopped) and checked gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from omaticaya_py.sources.nvml import nvml_available

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "tests" / "mps_client.py"
UNIT_MIB = 1024
GIB = 1024  # MiB
OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY
#: GPU 0 must hold both slices, both holds and the unlimited 20 GiB with room to spare
NEEDED_MIB = 40 * GIB


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


pytestmark = [
    pytest.mark.nvml,
    pytest.mark.skipif(
        not nvml_available(),
        reason="no NVIDIA GPU/driver here: NVML cannot start (nvmlInit failed)",
    ),
    pytest.mark.skipif(
        not _is_root(), reason="not root: binding /dev/shm and unshare --mount need root"
    ),
    pytest.mark.skipif(
        shutil.which("nvidia-cuda-mps-control") is None,
        reason="no nvidia-cuda-mps-control on PATH (the driver's MPS control program)",
    ),
    pytest.mark.skipif(
        any(shutil.which(t) is None for t in ("unshare", "nsenter", "mount")),
        reason="no unshare/nsenter/mount on PATH (util-linux): a client's mounts cannot be "
        "applied",
    ),
]


# -- the pieces ---------------------------------------------------------------------------------


@dataclass
class Figures:
    """What the test measured, printed at the end (and on failure) for docs."""

    lines: list[str] = field(default_factory=list)

    def add(self, what: str, value: Any) -> None:
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        self.lines.append(f"{what}: {text}")
        print(f"[mps-nvml] {what}: {text}", flush=True)

    def dump(self) -> str:
        return "\n".join(self.lines)


def _gpu0() -> tuple[str, int, str]:
    """GPU 0's UUID, total memory (MiB) and compute mode, from the project's NVML reader (skip
    when it is in MIG mode or too small)."""
    import pynvml

    from omaticaya_py.sources.nvml import NvmlReader

    reader = NvmlReader(watch_xid=False)
    try:
        snap = reader.read()
    finally:
        reader.close()
    assert snap.error is None and snap.gpus, f"NVML reading failed: {snap.error}"
    gpu = min(snap.gpus, key=lambda g: g.index)
    if gpu.index != 0 or not gpu.uuid:
        pytest.skip(f"GPU 0 not read (first GPU: index {gpu.index}, uuid {gpu.uuid!r})")
    if gpu.mig_enabled:
        pytest.skip("GPU 0 is in MIG mode: MIG GPUs are never shared")
    if not gpu.memory_total_mib or gpu.memory_total_mib < NEEDED_MIB:
        pytest.skip(f"GPU 0 has {gpu.memory_total_mib} MiB; the test needs {NEEDED_MIB}")
    pynvml.nvmlInit()
    try:
        mode = pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        pynvml.nvmlShutdown()
    names = {
        pynvml.NVML_COMPUTEMODE_DEFAULT: "DEFAULT",
        pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS: "EXCLUSIVE_PROCESS",
        pynvml.NVML_COMPUTEMODE_PROHIBITED: "PROHIBITED",
    }
    if mode == pynvml.NVML_COMPUTEMODE_PROHIBITED:
        pytest.skip("GPU 0's compute mode is PROHIBITED: no CUDA context can be made")
    return gpu.uuid, gpu.memory_total_mib, names.get(mode, str(mode))


def _nvml_processes(uuid: str) -> dict[str, list[dict[str, Any]]]:
    """NVML's compute processes and MPS compute processes on ``uuid`` (pid, used MiB, command)."""
    import pynvml

    def rows(fn_name: str) -> list[dict[str, Any]]:
        fn = getattr(pynvml, fn_name, None)
        if fn is None:
            return [{"error": f"pynvml has no {fn_name}"}]
        try:
            procs = fn(handle)
        except pynvml.NVMLError as exc:
            return [{"error": str(exc)}]
        out = []
        for p in procs:
            used = p.usedGpuMemory
            out.append({
                "pid": p.pid,
                "used_mib": None if used is None else used // (1 << 20),
                "cmd": _cmdline(p.pid),
            })  # fmt: skip
        return out

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        return {
            "compute": rows("nvmlDeviceGetComputeRunningProcesses"),
            "mps_compute": rows("nvmlDeviceGetMPSComputeRunningProcesses"),
        }
    finally:
        pynvml.nvmlShutdown()


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:120]


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (the daemon's MPS servers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[1] == str(pid):
            out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _base_env() -> dict[str, str]:
    """What every client starts from: no CUDA or OMATICAYA variable of the test run."""
    keep = ("PATH", "HOME", "LD_LIBRARY_PATH", "LANG")
    return {k: v for k, v in os.environ.items() if k in keep}


@dataclass
class Client:
    """One running ``tests/mps_client.py``; ``what`` names it in messages."""

    what: str
    proc: subprocess.Popen[str]
    ready: Path | None = None

    def wait_ready(self, timeout_s: float = 90) -> dict[str, Any]:
        assert self.ready is not None
        deadline = time.monotonic() + timeout_s
        while not self.ready.exists():
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                pytest.fail(f"{self.what}: expected it to hold its memory and wait; it exited "
                            f"{self.proc.returncode}: stdout {out.strip()!r} stderr {err.strip()!r}")  # fmt: skip
            if time.monotonic() > deadline:
                pytest.fail(f"{self.what}: did not hold its memory within {timeout_s:g}s")
            time.sleep(0.02)
        return json.loads(self.ready.read_text())

    def result(self, timeout_s: float = 120) -> dict[str, Any]:
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(
                f"{self.what}: did not finish within {timeout_s:g}s: stderr {err.strip()!r}"
            )
        lines = [line for line in out.splitlines() if line.strip()]
        if self.proc.returncode != 0 or not lines:
            pytest.fail(f"{self.what}: expected exit 0 and one JSON line; got exit "
                        f"{self.proc.returncode}, stdout {out.strip()!r}, stderr {err.strip()!r}")  # fmt: skip
        return json.loads(lines[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def _binds(answer: Any) -> list[str]:
    """Shell commands binding each of ``answer``'s mounts, as a container runtime does."""
    return [
        f"mount --bind {shlex.quote(m.host_path)} {shlex.quote(m.container_path)}"
        + (f" && mount -o remount,bind,ro {shlex.quote(m.container_path)}" if m.read_only else "")
        for m in answer.mounts
    ]  # fmt: skip


def start_client(what: str, answer: Any | None, uuid: str, args: list[str], *,
                 ready: Path | None = None, env_over: dict[str, str] | None = None,
                 inside: int | None = None) -> Client:  # fmt: skip
    """``tests/mps_client.py ARGS`` started with exactly what ``answer`` (an Allocate
    ``ContainerAllocateResponse``) gives: its envs, ``CUDA_VISIBLE_DEVICES`` from its
    ``NVIDIA_VISIBLE_DEVICES`` (the container runtime's job, absent here), and each of its mounts
    bound in a mount namespace of the client's own. ``answer`` ``None``: a process on an
    unshared GPU (``CUDA_VISIBLE_DEVICES`` ``uuid``, no MPS variable, no mount). ``env_over``:
    what the tenant sets itself, over the answer's. ``inside``: the pid of a running
    "container" (``Container``) whose mount namespace the process joins instead (``nsenter``)."""
    env = _base_env()
    client = [sys.executable, str(CLIENT), *args]
    if ready is not None:
        client += ["--ready", str(ready)]
    if answer is None:
        env["CUDA_VISIBLE_DEVICES"] = uuid
        if Path("/tmp/nvidia-mps/control").exists():  # a host-wide daemon on the default pipe
            empty = Path(tempfile.mkdtemp(prefix="no-mps-", dir=ready.parent if ready else None))
            env["CUDA_MPS_PIPE_DIRECTORY"] = str(empty)  # no daemon there: no MPS, no limit
        command = client
    else:
        env.update(dict(answer.envs))
        env["CUDA_VISIBLE_DEVICES"] = answer.envs["NVIDIA_VISIBLE_DEVICES"]
        env.update(env_over or {})
        if inside is not None:
            command = ["nsenter", "--target", str(inside), "--mount", "--", *client]
        else:
            script = " && ".join([*_binds(answer), "exec " + shlex.join(client)])
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    return Client(what, proc, ready)


@dataclass
class Container:
    """A running "container": a mount namespace with an answer's mounts that lives on (a
    sleeping process, ``pid``) while processes are started in it (``start_client(inside=)``)."""

    proc: subprocess.Popen[str]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def start_container(answer: Any) -> Container:
    """A ``Container`` with ``answer``'s mounts, once they are bound."""
    script = " && ".join([*_binds(answer), "echo mounted", "exec sleep 600"])
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line == "mounted", f"the container's mounts failed: {proc.stderr.read() if proc.stderr else ''}"
    return Container(proc)


# -- the node: supervisor, device plugin ----------------------------------------------------------


@dataclass
class Node:
    uuid: str
    total_mib: int
    units: int
    compute_mode: str
    layout: Any
    supervisor: Any
    agent: Any
    plugins: Any
    channel: grpc.Channel
    stub: Any
    scratch: Path
    figures: Figures
    #: ``stopped["supervisor"]``: ``Supervisor.stop`` ran (the clean-up does not run it twice)
    stopped: dict[str, bool] = field(default_factory=dict)
    loop_stop: threading.Event = field(default_factory=threading.Event)
    loop: threading.Thread | None = None

    def start_loop(self) -> None:
        """The supervisor's own loop (``run_forever``), as ``omaticaya mps`` runs it."""
        self.loop_stop = threading.Event()
        self.loop = threading.Thread(target=self.supervisor.run_forever, args=(self.loop_stop,),
                                     name="mps-supervisor", daemon=True)  # fmt: skip
        self.loop.start()

    def stop_loop(self) -> None:
        self.loop_stop.set()
        if self.loop is not None:
            self.loop.join(30)
            assert not self.loop.is_alive(), "the supervisor's loop did not stop within 30s"
            self.loop = None

    def look(self) -> dict[tuple[str, tuple[str, ...]], int]:
        """A fresh reading, then GPU 0's units by (health, reasons) -> how many."""
        self.agent.tick()
        self.plugins.notify()
        out: dict[tuple[str, tuple[str, ...]], int] = {}
        for d in self.plugins.shared_plugin.devices():
            key = ("Healthy" if d.healthy else "Unhealthy", d.reasons)
            out[key] = out.get(key, 0) + 1
        return out

    def allocate(self, first: int, n: int) -> Any:
        from omaticaya_py.core.model.sharing import unit_ids
        from omaticaya_py.deviceplugin.v1beta1 import api_pb2

        self.agent.tick()
        ids = unit_ids(self.uuid, self.units)[first : first + n]
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devicesIDs=ids)]
        )
        return self.stub.Allocate(request, timeout=10).container_responses[0]

    def stop_supervisor(self) -> None:
        """``Supervisor.stop``, once (a second one would signal a reaped daemon's group)."""
        if not self.stopped.get("supervisor"):
            self.stopped["supervisor"] = True
            self.supervisor.stop()

    def daemon_log(self, sid: str = "") -> str:
        """The last lines of a daemon's logs (the probe's, or slice ``sid``'s; for failure
        messages)."""
        tail = []
        folder = self.layout.slice_dir(sid) / "log" if sid else self.layout.log(self.uuid)
        for name in ("supervisor-daemon.log", "control.log", "server.log"):
            path = folder / name
            with contextlib.suppress(OSError):
                tail.append(
                    f"{name}: " + " | ".join(path.read_text(errors="replace").splitlines()[-5:])
                )
        return "; ".join(tail) or "no daemon log"


@pytest.fixture
def node() -> Iterator[Node]:
    from omaticaya_py.agent import Agent, NodeApi
    from omaticaya_py.core.allocation.mps import Layout
    from omaticaya_py.core.model.sharing import unit_count
    from omaticaya_py.deviceplugin import DevicePluginSet
    from omaticaya_py.deviceplugin.v1beta1 import api_pb2_grpc
    from omaticaya_py.mps import Supervisor, SupervisorOptions
    from omaticaya_py.sources.nvml import NvmlReader
    from tests.deviceplugin.device_plugin_support import FakeKubelet
    from tests.helpers import settings

    figures = Figures()
    uuid, total_mib, mode = _gpu0()
    units = unit_count(total_mib, UNIT_MIB)
    figures.add("GPU 0", {"uuid": uuid, "memory_total_mib": total_mib, "units": units,
                          "compute_mode": mode})  # fmt: skip
    # short: a unix socket's path is at most 107 bytes (<root>/<GPU UUID>/pipe/control; the
    # plugin's sockets); pytest's tmp_path is too long for the daemon's
    scratch = Path(tempfile.mkdtemp(prefix="om-mps-", dir="/tmp"))
    layout = Layout(scratch / "mps", scratch / "state")
    plugin_dir = scratch / "dp"
    plugin_dir.mkdir()
    # a 64 MiB tmpfs per slice: its daemon's /dev/shm (a mount namespace of its own) and its
    # clients' (the answer's mount)
    supervisor = Supervisor(layout, [(0, uuid, units)], UNIT_MIB,
                            SupervisorOptions("nvidia-cuda-mps-control", check_s=0.5, start_timeout_s=30.0, shm_mib=64))  # fmt: skip
    cleanup: list[tuple[str, Any]] = []
    stopped: dict[str, bool] = {}
    channel = None
    try:
        t0 = time.monotonic()
        supervisor.start()
        cleanup.append(("supervisor.stop", lambda: stopped.get("supervisor") or supervisor.stop()))
        figures.add("probe daemon start (supervisor.start, s)", round(time.monotonic() - t0, 3))

        s = settings(
            device_plugin_dir=str(plugin_dir), device_plugin_resource="example.com/gpu",
            shared_resource="example.com/gpu-memory", shared_gpus="0", share_unit_mib=UNIT_MIB,
            share_enforcement="mps", mps_root=str(layout.root), mps_state_dir=str(layout.state_dir),
            device_list_strategy="envvar",  # the runtime's /dev/null mounts mean nothing here
            schedule="@every 1s",
        )  # fmt: skip
        agent = Agent(s, NvmlReader(watch_xid=False), NodeApi(None, dry_run=True, lease=None),
                      attribution=None)  # fmt: skip
        cleanup.append(("reader.close", agent.reader.close))
        agent.tick()
        plugins = DevicePluginSet.from_settings(agent, s)
        assert plugins.shared_plugin is not None and plugins.shared_plugin.mps is not None
        plugins.shared_plugin.mps.min_interval_s = 0.0  # every look reads the state file
        kubelet = FakeKubelet(plugin_dir)
        kubelet.start()
        cleanup.append(("kubelet.stop", kubelet.stop))
        plugins.start()
        cleanup.append(("plugins.stop", lambda: plugins.stop(0)))
        assert plugins.wait_registered(15), "the device plugins did not register with the kubelet"
        channel = grpc.insecure_channel(f"unix://{plugins.shared_plugin.socket_path}")
        cleanup.append(("channel.close", channel.close))
        n = Node(uuid, total_mib, units, mode, layout, supervisor, agent, plugins, channel,
                 api_pb2_grpc.DevicePluginStub(channel), scratch, figures, stopped)  # fmt: skip
        cleanup.append(("stop_loop", n.stop_loop))
        yield n
    finally:
        problems = []
        for what, undo in reversed(cleanup):
            try:
                undo()
            except Exception as exc:  # noqa: BLE001 - undo the rest, then say it
                problems.append(f"{what}: {exc}")
        shutil.rmtree(scratch, ignore_errors=True)
        print("[mps-nvml] figures:\n" + figures.dump(), flush=True)
        assert not problems, f"clean-up failed: {problems}"


def _refused(result: Any) -> bool:
    return isinstance(result, dict) and result.get("code") == OUT_OF_MEMORY


# -- the test --------------------------------------------------------------------------------------


def _slice_state(node: Node, sid: str) -> Any:
    from omaticaya_py.sources.mps import read_slice_state

    return read_slice_state(node.layout, sid)[0]


def test_slices_are_enforced_by_mps_on_gpu_0(node: Node) -> None:
    from omaticaya_py.core.allocation.mps import MPS_LIMIT_ENV, PIPE_ENV, slice_id
    from omaticaya_py.core.model.sharing import unit_ids
    from omaticaya_py.deviceplugin.v1beta1 import api_pb2
    from tests.waiting import wait_for

    fig, layout, uuid = node.figures, node.layout, node.uuid

    # 1. the probe is up, with one unit as its default limit (no client is ever given it)
    state = node.supervisor.states()[uuid]
    assert state.state == "up", (f"expected GPU 0's probe daemon up after start; it is "
                                 f"{state.state} ({state.reason}); {node.daemon_log()}")  # fmt: skip
    assert state.limit_mib == UNIT_MIB
    probe_pid = state.pid
    fig.add("probe daemon", {"pid": probe_pid, "default_limit_mib": state.limit_mib})
    node.start_loop()

    # 2. the device plugin serves GPU 0's units, Healthy, and answers two slices, each with a
    # daemon of its own whose default limit is the slice
    wait_for("GPU 0's units Healthy", lambda: node.look() == {("Healthy", ()): node.units}, 20)
    stream = node.stub.ListAndWatch(api_pb2.Empty(), timeout=10)
    listed = next(stream)
    stream.cancel()
    assert len(listed.devices) == node.units and {d.health for d in listed.devices} == {"Healthy"}
    ids = unit_ids(uuid, node.units)
    t0 = time.monotonic()
    small = node.allocate(0, 8)
    fig.add("Allocate of an 8 GiB slice, its daemon started (s)", round(time.monotonic() - t0, 3))
    big = node.allocate(8, 16)
    sids = {8: slice_id(",".join(sorted(ids[0:8]))), 16: slice_id(",".join(sorted(ids[8:24])))}
    for answer, gib in ((small, 8), (big, 16)):
        sid = sids[gib]
        envs = dict(answer.envs)
        mounts = {m.container_path: m.host_path for m in answer.mounts}
        pipe = str(layout.slice_pipe(sid))
        assert envs[PIPE_ENV] == pipe and envs[MPS_LIMIT_ENV] == f"0={gib * GIB}M", envs
        assert envs["NVIDIA_VISIBLE_DEVICES"] == uuid, envs
        assert mounts == {pipe: pipe, "/dev/shm": str(layout.slice_shm(sid))}, mounts
        st = _slice_state(node, sid)
        assert st is not None and (st.state, st.limit_mib) == ("up", gib * GIB), st
        fig.add(f"Allocate {gib} GiB answer", {"envs": envs, "mounts": mounts, "daemon": st.pid})

    # 3. both clients at once, the 8 GiB one hostile (its own limit: the whole GPU): each holds,
    # then tries more than its slice while the other holds
    whole = {MPS_LIMIT_ENV: f"0={node.total_mib}M"}
    go = node.scratch / "go"
    a = start_client("the 8 GiB slice's client asking the whole GPU", small, uuid,
                     ["--hold", str(6 * GIB), "--go", str(go), "--hold-s", "3", str(12 * GIB), str(GIB)],
                     ready=node.scratch / "ready-a", env_over=whole)  # fmt: skip
    b = start_client("the 16 GiB slice's client", big, uuid,
                     ["--hold", str(12 * GIB), "--go", str(go), "--hold-s", "3", str(20 * GIB), str(2 * GIB)],
                     ready=node.scratch / "ready-b")  # fmt: skip
    try:
        held_a, held_b = a.wait_ready(), b.wait_ready()
        for held, c, gib, sid in ((held_a, a, 6, sids[8]), (held_b, b, 12, sids[16])):
            assert held["hold"]["result"] == "ok", (
                f"{c.what}: expected {gib} GiB allocated within its slice; got {held['hold']}; "
                f"{node.daemon_log(sid)}"
            )
        assert held_a["env"][MPS_LIMIT_ENV] == whole[MPS_LIMIT_ENV]  # it did ask for all
        fig.add("NVML while both clients hold (6 + 12 GiB)", _nvml_processes(uuid))
        go.touch()
        got_a, got_b = a.result(), b.result()
    finally:
        a.kill()
        b.kill()
    for got, c, refused, ok in ((got_a, a, 12, 1), (got_b, b, 20, 2)):
        fig.add(f"{c.what}", {k: got.get(k) for k in ("pid", "uuid", "init_s", "context_s",
                              "fresh_mem_info", "hold", "held_mem_info", "tries", "go")})  # fmt: skip
        assert "go" not in got, f"{c.what}: {got['go']}"
        assert got["uuid"] == uuid, f"{c.what}: expected GPU 0 ({uuid}); it saw {got['uuid']}"
        assert _refused(got["tries"][str(refused * GIB)]), (
            f"{c.what}: expected {refused} GiB refused with CUDA_ERROR_OUT_OF_MEMORY (2), the GPU "
            f"having room; got {got['tries'][str(refused * GIB)]}"
        )
        assert got["tries"][str(ok * GIB)] == "ok", (
            f"{c.what}: expected {ok} GiB more to fit its slice; got {got['tries'][str(ok * GIB)]}"
        )
    small_daemon = _slice_state(node, sids[8]).pid
    fig.add("MPS servers of the slices' daemons",
            {str(g): {str(p): _cmdline(p) for p in _children(_slice_state(node, sids[g]).pid)}
             for g in (8, 16)})  # fmt: skip

    # 4. two processes with one answer (one container's workers): the limit is per process
    go2 = node.scratch / "go2"
    w1 = start_client("worker 1 of the 8 GiB slice", small, uuid,
                      ["--hold", str(6 * GIB), "--go", str(go2), "--hold-s", "1"],
                      ready=node.scratch / "ready-w1")  # fmt: skip
    w2 = start_client("worker 2 of the 8 GiB slice", small, uuid,
                      ["--hold", str(6 * GIB), "--go", str(go2), "--hold-s", "1"],
                      ready=node.scratch / "ready-w2")  # fmt: skip
    try:
        h1, h2 = w1.wait_ready(), w2.wait_ready()
        fig.add("two workers of one 8 GiB slice, 6 GiB each", {
            "worker 1": h1["hold"], "worker 2": h2["hold"], "nvml": _nvml_processes(uuid)})  # fmt: skip
        go2.touch()
        w1.result()
        w2.result()
    finally:
        w1.kill()
        w2.kill()
    assert h1["hold"]["result"] == "ok" and h2["hold"]["result"] == "ok", (
        "expected each worker held to the slice on its own (the limit is per process below "
        f"r615): {h1['hold']}, {h2['hold']}"
    )

    # 5. no answer, no limit: the same GPU gives a plain process 20 GiB
    if node.compute_mode == "EXCLUSIVE_PROCESS":
        fig.add(
            "unlimited client",
            "not run: GPU 0 is EXCLUSIVE_PROCESS, only the MPS server may use it",
        )
    else:
        go_u = node.scratch / "go-u"
        u = start_client("a process with no answer", None, uuid,
                         ["--go", str(go_u), str(20 * GIB)], ready=node.scratch / "ready-u")  # fmt: skip
        try:
            u.wait_ready()
            fig.add("NVML with a fresh non-MPS context (and the idle MPS servers)",
                    _nvml_processes(uuid))  # fmt: skip
            go_u.touch()
            got_u = u.result()
        finally:
            u.kill()
        fig.add("unlimited client", {k: got_u.get(k) for k in ("pid", "init_s", "context_s",
                                                               "fresh_mem_info", "tries")})  # fmt: skip
        assert got_u["tries"][str(20 * GIB)] == "ok", (
            f"a process with no answer: expected 20 GiB allocated (no limit); got "
            f"{got_u['tries'][str(20 * GIB)]}"
        )

    # 6. a running container: its slice's daemon killed and restarted in the same pipe folder;
    # a new process in the container reaches it and is held to the slice
    box = start_container(small)
    try:
        t_kill = time.monotonic()
        os.kill(small_daemon, signal.SIGKILL)
        back = wait_for("the slice's daemon restarted", lambda: (st := _slice_state(node, sids[8]))
                        is not None and st.state == "up" and st.pid != small_daemon and st, 60, 0.05)  # fmt: skip
        fig.add("slice daemon restart", {"kill_to_up_s": round(time.monotonic() - t_kill, 3),
                                         "pid": back.pid, "starts": back.starts})  # fmt: skip
        late = start_client("a new process in the running 8 GiB container", small, uuid,
                            ["--hold", str(6 * GIB), str(12 * GIB)], inside=box.pid,
                            env_over=whole)  # fmt: skip
        try:
            got_l = late.result()
        finally:
            late.kill()
    finally:
        box.stop()
    fig.add(late.what, {k: got_l.get(k) for k in ("pid", "init_s", "context_s", "hold", "tries")})
    assert got_l["hold"]["result"] == "ok", f"{late.what}: expected 6 GiB; got {got_l['hold']}"
    assert _refused(got_l["tries"][str(12 * GIB)]), (
        f"{late.what}: expected 12 GiB refused (the restarted daemon's limit); got "
        f"{got_l['tries'][str(12 * GIB)]}"
    )

    # 7. the probe killed: down, units Unhealthy, Allocate refused; restarted: back
    node.stop_loop()  # one check by hand, so the test sees the down state before the restart
    os.kill(probe_pid, signal.SIGKILL)
    wait_for("the killed probe reaped", lambda: not _alive(probe_pid) or None, 10)
    node.supervisor.check()
    down = node.supervisor.states()[uuid]
    assert down.state == "down", f"expected the probe down after SIGKILL; it is {down.state}"
    health = node.look()
    assert set(health) == {("Unhealthy", ("mps-daemon-down",))}, (
        f"expected every GPU 0 unit Unhealthy (mps-daemon-down); got {health}"
    )
    with pytest.raises(grpc.RpcError) as err:
        node.allocate(24, 8)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value
    assert "mps-daemon-down" in (err.value.details() or ""), err.value.details()
    t_kill = time.monotonic()
    node.start_loop()
    wait_for(
        "GPU 0's units Healthy again", lambda: node.look() == {("Healthy", ()): node.units}, 90, 0.1
    )
    fig.add("probe restart", {"to_healthy_s": round(time.monotonic() - t_kill, 3)})

    # 8. undone: the loop stopped, every daemon stopped, nothing left
    node.stop_loop()
    pids = [p for p in (node.supervisor.states()[uuid].pid,
                        *(st.pid for st in node.supervisor.slice_states().values())) if p]  # fmt: skip
    servers = [c for p in pids for c in _children(p)]
    node.stop_supervisor()
    assert not any(_alive(p) for p in pids), f"a daemon still runs: {pids}"
    assert not layout.state(uuid).exists(), "the probe's state file is left"
    assert not layout.root.exists(), f"left under {layout.root}: {sorted(layout.root.rglob('*'))}"
    wait_for("no MPS server left", lambda: not [p for p in servers if _alive(p)], 10)
    fig.add("NVML after stop", _nvml_processes(uuid))

"""The dev cluster's supervisor (devtools/devcluster): its JSON state, process groups, the
pid-reuse guard and the readiness helper, on real processes (no cluster needed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from devtools.devcluster import procs
from devtools.devcluster.cluster import bin_dir
from devtools.devcluster.state import (
    DevClusterError,
    FullState,
    KubeletState,
    Ports,
    Proc,
    State,
    load_state,
)
from tests.devcluster import REPO_ROOT

PORTS = Ports(etcd_client=2379, etcd_peer=2380, apiserver=6443, scheduler=10259)
FULL = FullState("omaticaya0", "10.217.0.0/24", "10.217.0.1", 10257, 10256, 10249)


@pytest.mark.parametrize(
    "state",
    [
        State(ports=PORTS),
        State(ports=PORTS, procs={"etcd": Proc(12, 345, ("/usr/bin/etcd", "--name", "x y"))}),
        State(ports=PORTS, kubelet=KubeletState("omaticaya-kubelet", 10250, 10248)),
        State(ports=PORTS, kubelet=KubeletState("n", 1, 2), full=FULL, image_key="omaticaya-0.1.0-ab",
              scheduler_image_key="kube-scheduler-v1.37.2-0123456789abcdef"),
    ],
    ids=["ports", "procs", "kubelet", "full"],
)
def test_state_round_trips_through_json(tmp_path: Path, state: State) -> None:
    state.save(tmp_path)
    assert load_state(tmp_path) == state
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        "{}",
        '{"ports": {"apiserver": 1}}',
        '{"ports": {"etcd_client": 1, "etcd_peer": 2, "apiserver": 3, "scheduler": 4},'
        ' "procs": {"etcd": {"pid": "x", "start_ticks": 1, "argv": []}}}',
        '{"ports": {"etcd_client": 1, "etcd_peer": 2, "apiserver": 3, "scheduler": 4},'
        ' "full": {"pod_bridge": "b"}}',
    ],
    ids=["not-json", "list", "empty", "ports-missing", "pid-not-int", "full-missing"],
)
def test_unreadable_state_is_an_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "state.json").write_text(text)
    with pytest.raises(DevClusterError, match="unreadable dev cluster state"):
        load_state(tmp_path)


def test_no_state_before_up(tmp_path: Path) -> None:
    assert load_state(tmp_path) is None


def _group_members(pgid: int) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(entry.name))
    return out


def test_spawn_gives_a_process_group_and_stop_ends_all_of_it(tmp_path: Path) -> None:
    log = tmp_path / "sh.log"
    proc = procs.spawn("sh", ["sh", "-c", "sleep 300 & echo started; wait"], log)
    procs.wait_until("the child", lambda: len(_group_members(proc.pid)) == 2, 10)
    assert os.getpgid(proc.pid) == proc.pid == os.getsid(proc.pid)
    assert procs.alive(proc)
    procs.stop("sh", proc)
    assert not procs.alive(proc)
    assert _group_members(proc.pid) == []
    assert "started" in log.read_text()


def test_stop_kills_what_ignores_sigterm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs, "STOP_TIMEOUT_S", 0.5)
    proc = procs.spawn("stubborn", ["sh", "-c", "trap '' TERM; echo ready; sleep 300"],
                       tmp_path / "stubborn.log")
    procs.wait_until("ready", lambda: "ready" in (tmp_path / "stubborn.log").read_text(), 10)
    procs.stop("stubborn", proc)
    assert _group_members(proc.pid) == []


def test_a_reused_pid_is_not_ours_and_is_not_signalled(tmp_path: Path) -> None:
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        real = procs.identify(other.pid, ["sleep"])
        assert procs.alive(real)
        # the pid recorded by an earlier cluster, now another process's: another start time
        stale = Proc(other.pid, real.start_ticks - 1, ("/usr/bin/etcd",))
        assert not procs.alive(stale)
        procs.stop("etcd", stale)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
    assert not procs.alive(real)


def test_wait_until_returns_when_ready_and_counts_oserror_as_not_ready() -> None:
    calls = []

    def ready() -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError
        return True

    assert procs.wait_until("thing", ready, 10, poll_s=0.01) >= 0
    assert len(calls) == 3


def test_wait_until_times_out_with_the_log_named(tmp_path: Path) -> None:
    with pytest.raises(DevClusterError, match=r"thing ready: not after 0.2 s \(log: .*x.log\)"):
        procs.wait_until("thing ready", lambda: False, 0.2, log_path=tmp_path / "x.log",
                         poll_s=0.01)


def test_wait_until_stops_when_the_process_exits(tmp_path: Path) -> None:
    log = tmp_path / "failing.log"
    proc = procs.spawn("failing", ["sh", "-c", "echo bad flag >&2; exit 3"], log)
    with pytest.raises(DevClusterError, match="failing ready: sh exited"):
        procs.wait_until("failing ready", lambda: False, 60, proc=proc, log_path=log)
    assert "bad flag" in log.read_text()


@pytest.mark.parametrize(("line", "reason"), [
    ('E1127 21:10:57.872669     915 run.go:72] "command failed" err="failed to validate kubelet '
     'configuration, error: kubelet is configured to not run on a host using cgroup v1."',
     "failed to validate kubelet configuration, error: kubelet is configured to not run on a "
     "host using cgroup v1."),
    ('E1127 10:00:00.1 1 run.go:72] "command failed" err="failed to create listener: failed to '
     'listen on 127.0.0.1:6443: listen tcp 127.0.0.1:6443: bind: address already in use"',
     "failed to create listener: failed to listen on 127.0.0.1:6443: listen tcp 127.0.0.1:6443: "
     "bind: address already in use"),
    ('time="2026-11-27T20:24:11Z" level=fatal msg="failed to load config"',
     'time="2026-11-27T20:24:11Z" level=fatal msg="failed to load config"'),
    ("I1127 all is well", ""),
])
def test_why_names_the_reason_a_component_gave(tmp_path: Path, line: str, reason: str) -> None:
    log = tmp_path / "c.log"
    log.write_text(f"I1127 starting\n{line}\nI1127 shutting down\n")
    assert procs.why(log) == reason


def test_a_kubelet_refusing_this_host_says_why_in_one_line(tmp_path: Path) -> None:
    """The real kubelet told to refuse cgroup v1 (``failCgroupV1: true``) on a cgroup v1 host:
    the supervisor's error names the kubelet's own reason, not only the log file."""
    kubelet = bin_dir() / "kubelet"
    if not os.access(kubelet, os.X_OK):
        pytest.skip(f"{kubelet} not built (scripts/dev-cluster build --kubelet)")
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        pytest.skip("this host runs cgroup v2: the kubelet has nothing to refuse")
    config = tmp_path / "config.yaml"
    config.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                      "failCgroupV1: true\nfailSwapOn: false\n")
    log = tmp_path / "kubelet.log"
    proc = procs.spawn("kubelet", [str(kubelet), "--config", str(config), "--root-dir",
                                   str(tmp_path / "root")], log)
    with pytest.raises(DevClusterError, match=r"Node ready: kubelet exited: .*cgroup v1") as e:
        procs.wait_until("Node ready", lambda: False, 60, proc=proc, log_path=log)
    assert "\n" not in str(e.value)


def test_script_status_and_usage_without_a_cluster(tmp_path: Path) -> None:
    env = dict(os.environ, OMATICAYA_DEV_DIR=str(tmp_path / "none"))
    script = str(REPO_ROOT / "scripts" / "dev-cluster")
    status = subprocess.run([script, "status"], env=env, capture_output=True, text=True)
    assert status.returncode == 1
    assert status.stdout.splitlines()[-1] == "status: down"
    assert "etcd: stopped" in status.stdout
    bad = subprocess.run([script, "no-such-command"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "scripts/dev-cluster up" in bad.stderr
    down = subprocess.run([script, "down"], env=env, capture_output=True, text=True)
    assert down.returncode == 0 and "nothing to stop" in down.stderr


def test_down_stops_what_the_bash_scripts_pid_files_name(tmp_path: Path) -> None:
    """A state dir from before state.json (``<name>.pid`` files): ``down`` stops the processes
    whose command line holds their binary's name, and nothing else."""
    etcd = subprocess.Popen(["bash", "-c", "exec -a /usr/bin/etcd sleep 300"],
                            start_new_session=True)
    (tmp_path / "etcd.pid").write_text(f"{etcd.pid}\n")
    (tmp_path / "apiserver.pid").write_text(f"{os.getpid()}\n")  # a reused pid: not ours
    env = dict(os.environ, OMATICAYA_DEV_DIR=str(tmp_path))
    try:
        procs.wait_until("etcd's command line", lambda: "etcd" in Path(
            f"/proc/{etcd.pid}/cmdline").read_text(), 10)
        down = subprocess.run([str(REPO_ROOT / "scripts" / "dev-cluster"), "down"], env=env,
                              capture_output=True, text=True)
        assert down.returncode == 0, down.stderr
        assert etcd.wait(timeout=10) == -15
        assert f"stopping etcd (pid {etcd.pid})" in down.stderr
        assert "apiserver" not in down.stderr.replace("down (", "")
        assert not (tmp_path / "etcd.pid").exists()
        assert not (tmp_path / "state.json").exists()
    finally:
        etcd.kill()
        etcd.wait()

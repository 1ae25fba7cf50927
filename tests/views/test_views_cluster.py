"""``omaticaya top`` and ``kubectl omaticaya top`` end to end against the real kube-apiserver:
Nodes labelled by the real agent replaying traces (one healthy, one unhealthy, one whose agent
stopped: stale), read back as a user sees them: in a pseudo-terminal, through a pipe, as JSON,
with ``--watch``, and through the real kubectl."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import queue
import re
import struct
import subprocess
import sys
import termios
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.helpers import FAULTS_TRACE, H100_TRACE
from tests.tools import ToolUnavailable, kubectl_path
from tests.views.views_cluster_support import (  # the names moved out, for this file's tests
    _token_kubeconfig,  # noqa: F401
)
from tests.waiting import wait_for

pytestmark = pytest.mark.cluster

P = "omaticaya.io/"
BIN = Path(sys.executable).parent


def _agent(env: dict[str, str], node: str, trace: Path, at: float) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "omaticaya_py", "once", "--trace", str(trace),
         "--trace-at", str(at)],
        env=dict(env, NODE_NAME=node), capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr


def _top(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omaticaya_py", "top", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )


@pytest.fixture
def fleet(dev_cluster, admin_api, make_node):
    """Three Nodes under one test label: healthy (H100 trace at 14 s: busy), unhealthy (the
    faults trace at 10 s: remapped rows pending on GPU 1) and stale (labelled, then its
    reading moved an hour back, as an agent that stopped two hours ago would leave it)."""
    tag = f"top-{os.getpid()}"
    env = dict(dev_cluster.env(), NO_COLOR="")
    env.pop("NO_COLOR")
    healthy, unhealthy, stale = (make_node(labels={"omaticaya-test": tag}) for _ in range(3))
    _agent(env, healthy, H100_TRACE, 14)
    _agent(env, unhealthy, FAULTS_TRACE, 10)
    _agent(env, stale, H100_TRACE, 2)
    doc = json.loads(admin_api.read_node(stale).metadata.annotations[P + "telemetry"])
    then = datetime.now(UTC) - timedelta(hours=2)
    doc["read_at"] = then.strftime("%Y-%m-%dT%H:%M:%SZ")
    doc["expires_at"] = (then + timedelta(seconds=330)).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc["refresh_s"] = 330
    admin_api.patch_node(stale, {"metadata": {"annotations": {P + "telemetry": json.dumps(doc)}}})
    return {"env": env, "selector": f"omaticaya-test={tag}", "healthy": healthy,
            "unhealthy": unhealthy, "stale": stale}


def _rows(text: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in text.splitlines()
            if line.startswith("gpu-node-")}


def test_top_table_through_a_pipe(fleet):
    done = _top("-l", fleet["selector"], env=fleet["env"])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["NODE", "HEALTH", "GPUS", "FREE", "TOTAL", "UTIL", "TEMP", "AGE"]
    assert max(len(line) for line in lines) <= 80 and "\x1b" not in done.stdout
    rows = _rows(done.stdout)
    assert set(rows) == {fleet["healthy"], fleet["unhealthy"], fleet["stale"]}
    h, u, s = rows[fleet["healthy"]], rows[fleet["unhealthy"]], rows[fleet["stale"]]
    assert h[1:4] == ["Healthy", "1/1", "48.0Gi"] and h[5] == "22%" and "STALE" not in h
    assert u[1:3] == ["Degraded", "3/4"]
    assert s[1] == "Healthy" and s[-2:] == ["2h", "STALE"]


def test_top_filters_sort_and_gpus(fleet):
    env, sel = fleet["env"], fleet["selector"]
    only = _top("-l", sel, "--unhealthy", env=env)
    assert list(_rows(only.stdout)) == [fleet["unhealthy"]]
    stale = _top("-l", sel, "--stale", env=env)
    assert list(_rows(stale.stdout)) == [fleet["stale"]]
    by_age = _top("-l", sel, "--sort", "age", env=env)
    assert list(_rows(by_age.stdout))[0] == fleet["stale"]
    gpus = _top("-l", sel, "--gpus", "--unhealthy", env=env)
    assert gpus.returncode == 0, gpus.stderr
    lines = [line for line in gpus.stdout.splitlines() if line.strip()]
    assert lines[0].split() == ["NODE", "GPU", "UUID", "USED", "GIB-FREE", "UTIL", "TEMP",
                                "PROC", "HEALTH"]
    assert max(len(line) for line in lines) <= 80
    text = gpus.stdout
    assert "Unhealthy" in text and "remap-pending" in text, text


def test_top_json(fleet):
    done = _top("-l", fleet["selector"], "-o", "json", env=fleet["env"])
    assert done.returncode == 0, done.stderr
    nodes = {n["name"]: n for n in json.loads(done.stdout)["nodes"]}
    h, u, s = nodes[fleet["healthy"]], nodes[fleet["unhealthy"]], nodes[fleet["stale"]]
    assert (h["health"], h["gpu_count"], h["healthy"], h["free_mib"], h["stale"]) == (
        "Healthy", 1, 1, 49152, False)
    assert h["gpus"][0]["uuid"].startswith("GPU-") and h["gpus"][0]["processes"] == 1
    assert (u["health"], u["unhealthy"]) == ("Degraded", True)
    assert [g["reasons"] for g in u["gpus"]][1] == ["remap-pending"]
    assert s["stale"] is True and s["age_s"] > 7000


def test_top_bad_telemetry_shows_invalid(fleet, admin_api):
    admin_api.patch_node(fleet["healthy"],
                         {"metadata": {"annotations": {P + "telemetry": '{"gpus": "x"'}}})
    done = _top("-l", fleet["selector"], env=fleet["env"])
    assert done.returncode == 0, done.stderr
    assert _rows(done.stdout)[fleet["healthy"]][1] == "Invalid"
    wide = _top("-l", fleet["selector"], "-o", "wide", env=fleet["env"])
    assert "unreadable telemetry annotation" in wide.stdout


def _winsize(fd: int, rows: int = 40, cols: int = 80) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class _Pty:
    """A command on a pseudo-terminal of 80 columns; its output collected by a thread."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        master, slave = pty.openpty()
        _winsize(slave)
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                     env=dict(env, TERM="xterm-256color"), close_fds=True)
        os.close(slave)
        self.master = master
        self.chunks: queue.Queue[bytes] = queue.Queue()
        self.text = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                data = b""
            self.chunks.put(data)
            if not data:
                return

    def output(self) -> str:
        while True:
            try:
                data = self.chunks.get_nowait()
            except queue.Empty:
                return self.text
            self.text += data.decode("utf-8", "replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=20)
        os.close(self.master)


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_top_in_a_terminal_has_colour(fleet):
    term = _Pty([sys.executable, "-m", "omaticaya_py", "top", "-l", fleet["selector"]],
                fleet["env"])
    try:
        term.proc.wait(timeout=60)
        text = wait_for("top's output", lambda: fleet["stale"] in term.output() and term.text)
    finally:
        term.stop()
    assert term.proc.returncode == 0, text
    assert "\x1b[" in text  # colour on a terminal
    plain = ANSI.sub("", text).replace("\r", "")
    rows = _rows(plain)
    assert rows[fleet["unhealthy"]][1] == "Degraded" and "STALE" in rows[fleet["stale"]]
    assert max(len(line) for line in plain.splitlines()) <= 80


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    got: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            got.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return got


def test_watch_redraws_when_a_node_changes(fleet):
    proc = subprocess.Popen(
        [sys.executable, "-m", "omaticaya_py", "top", "-l", fleet["selector"], "--watch",
         "-o", "json", "--interval", "30"],
        env=dict(fleet["env"], PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE, text=True,
    )
    lines = _lines(proc)
    seen: list[dict] = []

    def util_of(node: str):
        while not lines.empty():
            seen.append(json.loads(lines.get_nowait()))
        for doc in reversed(seen):
            for n in doc["nodes"]:
                if n["name"] == node:
                    return n["util_pct"]
        return None

    try:
        assert wait_for("the first draw", lambda: util_of(fleet["healthy"]) == 22.4, 30)
        first = len(seen)
        _agent(fleet["env"], fleet["healthy"], H100_TRACE, 2)  # idle: utilisation 0
        wait_for("a redraw with the new utilisation",
                 lambda: util_of(fleet["healthy"]) == 0.0, 30)
        assert len(seen) > first
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_watch_in_a_terminal_redraws(fleet):
    term = _Pty([sys.executable, "-m", "omaticaya_py", "top", "-l", fleet["selector"],
                 "--watch", "--interval", "300", "--gpus"], fleet["env"])
    try:
        wait_for("the first draw", lambda: fleet["stale"] in ANSI.sub("", term.output()), 30)
        mark = len(term.text)
        _agent(fleet["env"], fleet["healthy"], H100_TRACE, 2)
        # the healthy node's GPU goes idle: its row is redrawn with 0% (the watch's event; the
        # interval's redraw would come only after 300 s)
        wait_for("a redraw", lambda: re.search(
            re.escape(fleet["healthy"][:10]) + r".*\s0%",
            ANSI.sub("", term.output()[mark:])), 30)
    finally:
        term.stop()


def test_kubectl_plugin(fleet, dev_cluster):
    try:
        kubectl = kubectl_path()
    except ToolUnavailable as exc:
        pytest.skip(f"kubectl: {exc}")
    assert (BIN / "kubectl-omaticaya").exists(), "pip install -e . installs the console script"
    env = dict(fleet["env"], PATH=f"{BIN}{os.pathsep}{fleet['env'].get('PATH', '')}")
    listed = subprocess.run([str(kubectl), "plugin", "list"], env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert "kubectl-omaticaya" in listed.stdout, listed.stdout + listed.stderr
    kubeconfig = str(dev_cluster.kubeconfig)
    context = subprocess.run([str(kubectl), "config", "current-context",
                              "--kubeconfig", kubeconfig], env=env, capture_output=True,
                             text=True, timeout=60, check=True).stdout.strip()
    env.pop("KUBECONFIG", None)
    done = subprocess.run(
        [str(kubectl), "omaticaya", "top", "--kubeconfig", kubeconfig, "--context", context,
         "-l", fleet["selector"], "-o", "json"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    names = {n["name"] for n in json.loads(done.stdout)["nodes"]}
    assert names == {fleet["healthy"], fleet["unhealthy"], fleet["stale"]}
    table = subprocess.run(
        [str(kubectl), "omaticaya", "--kubeconfig", kubeconfig, "-l", fleet["selector"]],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert table.returncode == 0 and fleet["unhealthy"] in _rows(table.stdout), table.stderr
    bad = subprocess.run(
        [str(kubectl), "omaticaya", "top", "--kubeconfig", kubeconfig, "--context", "nope"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert bad.returncode == 1 and "nope" in bad.stderr and "Traceback" not in bad.stderr




def test_top_needs_only_list_and_watch_on_nodes(fleet, dev_cluster, admin_api, tmp_path):
    from kubernetes import client as k

    rbac = k.RbacAuthorizationV1Api(admin_api.api_client)
    suffix = os.getpid()
    role = f"top-viewer-{suffix}"
    rbac.create_cluster_role({"metadata": {"name": role}, "rules": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]})
    viewer = _token_kubeconfig(dev_cluster, admin_api, tmp_path, role)
    rbac.create_cluster_role_binding({
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": role, "namespace": "default"}]})
    nobody = _token_kubeconfig(dev_cluster, admin_api, tmp_path, f"top-nobody-{suffix}")
    try:
        env = dict(fleet["env"])
        env.pop("KUBECONFIG", None)
        shown = wait_for(  # the binding reaches the authorizer's cache
            "top as the list/watch-only user",
            lambda: (d := _top("--kubeconfig", str(viewer), "-l", fleet["selector"], "-o",
                               "json", env=env)).returncode == 0 and d, 30)
        assert len(json.loads(shown.stdout)["nodes"]) == 3
        proc = subprocess.Popen(
            [sys.executable, "-m", "omaticaya_py", "top", "--kubeconfig", str(viewer), "-l",
             fleet["selector"], "--watch", "-o", "json", "--interval", "300"],
            env=dict(env, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE, text=True)
        try:
            lines = _lines(proc)
            wait_for("the first draw", lambda: lines.qsize() >= 1, 30)
            _agent(fleet["env"], fleet["healthy"], H100_TRACE, 2)
            wait_for("a redraw seen through the watch", lambda: lines.qsize() >= 2, 30)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        denied = _top("--kubeconfig", str(nobody), env=env)
        assert denied.returncode == 1
        assert "403" in denied.stderr and "needs list and watch on nodes" in denied.stderr
        assert "Traceback" not in denied.stderr
    finally:
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)


# ------------------------------------------------------------- Lease-mode nodes ----

LEASES_NS = "omaticaya-top-leases"


@pytest.fixture
def lease_fleet(fleet, admin_api, make_node):
    """Three Lease-mode Nodes labelled by the real agent, whose labels last changed two hours
    ago (a quiet node: the agent rewrites its telemetry only when a label changes): one whose
    Lease was just renewed, one whose Lease lapsed an hour ago, one whose Lease is missing."""
    from tests.scheduler.untrusted_time_support import put_lease

    tag = f"top-leases-{os.getpid()}"
    renewed, lapsed, missing = (make_node(labels={"omaticaya-test": tag}) for _ in range(3))
    two_hours_ago = datetime.now(UTC) - timedelta(hours=2)
    for node in (renewed, lapsed, missing):
        _agent(fleet["env"], node, H100_TRACE, 14)
        doc = json.loads(admin_api.read_node(node).metadata.annotations[P + "telemetry"])
        doc.pop("expires_at", None)
        doc.pop("refresh_s", None)
        doc["read_at"] = two_hours_ago.strftime("%Y-%m-%dT%H:%M:%SZ")
        doc["lease"] = f"{LEASES_NS}/omaticaya-node-{node}"
        admin_api.patch_node(node, {"metadata": {"annotations": {P + "telemetry": json.dumps(doc)}}})
    put_lease(admin_api, LEASES_NS, f"omaticaya-node-{renewed}", datetime.now(UTC))
    put_lease(admin_api, LEASES_NS, f"omaticaya-node-{lapsed}", datetime.now(UTC) - timedelta(hours=1))
    return {"env": fleet["env"], "selector": f"omaticaya-test={tag}", "renewed": renewed,
            "lapsed": lapsed, "missing": missing}  # fmt: skip


def test_top_shows_lease_mode_nodes_fresh_while_their_lease_is_renewed(lease_fleet, tmp_path):
    f = lease_fleet
    done = _top("-l", f["selector"], "-o", "json", env=f["env"])
    assert done.returncode == 0, done.stderr
    nodes = {n["name"]: n for n in json.loads(done.stdout)["nodes"]}
    assert nodes[f["renewed"]]["stale"] is False and nodes[f["renewed"]]["age_s"] > 7000
    assert nodes[f["lapsed"]]["stale"] is True
    assert "expired at" in nodes[f["lapsed"]]["stale_why"]
    assert nodes[f["missing"]]["stale_why"] == f"Lease {LEASES_NS}/omaticaya-node-{f['missing']} not found"
    table = _rows(_top("-l", f["selector"], env=f["env"]).stdout)
    assert "STALE" not in table[f["renewed"]] and table[f["lapsed"]][-1] == "STALE"
    stale = _top("-l", f["selector"], "--stale", env=f["env"])
    assert set(_rows(stale.stdout)) == {f["lapsed"], f["missing"]}

    # with kubectl's --context: the Leases are read from that context's cluster too, not from
    # the kubeconfig's current context (here a server that is not there)
    import yaml

    kubeconfig = yaml.safe_load(Path(f["env"]["KUBECONFIG"]).read_text())
    real = kubeconfig["current-context"]
    kubeconfig["clusters"].append({"name": "gone", "cluster": {"server": "https://127.0.0.1:9"}})
    kubeconfig["contexts"].append({"name": "gone", "context": {"cluster": "gone", "user": "x"}})
    kubeconfig["users"].append({"name": "x", "user": {"token": "x"}})
    kubeconfig["current-context"] = "gone"
    elsewhere = tmp_path / "kubeconfig"
    elsewhere.write_text(yaml.safe_dump(kubeconfig))
    env = dict(f["env"])
    env.pop("KUBECONFIG")
    done = _top("--kubeconfig", str(elsewhere), "--context", real, "-l", f["selector"],
                "-o", "json", env=env)  # fmt: skip
    assert done.returncode == 0 and "not read" not in done.stderr, done.stderr
    nodes = {n["name"]: n["stale"] for n in json.loads(done.stdout)["nodes"]}
    assert nodes == {f["renewed"]: False, f["lapsed"]: True, f["missing"]: True}


def test_top_watch_follows_lease_renewals(lease_fleet, admin_api):
    """With ``--watch`` the Leases are watched: the lapsed node turns fresh at its next redraw
    once its agent renews the Lease again."""
    from tests.scheduler.untrusted_time_support import put_lease

    f = lease_fleet
    proc = subprocess.Popen(
        [sys.executable, "-m", "omaticaya_py", "top", "-l", f["selector"], "--watch", "-o",
         "json", "--interval", "1"],
        env=dict(f["env"], PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines = _lines(proc)
    last: dict[str, dict] = {}

    def stale_of(node: str):
        while not lines.empty():
            last.update({n["name"]: n for n in json.loads(lines.get_nowait())["nodes"]})
        return last.get(node, {}).get("stale")

    try:
        assert wait_for("the first draw", lambda: stale_of(f["lapsed"]) is True, 30)
        put_lease(admin_api, LEASES_NS, f"omaticaya-node-{f['lapsed']}", datetime.now(UTC))
        wait_for("a draw with the renewed Lease", lambda: stale_of(f["lapsed"]) is False, 30)
        assert stale_of(f["renewed"]) is False and stale_of(f["missing"]) is True
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_top_without_access_to_leases_says_so_and_judges_by_read_at(
    lease_fleet, dev_cluster, admin_api, tmp_path
):
    from kubernetes import client as k

    rbac = k.RbacAuthorizationV1Api(admin_api.api_client)
    role = f"top-nodes-only-{os.getpid()}"
    rbac.create_cluster_role({"metadata": {"name": role}, "rules": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}]})  # fmt: skip
    viewer = _token_kubeconfig(dev_cluster, admin_api, tmp_path, role)
    rbac.create_cluster_role_binding({
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": role, "namespace": "default"}]})  # fmt: skip
    try:
        env = dict(lease_fleet["env"])
        env.pop("KUBECONFIG", None)
        done = wait_for(
            "top as the nodes-only user",
            lambda: (d := _top("--kubeconfig", str(viewer), "-l", lease_fleet["selector"], "-o",
                               "json", env=env)).returncode == 0 and d, 30)  # fmt: skip
        assert f"Leases in {LEASES_NS} not read" in done.stderr and "403" in done.stderr
        assert "Traceback" not in done.stderr
        nodes = {n["name"]: n for n in json.loads(done.stdout)["nodes"]}
        assert nodes[lease_fleet["renewed"]]["stale_why"].endswith("read_at older than 360s")
    finally:
        rbac.delete_cluster_role_binding(role)
        rbac.delete_cluster_role(role)

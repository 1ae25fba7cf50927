"""A real local kube-apiserver (+ etcd) for tests, driven by scripts/dev-cluster.

The commands run ``scripts/dev-cluster`` (a process of its own: the daemons it starts outlive it
in their own sessions, never children of pytest); what a cluster is (ports, pids, kubelet, full
cluster) is read from its ``state.json`` with ``devtools.devcluster``.

Use the session-scoped ``dev_cluster`` fixture (import it in conftest.py, or
list ``tests.devcluster`` in ``pytest_plugins``). It builds the release under test
(``OMATICAYA_KUBERNETES_VERSION``, default v1.37.2) from its Go modules on first use (minutes;
cached afterwards in ``$OMATICAYA_CACHE``, default ``~/.cache/omaticaya``) and starts a cluster
in a temporary state dir. Set ``OMATICAYA_SKIP_CLUSTER=1`` to skip the tests that
need it; otherwise a failure to build or start is an error, not a skip.

Only the standard library, pytest and ``devtools.devcluster`` (standard library) are used.
"""

from __future__ import annotations

import os
import re
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from devtools.devcluster import DevClusterError, State, load_state
from devtools.devcluster.cluster import bin_dir
from devtools.devcluster.kubelet import containerd_tool

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "dev-cluster"

# Cold build of kube-apiserver is ~5-6 minutes on 2 cores; allow plenty.
UP_TIMEOUT_S = float(os.environ.get("OMATICAYA_CLUSTER_UP_TIMEOUT", "1800"))


def _run_script(state_dir: Path, *args: str, timeout: float = 180) -> str:
    env = dict(os.environ, OMATICAYA_DEV_DIR=str(state_dir))
    proc = subprocess.run(
        [str(SCRIPT), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise DevClusterError(
            f"scripts/dev-cluster {' '.join(args)} exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr (tail) ---\n"
            + "\n".join(proc.stderr.splitlines()[-60:])
        )
    # progress goes to stderr; keep it visible with `pytest -s`
    sys.stderr.write(proc.stderr)
    return proc.stdout


@dataclass
class DevCluster:
    """A running dev cluster; paths refer to files in ``state_dir``."""

    state_dir: Path
    kubeconfig: Path = field(init=False)
    server: str = field(init=False)
    ca_file: Path = field(init=False)
    client_cert: Path = field(init=False)
    client_key: Path = field(init=False)
    audit_log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        pki = self.state_dir / "pki"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.ca_file = pki / "ca.crt"
        self.client_cert = pki / "admin.crt"
        self.client_key = pki / "admin.key"
        self.audit_log = self.state_dir / "audit.log"
        self.server = f"https://127.0.0.1:{self.ports()['APISERVER_PORT']}"

    def state(self) -> State:
        """The cluster's ``state.json`` as written by ``up`` (ports, processes, kubelet, full)."""
        st = load_state(self.state_dir)
        if st is None:
            raise DevClusterError(f"no state.json in {self.state_dir}")
        return st

    def ports(self) -> dict[str, int]:
        """Ports recorded by `up`: ETCD_CLIENT_PORT, ETCD_PEER_PORT, APISERVER_PORT,
        SCHEDULER_PORT."""
        p = self.state().ports
        return {
            "ETCD_CLIENT_PORT": p.etcd_client,
            "ETCD_PEER_PORT": p.etcd_peer,
            "APISERVER_PORT": p.apiserver,
            "SCHEDULER_PORT": p.scheduler,
        }

    def pid(self, name: str) -> int | None:
        """The pid of the process ``up`` started as ``name`` (etcd, apiserver, scheduler,
        containerd, kubelet, controller-manager, proxy), None when it did not."""
        proc = self.state().procs.get(name)
        return proc.pid if proc else None

    # --- process control ------------------------------------------------
    def stop_apiserver(self) -> None:
        """Stop kube-apiserver only (etcd keeps running, data kept)."""
        _run_script(self.state_dir, "stop-apiserver")

    def start_apiserver(self) -> None:
        """Start kube-apiserver again (same port, flags, certs); waits for /readyz."""
        _run_script(self.state_dir, "start-apiserver")

    def restart_apiserver(self) -> None:
        self.stop_apiserver()
        self.start_apiserver()

    def down(self) -> None:
        _run_script(self.state_dir, "down")

    # --- kube-scheduler ---------------------------------------------------
    def start_scheduler(self) -> None:
        """Start the default kube-scheduler (``up --scheduler``; builds it on first use, ~40 s
        with the apiserver's build cache). Idempotent."""
        _run_script(self.state_dir, "up", "--scheduler", timeout=UP_TIMEOUT_S)

    def spawn_scheduler(self, config: Path, log: Path) -> subprocess.Popen[bytes]:
        """Start one more kube-scheduler with ``--config`` (a KubeSchedulerConfiguration that
        names this cluster's kubeconfig); no serving port (``--port 0 --secure-port 0``).
        The caller stops it (``terminate()``)."""
        with open(log, "ab") as out:
            return subprocess.Popen(
                [
                    str(scheduler_binary()),
                    "--config", str(config),
                    "--secure-port", "0",
                    "--v", "2",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    # --- kubelet (+ containerd) -------------------------------------------
    def start_kubelet(self) -> str:
        """Start containerd and a real kubelet registered as a Node (``up --kubelet``; builds
        containerd 2 on first use, the kubelet is the multi-call binary's; needs Linux and
        root). Waits for the Node to be Ready and returns its name. Idempotent."""
        _run_script(self.state_dir, "up", "--kubelet", timeout=UP_TIMEOUT_S)
        return self.kubelet_node

    @property
    def kubelet_node(self) -> str:
        """Name of the kubelet's Node (``up --kubelet`` recorded it in the state)."""
        kubelet = self.state().kubelet
        if kubelet is None:
            raise DevClusterError("no kubelet in the dev cluster's state (up --kubelet first)")
        return kubelet.node

    def stop_kubelet(self) -> None:
        """Stop the kubelet only: containerd and the pods' containers keep running."""
        _run_script(self.state_dir, "stop-kubelet")

    def restart_kubelet(self) -> None:
        """Stop the kubelet and start it again; waits for its Node to be Ready."""
        self.stop_kubelet()
        _run_script(self.state_dir, "start-kubelet", timeout=120)

    def kubelet_down(self) -> None:
        """Stop the kubelet, every container it started, and containerd."""
        _run_script(self.state_dir, "down-kubelet")

    # --- full cluster -------------------------------------------------------
    def start_full(self) -> str:
        """Everything a DaemonSet needs (``up --full``): kube-scheduler, kube-controller-manager,
        the kubelet on containerd with a bridge CNI, kube-proxy, and the agent image
        (``scripts/build-image``) imported as ``omaticaya.local/omaticaya:<version>``. Restarts
        the API server with the full cluster's flags if it ran without them. Idempotent;
        returns the kubelet's Node name."""
        _run_script(self.state_dir, "up", "--full", timeout=UP_TIMEOUT_S)
        return self.kubelet_node

    def full_env(self) -> dict[str, str]:
        """The full cluster's network: POD_BRIDGE, POD_SUBNET, POD_GATEWAY and the extra
        components' ports (KCM_PORT, PROXY_HEALTHZ_PORT, PROXY_METRICS_PORT)."""
        full = self.state().full
        if full is None:
            raise DevClusterError("not a full cluster (up --full first)")
        return {
            "POD_BRIDGE": full.pod_bridge,
            "POD_SUBNET": full.pod_subnet,
            "POD_GATEWAY": full.pod_gateway,
            "KCM_PORT": str(full.kcm_port),
            "PROXY_HEALTHZ_PORT": str(full.proxy_healthz_port),
            "PROXY_METRICS_PORT": str(full.proxy_metrics_port),
        }

    @property
    def agent_image(self) -> str:
        """The agent image ``up --full`` imported, ``omaticaya.local/omaticaya:<version>``."""
        key = self.state().image_key
        if key is None:
            raise DevClusterError("no agent image imported (up --full first)")
        version = key.removeprefix("omaticaya-").rsplit("-", 1)[0]
        return f"omaticaya.local/omaticaya:{version}"

    @property
    def cdi_dir(self) -> Path:
        """Where this cluster's containerd 2 reads CDI specs (``<state dir>/cdi``)."""
        return self.state_dir / "cdi"

    @property
    def dev_root(self) -> Path:
        """Fake NVIDIA device nodes (``<state dir>/dev``: nvidia0-7 195:0-7, nvidiactl 195:255,
        nvidia-uvm and nvidia-uvm-tools 510:0-1; ``devtools.devcluster.files.fake_gpu_devices``),
        made by ``up --kubelet`` / ``--full``: the host's /dev of a GPU node replaying a trace."""
        return self.state_dir / "dev"

    def ctr(self, *args: str, timeout: float = 30) -> str:
        """``ctr`` (the cluster's containerd's own) in namespace k8s.io; its stdout. Raises
        ``subprocess.CalledProcessError`` when it fails."""
        sock = self.state_dir / "containerd" / "containerd.sock"
        return subprocess.run(
            [containerd_tool("ctr"), "--address", str(sock), "-n", "k8s.io", *args],
            capture_output=True, text=True, timeout=timeout, check=True,
        ).stdout

    # --- helpers for stdlib clients --------------------------------------
    def ssl_context(self) -> ssl.SSLContext:
        """TLS context trusting the cluster CA and presenting the admin cert."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG pointing at this cluster."""
        return dict(os.environ, KUBECONFIG=str(self.kubeconfig))

    def audit_lines(self) -> list[str]:
        """Lines of the audit log (Metadata level, one JSON event per line)."""
        try:
            return self.audit_log.read_text().splitlines()
        except FileNotFoundError:
            return []

    def readyz(self, timeout: float = 3) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.server}/readyz", context=self.ssl_context(), timeout=timeout
            ) as resp:
                return bool(resp.status == 200 and resp.read().strip() == b"ok")
        except (urllib.error.URLError, OSError):
            return False


def scheduler_binary() -> Path:
    """The cached kube-scheduler binary of the release under test (built by ``scripts/dev-cluster
    build --scheduler``)."""
    return bin_dir() / "kube-scheduler"


def start_dev_cluster(
    state_dir: Path, *, scheduler: bool = False, full: bool = False
) -> DevCluster:
    """Run ``scripts/dev-cluster up`` with OMATICAYA_DEV_DIR=state_dir (``--full``: every
    component and the agent image, see ``DevCluster.start_full``)."""
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    args = ["up", "--full"] if full else ["up", "--scheduler"] if scheduler else ["up"]
    out = _run_script(state_dir, *args, timeout=UP_TIMEOUT_S)
    m = re.search(r"^export KUBECONFIG=(.+)$", out, re.MULTILINE)
    if not m:
        raise DevClusterError(f"unexpected output from dev-cluster up: {out!r}")
    cluster = DevCluster(state_dir)
    if Path(m.group(1)).resolve() != cluster.kubeconfig.resolve():
        raise DevClusterError(f"dev-cluster up printed {m.group(1)}, expected {cluster.kubeconfig}")
    return cluster


@pytest.fixture(scope="session")
def dev_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A real etcd + kube-apiserver of the release under test on 127.0.0.1, for the whole
    session."""
    if os.environ.get("OMATICAYA_SKIP_CLUSTER") == "1":
        pytest.skip("OMATICAYA_SKIP_CLUSTER=1: real kube-apiserver tests disabled")
    # short: the kubelet's plugin sockets live under it, and a unix socket's path is at most 107
    # bytes (pytest-xdist adds popen-gwN/ to the path)
    state_dir = tmp_path_factory.mktemp("dc")
    try:
        cluster = start_dev_cluster(state_dir)
    except BaseException:
        # leave nothing running if `up` got half way
        try:
            _run_script(state_dir, "down")
        except Exception:  # noqa: BLE001
            pass
        raise
    try:
        yield cluster
    finally:
        cluster.down()

"""One dev cluster's state dir and state, its processes by name, its API server's client, and
the build step (``scripts/dev-cluster-build``, bash)."""

from __future__ import annotations

import http.client
import os
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

from devtools.devcluster import procs
from devtools.devcluster.state import DevClusterError, Proc, State, load_state

#: the release ``up`` starts unless ``OMATICAYA_KUBERNETES_VERSION`` (``--kubernetes-version``)
#: names another (scripts/dev-cluster-build has the same default)
DEFAULT_K8S_VERSION = "v1.37.2"
#: the releases the project pins, built from Go modules (devtools/kubebuild: go.mod for the
#: default, kube-<version>.mod for the others)
RELEASES = ("v1.37.2", "v1.31.0")
#: containerd 2, built from its Go module (devtools/containerdbuild)
CONTAINERD_VERSION = "v2.4.2"


def k8s_version() -> str:
    """The release this process works with: ``$OMATICAYA_KUBERNETES_VERSION`` (``v`` added when
    missing), else ``DEFAULT_K8S_VERSION``."""
    v = (os.environ.get("OMATICAYA_KUBERNETES_VERSION") or DEFAULT_K8S_VERSION).strip()
    return v if v.startswith("v") else f"v{v}"


K8S_VERSION = k8s_version()


def minor(version: str = K8S_VERSION) -> int:
    """The minor version of ``v1.Y.Z``: ``Y`` (37 for v1.37.2)."""
    return int(version.lstrip("v").split(".")[1])


#: the DRA features the product uses that are alpha, off by default, on 1.34 and 1.35 (beta and
#: on from 1.36: docs/dra.md, "Which path for which cluster"), with the name of each gate:
#: device taints (KEP-5055), consumable capacity (KEP-5075), DRA-backed extended resources
#: (KEP-5004), device health in the pod's status (KEP-4680)
DRA_ALPHA_GATES = ("DRADeviceTaints", "DRAConsumableCapacity", "DRAExtendedResource", "ResourceHealthStatus")


def feature_gates(version: str = K8S_VERSION) -> dict[str, bool]:
    """The feature gates the dev cluster turns on for ``version`` on every component
    (kube-apiserver, kube-scheduler, kube-controller-manager, kubelet), as docs/dra.md tells a
    user of that release to: ``DRA_ALPHA_GATES`` on 1.34 and 1.35 (DRA is GA there, its newer
    features alpha); none before 1.34 (no ``resource.k8s.io/v1``) or from 1.36 (on by default)."""
    return {gate: True for gate in DRA_ALPHA_GATES} if 34 <= minor(version) < 36 else {}


def feature_gate_flags(version: str = K8S_VERSION) -> list[str]:
    """``feature_gates(version)`` as a component's flag: ``["--feature-gates=A=true,..."]``, or
    ``[]`` when there is none."""
    gates = feature_gates(version)
    if not gates:
        return []
    return ["--feature-gates=" + ",".join(f"{k}={str(v).lower()}" for k, v in gates.items())]


def runtime_config_flags(version: str = K8S_VERSION) -> list[str]:
    """The API versions kube-apiserver must also serve for ``feature_gates(version)``, as a
    flag: on 1.34 and 1.35 ``resource.k8s.io/v1alpha3`` (``DeviceTaintRule``, alpha there, off
    by default like every alpha API). Without it a kube-scheduler with ``DRADeviceTaints`` on
    waits for its DeviceTaintRule informer ("failed to list *v1alpha3.DeviceTaintRule: the
    server could not find the requested resource") and schedules no pod at all; docs/dra.md
    tells users the same. ``[]`` on other releases."""
    if "DRADeviceTaints" not in feature_gates(version):
        return []
    return ["--runtime-config=resource.k8s.io/v1alpha3=true"]


REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "dev-cluster-build"
#: the user agent for the API server: not curl's, for which it pretty-prints JSON (a v1.20 build
#: crashed on pretty-printing a map; kept: the dev cluster's requests are the tools' own)
USER_AGENT = "omaticaya-dev-cluster"


def _env_s(name: str, default: float) -> float:
    return float(os.environ.get(name) or default)


def cache_dir() -> Path:
    """``$OMATICAYA_CACHE``, default ``~/.cache/omaticaya``: the build cache."""
    return Path(
        os.environ.get("OMATICAYA_CACHE") or Path(os.environ.get("HOME") or "/root") / ".cache/omaticaya"
    )


def bin_dir() -> Path:
    """Where the built Kubernetes binaries are: ``<cache>/k8s-<version>/bin``."""
    return cache_dir() / f"k8s-{K8S_VERSION}" / "bin"


def containerd_bin_dir() -> Path:
    """Where containerd 2 (``containerd``, ``containerd-shim-runc-v2``, ``ctr``) is built:
    ``<cache>/containerd-<version>/bin``."""
    return cache_dir() / f"containerd-{CONTAINERD_VERSION}" / "bin"


def binary(name: str, build_flag: str) -> str:
    """The path of a built Kubernetes binary; raises ``DevClusterError`` naming the build
    command when it is missing."""
    path = bin_dir() / name
    if not os.access(path, os.X_OK):
        raise DevClusterError(f"{name} not built: run 'scripts/dev-cluster build {build_flag}'".rstrip())
    return str(path)


def etcd_binary() -> str:
    """etcd: the multi-call binary's (``<bin dir>/etcd``, the version k8s.io/kubernetes pins);
    raises ``DevClusterError`` naming the build command when it is missing."""
    return binary("etcd", "")


def build(*flags: str) -> None:
    """Build (or find cached) the Kubernetes binaries: ``scripts/dev-cluster-build [flags]``
    (``--scheduler``, ``--kubelet``, ``--full``, ...), its output on stderr. Raises
    ``DevClusterError`` when it fails."""
    res = subprocess.run([str(BUILD_SCRIPT), *flags], stdin=subprocess.DEVNULL, stdout=sys.stderr,
                         check=False)
    if res.returncode != 0:
        raise DevClusterError(f"scripts/dev-cluster-build {' '.join(flags)} exited {res.returncode}")


class Cluster:
    """A state dir (``$OMATICAYA_DEV_DIR``, default /tmp/omaticaya-dev; made absolute) and the
    ``State`` in it (None before the first ``up``)."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir).absolute()
        if self.dir.exists():
            self.dir = self.dir.resolve()
        self.state: State | None = load_state(self.dir) if self.dir.exists() else None
        #: a state dir of the bash dev-cluster (pid files): stop its processes, write no state
        self.legacy = False
        self.ready_timeout_s = _env_s("OMATICAYA_READY_TIMEOUT", 60)
        self.kubelet_ready_timeout_s = _env_s("OMATICAYA_KUBELET_READY_TIMEOUT", 60)

    @property
    def st(self) -> State:
        """The state; raises ``DevClusterError`` before the first ``up``."""
        if self.state is None:
            raise DevClusterError(f"no {self.dir}/state.json: run 'scripts/dev-cluster up' first")
        return self.state

    def save(self) -> None:
        if not self.legacy:
            self.st.save(self.dir)

    def log_path(self, name: str) -> Path:
        """``<state dir>/<name>.log``: the process's stdout and stderr."""
        return self.dir / f"{name}.log"

    def proc(self, name: str) -> Proc | None:
        return self.state.procs.get(name) if self.state else None

    def running(self, name: str) -> bool:
        """True while the process started as ``name`` runs (same pid and start time)."""
        return procs.alive(self.proc(name))

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        """Start ``argv`` as ``name`` (own process group, log in ``<name>.log``, environment
        ``env``, None: ours), record it."""
        proc = procs.spawn(name, argv, self.log_path(name), env)
        self.st.procs[name] = proc
        self.save()
        return proc

    def stop(self, name: str) -> None:
        """Stop the process group of ``name`` if it runs, forget it."""
        procs.stop(name, self.proc(name))
        if self.state is not None and self.state.procs.pop(name, None) is not None:
            self.save()

    def wait_ready(
        self, name: str, what: str, ready: Callable[[], bool], timeout_s: float
    ) -> float:
        """``procs.wait_until`` on the process ``name`` and its log."""
        return procs.wait_until(what, ready, timeout_s, proc=self.proc(name),
                                log_path=self.log_path(name))

    # -- the API server, as admin -------------------------------------------------------------
    def ssl_context(self) -> ssl.SSLContext:
        pki = self.dir / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    def api_get(self, path: str, timeout_s: float = 3) -> bytes:
        """GET ``path`` from the API server as admin; the body. Raises ``OSError`` (HTTP errors
        included) when there is no answer or not a 2xx."""
        req = urllib.request.Request(
            f"https://127.0.0.1:{self.st.ports.apiserver}{path}",
            headers={"User-Agent": USER_AGENT, "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=timeout_s) as r:
                return bytes(r.read())
        except http.client.HTTPException as e:
            raise OSError(str(e)) from e

    def api_ready(self) -> bool:
        """True when the API server's /readyz answers ``ok``."""
        try:
            return self.api_get("/readyz").strip() == b"ok"
        except OSError:
            return False

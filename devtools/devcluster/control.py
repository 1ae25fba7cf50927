"""etcd, kube-apiserver and kube-scheduler; ``up``, ``down``, ``status`` and the commands that
stop or start the API server alone."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import time
import urllib.request

from devtools.devcluster import full as full_mod
from devtools.devcluster import kubelet as kubelet_mod
from devtools.devcluster import legacy
from devtools.devcluster.cluster import (
    K8S_VERSION,
    Cluster,
    binary,
    build,
    etcd_binary,
    feature_gate_flags,
    runtime_config_flags,
)
from devtools.devcluster.files import make_pki, write_audit_policy, write_kubeconfig
from devtools.devcluster.procs import free_port, https_ok, log
from devtools.devcluster.state import DevClusterError, FullState, Ports, State

CONTROL_PLANE = ("scheduler", "apiserver", "etcd")


def start_etcd(c: Cluster) -> None:
    """Start etcd on the state's client and peer ports, data in ``etcd-data``; wait for
    /health (20 s)."""
    etcd, ports = etcd_binary(), c.st.ports
    # --unsafe-no-fsync exists from etcd 3.5 (bookworm ships 3.4.23)
    res = subprocess.run([etcd, "--help"], capture_output=True, text=True, check=False)
    help_text = res.stdout + res.stderr
    extra = ["--unsafe-no-fsync"] if "--unsafe-no-fsync" in help_text else []
    log(f"starting etcd on 127.0.0.1:{ports.etcd_client}")
    data = c.dir / "etcd-data"
    data.mkdir(mode=0o700, exist_ok=True)
    data.chmod(0o700)
    client, peer = f"http://127.0.0.1:{ports.etcd_client}", f"http://127.0.0.1:{ports.etcd_peer}"
    c.start("etcd", [
        etcd, "--name", "omaticaya-dev", "--data-dir", str(data),
        "--listen-client-urls", client, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"omaticaya-dev={peer}", "--log-level", "warn", *extra,
    ])

    def healthy() -> bool:
        with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
            return b'"health":"true"' in r.read()

    c.wait_ready("etcd", "etcd healthy", healthy, 20)


def start_apiserver(c: Cluster) -> None:
    """Start kube-apiserver; wait for /readyz (``OMATICAYA_READY_TIMEOUT``, 60 s).

    The default: 127.0.0.1 only, no ``kubernetes`` Endpoints, no ServiceAccount admission (the
    tests create pods without token secrets). A full cluster: pods reach the API server through
    the ``kubernetes`` Service, so it is advertised on the pod bridge's gateway (Endpoints may
    not hold a loopback address), listens on every address (it cannot bind two), and the
    ServiceAccount admission plugin mounts the tokens."""
    p, st = c.dir / "pki", c.st
    bind, advertise = "127.0.0.1", "127.0.0.1"
    mode = ["--endpoint-reconciler-type", "none", "--disable-admission-plugins", "ServiceAccount"]
    if st.full is not None:
        bind, advertise, mode = "0.0.0.0", st.full.pod_gateway, ["--endpoint-reconciler-type", "lease"]
    argv = [
        binary("kube-apiserver", ""),
        "--etcd-servers", f"http://127.0.0.1:{st.ports.etcd_client}",
        "--bind-address", bind, "--advertise-address", advertise,
        "--secure-port", str(st.ports.apiserver),
        "--tls-cert-file", f"{p}/apiserver.crt", "--tls-private-key-file", f"{p}/apiserver.key",
        "--client-ca-file", f"{p}/ca.crt",
        "--service-account-key-file", f"{p}/sa.pub",
        "--service-account-signing-key-file", f"{p}/sa.key",
        "--service-account-issuer", "https://kubernetes.default.svc",
        "--api-audiences", "https://kubernetes.default.svc",
        "--service-cluster-ip-range", "10.0.0.0/24",
        "--kubelet-client-certificate", f"{p}/admin.crt", "--kubelet-client-key", f"{p}/admin.key",
        "--kubelet-preferred-address-types", "InternalIP,Hostname",
        "--authorization-mode", "RBAC", *mode,
        # privileged containers allowed, as on kubeadm's clusters: the chart's MPS supervisor
        # (sharing.enforcement: mps) mounts its tmpfs for the host
        "--allow-privileged=true",
        "--enable-priority-and-fairness=false",
        "--audit-policy-file", f"{c.dir}/audit-policy.yaml",
        "--audit-log-path", f"{c.dir}/audit.log",
        "--audit-log-maxsize", "200", "--audit-log-maxbackup", "1",
        "--audit-log-mode", "blocking", "--profiling=false", "--v", "1",
        *feature_gate_flags(), *runtime_config_flags(),
    ]
    log(f"starting kube-apiserver {K8S_VERSION} on https://127.0.0.1:{st.ports.apiserver}")
    c.start("apiserver", argv)
    wait_apiserver(c)


def wait_apiserver(c: Cluster) -> None:
    """Wait for the API server's /readyz; raises ``DevClusterError`` if it exits first."""
    took = c.wait_ready("apiserver", "kube-apiserver ready", c.api_ready, c.ready_timeout_s)
    log(f"apiserver ready on https://127.0.0.1:{c.st.ports.apiserver} after {took:.0f} s")


def start_scheduler(c: Cluster) -> None:
    """Start kube-scheduler (admin credentials, no leader election); wait for its /healthz."""
    kubeconfig, port = str(c.dir / "kubeconfig"), c.st.ports.scheduler
    argv = [binary("kube-scheduler", "--scheduler"), "--kubeconfig", kubeconfig,
            "--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
            "--leader-elect=false", "--bind-address", "127.0.0.1",
            "--secure-port", str(port), "--v", "1", *feature_gate_flags()]
    log(f"starting kube-scheduler (secure port 127.0.0.1:{port})")
    c.start("scheduler", argv)
    c.wait_ready("scheduler", "kube-scheduler healthy",
                 lambda: https_ok(f"https://127.0.0.1:{port}/healthz"), 50)


def new_full_state(old: FullState | None = None) -> FullState:
    """A full cluster's network and ports (``OMATICAYA_POD_BRIDGE``, ``OMATICAYA_POD_SUBNET``);
    ``old`` when there is one."""
    if old is not None:
        return old
    subnet = os.environ.get("OMATICAYA_POD_SUBNET") or "10.217.0.0/24"
    kcm = free_port()
    healthz = free_port((kcm,))
    return FullState(
        pod_bridge=os.environ.get("OMATICAYA_POD_BRIDGE") or "omaticaya0",
        pod_subnet=subnet,
        pod_gateway=str(next(ipaddress.ip_network(subnet).hosts())),
        kcm_port=kcm,
        proxy_healthz_port=healthz,
        proxy_metrics_port=free_port((kcm, healthz)),
    )


def export_line(c: Cluster) -> str:
    return f"export KUBECONFIG={c.dir}/kubeconfig"


def up(c: Cluster, *, scheduler: bool = False, kubelet: bool = False, full: bool = False) -> str:
    """Start what is not running (building what is missing); returns the ``export
    KUBECONFIG=...`` line. ``full`` implies ``scheduler`` and ``kubelet``."""
    scheduler, kubelet = scheduler or full, kubelet or full
    c.dir.mkdir(parents=True, exist_ok=True)
    c.dir = c.dir.resolve()
    if c.running("etcd") and c.running("apiserver") and c.api_ready():
        if full:
            build("--full")
            if c.st.full is None:
                # the API server's flags differ in a full cluster: restart it with them
                c.st.full = new_full_state()
                c.save()
                c.stop("apiserver")
                start_apiserver(c)
        if scheduler and not c.running("scheduler"):
            build("--scheduler")
            start_scheduler(c)
        if full:
            full_mod.full_up(c)
        elif kubelet:
            kubelet_mod.kubelet_up(c)
        log("already up")
        return export_line(c)
    build(*(["--full"] if full else ["--scheduler"] if scheduler else []))
    # leftovers of a partial run
    for name in CONTROL_PLANE:
        c.stop(name)
    t0 = time.monotonic()
    make_pki(c.dir)
    write_audit_policy(c.dir)
    taken: list[int] = []
    for _ in range(4):
        taken.append(free_port(taken))
    old = c.state
    c.state = State(
        ports=Ports(*taken),
        procs=dict(old.procs) if old else {},
        kubelet=old.kubelet if old else None,
        full=new_full_state(old.full if old else None) if full else None,
        image_key=old.image_key if old else None,
        scheduler_image_key=old.scheduler_image_key if old else None,
        kubernetes_version=K8S_VERSION,
    )
    c.save()
    write_kubeconfig(c.dir, c.st.ports.apiserver)
    start_etcd(c)
    start_apiserver(c)
    if scheduler:
        start_scheduler(c)
    if full:
        full_mod.full_up(c)
    elif kubelet:
        kubelet_mod.kubelet_up(c)
    log(f"up in {time.monotonic() - t0:.0f} s (state: {c.dir})")
    return export_line(c)


def down(c: Cluster) -> None:
    """Stop every process (the full cluster's, the kubelet and its containers, the control
    plane) and undo the host changes; certificates, logs and etcd data stay."""
    if not c.dir.exists():
        log(f"nothing to stop ({c.dir} does not exist)")
        return
    if c.state is None:
        c.state = legacy.legacy_state(c.dir)
        c.legacy = c.state is not None
    full_mod.full_down(c)
    kubelet_mod.kubelet_down(c)
    full_mod.cleanup_host(c)
    for name in CONTROL_PLANE:
        c.stop(name)
    if c.legacy:
        legacy.forget(c.dir)
        c.state, c.legacy = None, False
    log(f"down (certs, logs and etcd data kept in {c.dir})")


STATUS_NAMES = ("etcd", "apiserver", "scheduler", "controller-manager", "containerd", "kubelet",
                "proxy")


def status(c: Cluster) -> tuple[str, int]:
    """The status report (one line per process, then ``status: up|down``) and the exit code
    (0 when the API server is ready)."""
    lines = [f"state dir: {c.dir}"]
    for name in STATUS_NAMES:
        proc = c.proc(name)
        lines.append(f"{name}: running (pid {proc.pid})" if c.running(name) and proc else f"{name}: stopped")
    if c.state is not None and c.api_ready():
        lines += [f"apiserver: ready at https://127.0.0.1:{c.st.ports.apiserver}", "status: up"]
        return "\n".join(lines), 0
    return "\n".join(lines + ["status: down"]), 1


def start_apiserver_again(c: Cluster) -> None:
    """``start-apiserver``: the API server again (same port, flags, certs), waits for /readyz."""
    if not c.running("etcd"):
        raise DevClusterError("etcd is not running: use 'scripts/dev-cluster up'")
    if c.running("apiserver"):
        log("apiserver already running")
        wait_apiserver(c)
        return
    start_apiserver(c)

"""``up --full``: what a DaemonSet needs, all of the release under test (one multi-call binary).

etcd, kube-apiserver (ServiceAccount admission on, ``kubernetes`` Endpoints on the pod bridge's
gateway), kube-controller-manager (every default controller: DaemonSet, ServiceAccount and token
controllers with the key the API server verifies, root CA publisher, ...), kube-scheduler, the
kubelet on containerd with a CNI bridge network (Debian's containernetworking-plugins: bridge +
host-local; loopback by containerd), kube-proxy in iptables mode (so the ``kubernetes``
Service's ClusterIP 10.0.0.1:443 reaches the API server from a pod, as in-cluster config
expects), and the images the chart needs by default, imported into containerd: the agent's from
scripts/build-image as omaticaya.local/omaticaya:<version>, and kube-scheduler's at the chart's
default reference (``files.SCHEDULER_IMAGE``) made from the kube-scheduler binary built here.
The control-plane components use the admin credentials.
Host changes while up: the pod bridge, INPUT rules for the API server's port (``api_firewall``),
kube-proxy's KUBE-* iptables chains and its sysctls; ``down`` removes the chains (kube-proxy
--cleanup), the rules and the bridge. One per machine (the kubelet's fixed device-plugins
folder, the host's iptables)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from devtools.devcluster import kubelet as kubelet_mod
from devtools.devcluster.cluster import (
    K8S_VERSION,
    REPO_ROOT,
    Cluster,
    bin_dir,
    binary,
    feature_gate_flags,
)
from devtools.devcluster.files import SCHEDULER_IMAGE, scheduler_image_tar
from devtools.devcluster.procs import https_ok, log, run
from devtools.devcluster.state import DevClusterError

IMAGE_REPO = "omaticaya.local/omaticaya"
FULL_OWNER = Path("/run/omaticaya-dev-full.owner")


def full_deps() -> None:
    missing = [pkg for ok, pkg in (
        (shutil.which("iptables"), "iptables"),
        (shutil.which("conntrack"), "conntrack"),
        (shutil.which("ip"), "iproute2"),
        (os.access("/usr/lib/cni/bridge", os.X_OK) and os.access("/usr/lib/cni/host-local", os.X_OK),
         "containernetworking-plugins"),
    ) if not ok]
    kubelet_mod.apt_install(missing)


def api_firewall(c: Cluster, add: bool) -> None:
    """The API server listens on every address in a full cluster; only loopback and the pod
    bridge may reach it: iptables INPUT rules tagged ``omaticaya-dev <state dir>`` (``add``),
    removed by ``down``."""
    assert c.st.full is not None
    tag = f"omaticaya-dev {c.dir}"
    port = str(c.st.ports.apiserver)
    for rule in (["-i", "lo", "-j", "ACCEPT"], ["-i", c.st.full.pod_bridge, "-j", "ACCEPT"],
                 ["-j", "DROP"]):
        spec = ["INPUT", "-p", "tcp", "--dport", port, *rule, "-m", "comment", "--comment", tag]
        if not add:
            while run(["iptables", "-w", "5", "-D", *spec], check=False, quiet=True).returncode == 0:
                pass
        elif run(["iptables", "-w", "5", "-C", *spec], check=False, quiet=True).returncode != 0:
            if rule[-1] == "DROP":
                run(["iptables", "-w", "5", "-A", *spec])
            else:
                run(["iptables", "-w", "5", "-I", spec[0], "1", *spec[1:]])


def ensure_bridge(c: Cluster) -> None:
    """The bridge exists before any pod, with the gateway address the API server advertises."""
    f = c.st.full
    assert f is not None
    kubelet_mod.ensure_bridge_link(f.pod_bridge, f.pod_gateway, int(f.pod_subnet.split("/")[1]))


def start_controller_manager(c: Cluster) -> None:
    """Start kube-controller-manager (every controller); wait for its /healthz (50 s)."""
    assert c.st.full is not None
    kubeconfig, port, p = str(c.dir / "kubeconfig"), c.st.full.kcm_port, c.dir / "pki"
    log(f"starting kube-controller-manager (secure port 127.0.0.1:{port})")
    c.start("controller-manager", [
        binary("kube-controller-manager", "--full"), "--kubeconfig", kubeconfig,
        "--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig,
        "--leader-elect=false", "--bind-address", "127.0.0.1",
        "--secure-port", str(port), "--service-account-private-key-file", f"{p}/sa.key",
        "--root-ca-file", f"{p}/ca.crt", "--use-service-account-credentials=false",
        "--controllers", "*", "--v", "1", *feature_gate_flags(),
    ])
    c.wait_ready("controller-manager", "kube-controller-manager healthy",
                 lambda: https_ok(f"https://127.0.0.1:{port}/healthz"), 50)


def _service_rule_there() -> bool:
    out = run(["iptables", "-w", "5", "-t", "nat", "-S", "KUBE-SERVICES"], check=False, quiet=True)
    return any("-d 10.0.0.1/32" in line and "--dport 443" in line for line in out.stdout.splitlines())


def start_proxy(c: Cluster) -> None:
    """Start kube-proxy in iptables mode; ready when the ``kubernetes`` Service's rule is in the
    nat table (60 s). ``--conntrack-*=0``: the host's conntrack settings stay as they are."""
    f, kl = c.st.full, c.st.kubelet
    assert f is not None and kl is not None
    log(f"starting kube-proxy (iptables mode, healthz 127.0.0.1:{f.proxy_healthz_port})")
    c.start("proxy", [
        binary("kube-proxy", "--full"), "--kubeconfig", str(c.dir / "kubeconfig"),
        "--hostname-override", kl.node, "--proxy-mode", "iptables",
        "--cluster-cidr", f.pod_subnet, "--bind-address", "127.0.0.1",
        "--healthz-bind-address", f"127.0.0.1:{f.proxy_healthz_port}",
        "--metrics-bind-address", f"127.0.0.1:{f.proxy_metrics_port}",
        "--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0",
        "--conntrack-tcp-timeout-close-wait", "0", "--v", "1",
    ])
    c.wait_ready("proxy", "kube-proxy's rule for the kubernetes Service", _service_rule_there, 60)
    log(f"kube-proxy: 10.0.0.1:443 -> {f.pod_gateway}:{c.st.ports.apiserver}")


def import_agent_image(c: Cluster) -> None:
    """The agent image: built (cached) by scripts/build-image, imported once per image key."""
    tar = run([str(REPO_ROOT / "scripts" / "build-image")]).stdout.strip()
    key = Path(tar).name.removesuffix(".tar")
    version = key.removeprefix("omaticaya-").rsplit("-", 1)[0]
    image = f"{IMAGE_REPO}:{version}"
    if c.st.image_key == key and image in kubelet_mod.ctr(c, "images", "ls", "-q").splitlines():
        log(f"agent image already imported ({key})")
        return
    log(f"importing {tar} into containerd (k8s.io)")
    kubelet_mod.ctr(c, "images", "import", tar)
    if image not in kubelet_mod.ctr(c, "images", "ls", "-q").splitlines():
        raise DevClusterError(f"{image} not in containerd after the import")
    c.st.image_key = key
    c.save()
    log(f"image {image} ready")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def import_scheduler_image(c: Cluster) -> None:
    """kube-scheduler's image at the chart's default reference (``SCHEDULER_IMAGE``), made from
    the kube-scheduler binary the dev cluster built (``files.scheduler_image_tar``: one layer, no
    Docker daemon) and imported with ``ctr``; again only when it is not in containerd or the
    binary changed (its sha256 is the key kept in the state)."""
    path = Path(binary("kube-scheduler", "--scheduler"))
    key = f"kube-scheduler-{K8S_VERSION}-{_sha256(path)[:16]}"
    if (c.st.scheduler_image_key == key
            and SCHEDULER_IMAGE in kubelet_mod.ctr(c, "images", "ls", "-q").splitlines()):
        log(f"kube-scheduler image already imported ({SCHEDULER_IMAGE})")
        return
    tar = c.dir / "kubelet" / "kube-scheduler-image.tar"
    log(f"importing {SCHEDULER_IMAGE} (made from {path}) into containerd (k8s.io)")
    try:
        scheduler_image_tar(tar, path)
        kubelet_mod.ctr(c, "images", "import", str(tar))
    finally:
        tar.unlink(missing_ok=True)
    if SCHEDULER_IMAGE not in kubelet_mod.ctr(c, "images", "ls", "-q").splitlines():
        raise DevClusterError(f"{SCHEDULER_IMAGE} not in containerd after the import")
    c.st.scheduler_image_key = key
    c.save()
    log(f"image {SCHEDULER_IMAGE} ready")


def full_up(c: Cluster) -> None:
    """The full cluster's parts that do not run yet (the control plane runs already)."""
    kubelet_mod.require_linux_root("--full")
    # the bridge, kube-proxy's chains and the kubelet's device-plugin socket are the machine's:
    # one full cluster at a time
    if FULL_OWNER.exists():
        other = Path(FULL_OWNER.read_text().strip())
        if other != c.dir:
            try:
                o = Cluster(other)
            except DevClusterError:
                o = None
            if o is not None and (o.running("kubelet") or o.running("proxy")):
                raise DevClusterError(
                    f"another full dev cluster runs on this machine (state dir {other}): "
                    f"'OMATICAYA_DEV_DIR={other} scripts/dev-cluster down' first"
                )
    FULL_OWNER.write_text(f"{c.dir}\n")
    full_deps()
    if not c.running("controller-manager"):
        start_controller_manager(c)
    ensure_bridge(c)
    api_firewall(c, add=True)
    kubelet_mod.kubelet_up(c)
    import_agent_image(c)
    import_scheduler_image(c)
    if not c.running("proxy"):
        start_proxy(c)


def full_down(c: Cluster) -> None:
    c.stop("proxy")
    c.stop("controller-manager")


def cleanup_host(c: Cluster) -> None:
    """After the containers are gone: kube-proxy's chains, the bridge, the firewall rules."""
    if c.state is None or c.state.full is None:
        return
    f = c.state.full
    proxy = bin_dir() / "kube-proxy"
    if os.access(proxy, os.X_OK):
        with open(c.log_path("proxy"), "ab") as out:
            run([str(proxy), "--cleanup"], check=False, stdout=out, stderr=out, text=False)
    if run(["ip", "link", "show", f.pod_bridge], check=False, quiet=True).returncode == 0:
        log(f"removing bridge {f.pod_bridge}")
        run(["ip", "link", "del", f.pod_bridge], check=False, quiet=True)
    shutil.rmtree(c.dir / "cni-ipam", ignore_errors=True)
    api_firewall(c, add=False)
    if FULL_OWNER.exists() and FULL_OWNER.read_text().strip() == str(c.dir):
        FULL_OWNER.unlink()


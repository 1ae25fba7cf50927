"""``up --kubelet``: containerd 2 and a real kubelet (both built here from their Go modules),
their state in ``<state dir>/kubelet`` and ``<state dir>/containerd``, CNI loopback only, a
busybox image made locally (nothing is pulled). The Node registers as ``OMATICAYA_KUBELET_NODE``
(default omaticaya-kubelet). The device-plugin registration socket is always
/var/lib/kubelet/device-plugins/kubelet.sock, whatever --root-dir says, so one such kubelet runs
per machine. Linux and root only."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
from pathlib import Path

from devtools.devcluster.cluster import (
    K8S_VERSION,
    Cluster,
    binary,
    build,
    containerd_bin_dir,
    feature_gates,
    minor,
)
from devtools.devcluster.files import (
    KUBELET_IMAGE,
    busybox_image_tar,
    kubelet_config,
    kubelet_files,
)
from devtools.devcluster.procs import free_port, log, run, wait_until
from devtools.devcluster.state import DevClusterError, KubeletState

DEVICE_CHECKPOINT = Path("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
_apt_updated = False


def apt_install(missing: list[str]) -> None:
    """``apt-get install`` the Debian packages in ``missing`` (``apt-get update`` first, once per
    run). Raises ``DevClusterError`` when not root or apt-get fails."""
    global _apt_updated
    if not missing:
        return
    if os.geteuid() != 0:
        raise DevClusterError(f"need root to apt-get install {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", RUNLEVEL="1")
    if not _apt_updated:
        log("apt-get update")
        run(["apt-get", "update", "-qq"], env=env, stdout=sys.stderr)
        _apt_updated = True
    log(f"apt-get install {' '.join(missing)}")
    # RUNLEVEL=1: keep postinst scripts from starting system services
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env,
        stdout=sys.stderr)


def require_linux_root(flag: str) -> None:
    if platform.system() != "Linux" or os.geteuid() != 0:
        raise DevClusterError(f"{flag} needs Linux and root")


def kubelet_deps() -> None:
    """Debian's packages the kubelet's node needs: runc, busybox (the images), the CNI plugins,
    iproute2 (the node IP's link); containerd is the one built here (2.x)."""
    missing = [pkg for ok, pkg in (
        (shutil.which("runc"), "runc"),
        (os.access("/bin/busybox", os.X_OK), "busybox-static"),
        (os.access("/usr/lib/cni/loopback", os.X_OK), "containernetworking-plugins"),
        (shutil.which("ip"), "iproute2"),
    ) if not ok]
    apt_install(missing)


def containerd_tool(name: str) -> str:
    """The path of ``containerd`` or ``ctr`` as built here (containerd 2)."""
    return str(containerd_bin_dir() / name)


def ctr(c: Cluster, *args: str, check: bool = True, quiet: bool = False) -> str:
    """``ctr`` on this cluster's containerd, namespace k8s.io; its stdout. Raises
    ``DevClusterError`` when ``check`` and it fails."""
    sock = f"{c.dir}/containerd/containerd.sock"
    argv = [containerd_tool("ctr"), "--address", sock, "-n", "k8s.io", *args]
    return run(argv, check=check, quiet=quiet).stdout


def ctr_answers(c: Cluster) -> bool:
    """True when containerd answers ``ctr version``."""
    sock = f"{c.dir}/containerd/containerd.sock"
    argv = [containerd_tool("ctr"), "--address", sock, "version"]
    return run(argv, check=False, quiet=True).returncode == 0


def start_containerd(c: Cluster) -> None:
    """Make ``/`` and every mount below it shared (``mount --make-rshared /``), then start
    containerd 2 with the state dir's config, its folder first on PATH so that it runs
    its own runc shim; wait until ``ctr`` answers (10 s);
    import the busybox image when it is not there."""
    binary_path = containerd_tool("containerd")
    # Every mount shared, as systemd makes them at boot: a container's Bidirectional mount (the
    # chart's MPS supervisor's, whose tmpfs must reach the host) needs its source on a shared
    # mount, and containerd refuses it on a private one (a bare machine's / may be private).
    run(["mount", "--make-rshared", "/"])
    version = run([binary_path, "--version"]).stdout.split()
    log(f"starting containerd ({version[2] if len(version) > 2 else '?'}) on "
        f"{c.dir}/containerd/containerd.sock")
    env = dict(os.environ, PATH=f"{containerd_bin_dir()}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    c.start("containerd", [binary_path, "--config", f"{c.dir}/containerd/config.toml"], env)
    c.wait_ready("containerd", "containerd answering", lambda: ctr_answers(c), 10)
    if KUBELET_IMAGE not in ctr(c, "images", "ls", "-q").splitlines():
        tar = c.dir / "kubelet" / "busybox-image.tar"
        busybox_image_tar(tar)
        ctr(c, "images", "import", str(tar))


def node_ready(c: Cluster, node: str) -> bool:
    """True when the Node ``node`` reports Ready=True."""
    try:
        obj = json.loads(c.api_get(f"/api/v1/nodes/{node}"))
    except (OSError, ValueError):
        return False
    status = obj.get("status") if isinstance(obj, dict) and obj.get("kind") == "Node" else None
    conds = {x.get("type"): x.get("status") for x in (status or {}).get("conditions") or []}
    return conds.get("Ready") == "True"


def start_kubelet(c: Cluster) -> None:
    """Start the kubelet (files already written); wait until its Node is Ready
    (``OMATICAYA_KUBELET_READY_TIMEOUT``, 60 s)."""
    kl, k = c.st.kubelet, c.dir / "kubelet"
    assert kl is not None
    node_ip = kubelet_node_ip(c)
    (k / "config.yaml").write_text(kubelet_config(c.dir, node_ip, kl.port, kl.healthz_port, minor(), feature_gates()))
    argv = [
        binary("kubelet", "--kubelet"), "--config", f"{k}/config.yaml",
        "--kubeconfig", f"{k}/kubeconfig", "--root-dir", f"{k}/root",
        "--cert-dir", f"{k}/pki", f"--hostname-override={kl.node}", f"--node-ip={node_ip}",
        "--v=1",
    ]
    log(f"starting kubelet {K8S_VERSION} as Node {kl.node} (port {node_ip}:{kl.port})")
    c.start("kubelet", argv)
    took = c.wait_ready("kubelet", f"Node {kl.node} Ready", lambda: node_ready(c, kl.node),
                        c.kubelet_ready_timeout_s)
    log(f"Node {kl.node} Ready after {took:.0f} s")


#: the kubelet's own host-local interface outside a full cluster: a bridge with no ports (this
#: kernel may lack the dummy link type)
NODE_LINK = "omaticaya-kl"


def ensure_bridge_link(name: str, address: str, prefix_len: int) -> None:
    """A Linux bridge ``name`` holding ``address/prefix_len``, up; made or completed as needed
    (the full cluster's pod bridge, the kubelet's own link). Raises ``DevClusterError`` when
    ``ip`` fails."""
    if run(["ip", "link", "show", name], check=False, quiet=True).returncode != 0:
        log(f"creating bridge {name} ({address}/{prefix_len})")
        run(["ip", "link", "add", name, "type", "bridge"])
    if f"inet {address}/" not in run(["ip", "-4", "addr", "show", "dev", name]).stdout:
        run(["ip", "addr", "add", f"{address}/{prefix_len}", "dev", name])
    run(["ip", "link", "set", name, "up"])


def kubelet_node_ip(c: Cluster) -> str:
    """The Node's InternalIP, where the kubelet listens and the API server reaches it for logs
    and exec. A full cluster: the pod bridge's gateway. Else the kubelet (1.37 as 1.31) refuses a
    loopback node IP ("nodeIP can't be loopback address") and never registers: a link
    ``NODE_LINK`` holding ``OMATICAYA_KUBELET_NODE_IP`` (default 10.217.254.1/32), reachable from
    this host only, made here and removed by ``down``."""
    if c.st.full is not None:
        return c.st.full.pod_gateway
    ip = os.environ.get("OMATICAYA_KUBELET_NODE_IP") or "10.217.254.1"
    ensure_bridge_link(NODE_LINK, ip, 32)
    return ip


def kubelet_up(c: Cluster) -> None:
    """containerd and the kubelet, unless it runs (building it, installing what is missing)."""
    require_linux_root("--kubelet")
    build("--kubelet")
    kubelet_deps()
    if c.running("kubelet"):
        log("kubelet already running")
        return
    if c.st.kubelet is None:
        port = free_port()
        c.st.kubelet = KubeletState(
            node=os.environ.get("OMATICAYA_KUBELET_NODE") or "omaticaya-kubelet",
            port=port,
            healthz_port=free_port((port,)),
        )
        c.save()
    kubelet_files(c.dir, c.st.kubelet.node, c.st.ports.apiserver, c.st.full)
    # a fresh kubelet: forget device allocations of an earlier one (same fixed folder)
    DEVICE_CHECKPOINT.unlink(missing_ok=True)
    if not c.running("containerd"):
        start_containerd(c)
    start_kubelet(c)


def start_kubelet_again(c: Cluster) -> None:
    """``start-kubelet``: the kubelet again (containerd must run); waits for its Node."""
    if not c.running("containerd"):
        raise DevClusterError("containerd is not running: use 'scripts/dev-cluster up --kubelet'")
    if c.running("kubelet"):
        log("kubelet already running")
        return
    start_kubelet(c)


def kubelet_down(c: Cluster) -> None:
    """Stop the kubelet, then every container it started, then containerd; unmount what is left
    under the state dir (sandbox shm, rootfs)."""
    c.stop("kubelet")
    if c.running("containerd"):
        for t in ctr(c, "tasks", "ls", "-q", check=False, quiet=True).split():
            ctr(c, "tasks", "kill", "-s", "SIGKILL", t, check=False, quiet=True)
        try:
            wait_until("the containers to stop",
                       lambda: "RUNNING" not in ctr(c, "tasks", "ls", check=False, quiet=True), 5)
        except DevClusterError:
            pass  # `tasks delete -f` kills what is left
        for t in ctr(c, "tasks", "ls", "-q", check=False, quiet=True).split():
            ctr(c, "tasks", "delete", "-f", t, check=False, quiet=True)
        for t in ctr(c, "containers", "ls", "-q", check=False, quiet=True).split():
            ctr(c, "containers", "delete", t, check=False, quiet=True)
    c.stop("containerd")
    # the link is the machine's: only the cluster whose kubelet it was removes it
    mine = c.state is not None and c.state.kubelet is not None and c.state.full is None
    if mine and run(["ip", "link", "show", NODE_LINK], check=False, quiet=True).returncode == 0:
        run(["ip", "link", "del", NODE_LINK], check=False, quiet=True)
    prefix = f"{c.dir}/"
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for m in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
        run(["umount", "-l", m], check=False, quiet=True)

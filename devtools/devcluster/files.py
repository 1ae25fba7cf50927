"""Files the dev cluster's processes read: certificates (openssl), kubeconfigs, the audit policy,
the kubelet's CNI config, containerd's config, and the image tarballs it imports into containerd
(busybox; the kube-scheduler image made from the binary the dev cluster builds).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import platform
import stat
import subprocess
import tarfile
from pathlib import Path
from typing import Any

from devtools.devcluster.cluster import K8S_VERSION
from devtools.devcluster.procs import log, run
from devtools.devcluster.state import FullState

KUBELET_IMAGE = "omaticaya.local/busybox:1"
#: the chart's default kube-scheduler image for the dev cluster's version
#: (``scheduler.image.repository`` + the cluster's version, ``omaticaya.schedulerImageTag``):
#: ``up --full`` makes it from the kube-scheduler binary it builds and imports it into containerd
SCHEDULER_IMAGE = f"registry.k8s.io/kube-scheduler:{K8S_VERSION}"
#: where the upstream image (``FROM go-runner``, ``COPY kube-scheduler /usr/local/bin/``) has it
SCHEDULER_IMAGE_BINARY = "/usr/local/bin/kube-scheduler"
#: distroless/static's PATH (the upstream image's base): the chart runs ``kube-scheduler`` by name
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SERVING_EXT = """basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
"""
CLIENT_EXT = """basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
"""
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages:
- RequestReceived
rules:
- level: Metadata
"""


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (mode 0600) through a temp file and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _client_cert(pki: Path, key: Path, crt: Path, subject: str) -> None:
    """A client key and certificate signed by the dev CA in ``pki``."""
    csr = crt.with_suffix(".csr")
    run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
         "-subj", subject], stderr=subprocess.DEVNULL)
    run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey",
         str(pki / "ca.key"), "-CAcreateserial", "-out", str(crt), "-days", "3650", "-extfile",
         str(pki / "client.ext")], stderr=subprocess.DEVNULL)
    csr.unlink()


def make_pki(state_dir: Path) -> None:
    """The CA, the API server's serving certificate, the admin client certificate
    (system:masters) and the ServiceAccount key pair in ``<state_dir>/pki`` (kept once made)."""
    p = state_dir / "pki"
    if (p / ".complete").exists():
        return
    log(f"creating certificates in {p}")
    if p.exists():
        for f in p.iterdir():
            f.unlink()
    p.mkdir(parents=True, exist_ok=True)
    quiet: dict[str, Any] = {"stderr": subprocess.DEVNULL, "cwd": p}
    old = os.umask(0o077)
    try:
        run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.crt", "-days", "3650", "-subj", "/CN=omaticaya-dev-ca",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"], **quiet)
        (p / "serving.ext").write_text(SERVING_EXT)
        (p / "client.ext").write_text(CLIENT_EXT)
        run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key",
             "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver"], **quiet)
        run(["openssl", "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey",
             "ca.key", "-CAcreateserial", "-out", "apiserver.crt", "-days", "3650", "-extfile",
             "serving.ext"], **quiet)
        (p / "apiserver.csr").unlink()
        _client_cert(p, p / "admin.key", p / "admin.crt", "/O=system:masters/CN=admin")
        run(["openssl", "genrsa", "-out", "sa.key", "2048"], **quiet)
        run(["openssl", "rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"], **quiet)
    finally:
        os.umask(old)
    for f in [*p.glob("*.crt"), p / "sa.pub"]:
        f.chmod(0o644)
    (p / ".complete").touch()


def write_kubeconfig(state_dir: Path, apiserver_port: int) -> None:
    """``<state_dir>/kubeconfig``: the admin credentials inline, the server on 127.0.0.1."""
    pki = state_dir / "pki"

    def b64(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    _write_private(state_dir / "kubeconfig", f"""apiVersion: v1
kind: Config
clusters:
- name: omaticaya-dev
  cluster:
    server: https://127.0.0.1:{apiserver_port}
    certificate-authority-data: {b64("ca.crt")}
users:
- name: admin
  user:
    client-certificate-data: {b64("admin.crt")}
    client-key-data: {b64("admin.key")}
contexts:
- name: omaticaya-dev
  context:
    cluster: omaticaya-dev
    user: admin
current-context: omaticaya-dev
""")


def write_audit_policy(state_dir: Path) -> None:
    """``<state_dir>/audit-policy.yaml``: every request at Metadata level."""
    (state_dir / "audit-policy.yaml").write_text(AUDIT_POLICY)


#: the fake GPU device nodes of ``<state dir>/dev`` (``fake_gpu_devices``): name -> (major,
#: minor). The NVIDIA driver's character devices: ``nvidia<i>`` 195:i (as many as the largest
#: trace in tests/data has GPUs), ``nvidiactl`` 195:255; ``nvidia-uvm`` and ``nvidia-uvm-tools``
#: get a dynamic major on a real host (510 is one unused here), minors 0 and 1
FAKE_GPU_DEVICES: dict[str, tuple[int, int]] = {
    **{f"nvidia{i}": (195, i) for i in range(8)},
    "nvidiactl": (195, 255),
    "nvidia-uvm": (510, 0),
    "nvidia-uvm-tools": (510, 1),
}


def fake_gpu_devices(dev_root: Path) -> None:
    """``dev_root`` (``<state dir>/dev``) holding the NVIDIA driver's device nodes
    (``FAKE_GPU_DEVICES``, mode 0666, made with mknod; no driver answers them): what a DRA
    driver's CDI spec names as host device nodes when the agent replays a trace on a machine
    without a GPU (the chart's ``dra.devRoot``), so that a container gets a real character
    device ``/dev/nvidia<i>``. Kept when right, remade when wrong; root only."""
    dev_root.mkdir(parents=True, exist_ok=True)
    for name, (major, minor) in FAKE_GPU_DEVICES.items():
        path = dev_root / name
        try:
            st = path.lstat()
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(major, minor):
                continue
            path.unlink()
        except FileNotFoundError:
            pass
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        path.chmod(0o666)  # whatever the umask


def kubelet_files(
    state_dir: Path, node: str, apiserver_port: int, full: FullState | None
) -> None:
    """The kubelet's client certificate (O=system:nodes and system:masters: RBAC only, no Node
    authorizer), kubeconfig and CNI config (loopback; in a full cluster the bridge with
    host-local IPAM), and containerd's config, under ``<state_dir>/kubelet`` and
    ``<state_dir>/containerd``; containerd 2 reads CDI specs from
    ``<state_dir>/cdi``; fake GPU device nodes in ``<state_dir>/dev`` (``fake_gpu_devices``)."""
    k, c, p = state_dir / "kubelet", state_dir / "containerd", state_dir / "pki"
    for d in (k / "root", k / "volume-plugins", k / "pki", k / "net.d", c / "root", c / "state",
              c / "runc", state_dir / "cdi"):
        d.mkdir(parents=True, exist_ok=True)
    fake_gpu_devices(state_dir / "dev")
    if not (k / "pki" / "node.crt").exists():
        log(f"creating the kubelet client certificate (O=system:nodes, CN=system:node:{node})")
        old = os.umask(0o077)
        try:
            _client_cert(p, k / "pki" / "node.key", k / "pki" / "node.crt",
                         f"/O=system:nodes/O=system:masters/CN=system:node:{node}")
        finally:
            os.umask(old)
    _write_private(k / "kubeconfig", f"""apiVersion: v1
kind: Config
clusters:
- name: omaticaya-dev
  cluster:
    server: https://127.0.0.1:{apiserver_port}
    certificate-authority: {p}/ca.crt
users:
- name: kubelet
  user:
    client-certificate: {k}/pki/node.crt
    client-key: {k}/pki/node.key
contexts:
- name: omaticaya-dev
  context: {{cluster: omaticaya-dev, user: kubelet}}
current-context: omaticaya-dev
""")
    cri_extra = ""
    if full is not None:
        # pods get their own network namespace on a Linux bridge (containerd adds loopback), the
        # namespaces mounted under containerd's state dir so that `down` unmounts them
        (k / "net.d" / "10-loopback.conflist").unlink(missing_ok=True)
        conf = {"cniVersion": "0.4.0", "name": "omaticaya-bridge", "plugins": [
            {"type": "bridge", "bridge": full.pod_bridge, "isGateway": True, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": f"{state_dir}/cni-ipam",
                      "ranges": [[{"subnet": full.pod_subnet, "gateway": full.pod_gateway}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}}]}
        (k / "net.d" / "10-omaticaya-bridge.conflist").write_text(json.dumps(conf) + "\n")
        cri_extra = "netns_mounts_under_state_dir = true"
    else:
        conf = {"cniVersion": "0.4.0", "name": "omaticaya-loopback",
                "plugins": [{"type": "loopback"}]}
        (k / "net.d" / "10-loopback.conflist").write_text(json.dumps(conf) + "\n")
    # containerd 2 resolves CDI device names (annotations, the kubelet's CDIDevices) against
    # the specs in <state dir>/cdi only: the host's /etc/cdi is not the test's
    cri_extra += f'\n  enable_cdi = true\n  cdi_spec_dirs = ["{state_dir}/cdi"]'
    (c / "config.toml").write_text(f"""version = 2
root = "{c}/root"
state = "{c}/state"
[grpc]
  address = "{c}/containerd.sock"
[ttrpc]
  address = "{c}/containerd.sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{KUBELET_IMAGE}"
  disable_apparmor = true
  # the kubelet asks -998 for sandboxes; lowering oom_score_adj is refused in some VMs
  # (nsexec: "failed to update /proc/self/oom_score_adj: Permission denied")
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  {cri_extra}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{c}/runc"
    # the handler of the GPU Operator's RuntimeClass "nvidia", so that a pod naming it runs as
    # on an operator node; here plain runc (no GPU, no NVIDIA runtime)
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
        SystemdCgroup = false
        Root = "{c}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{k}/net.d"
""")


def kubelet_config(
    state_dir: Path, node_ip: str, port: int, healthz_port: int, minor: int,
    gates: dict[str, bool] | None = None,
) -> str:
    """The KubeletConfiguration (``kubelet.config.k8s.io/v1beta1``) a Go release's kubelet
    reads with ``--config``: what the kubelet once took as flags (the flags are deprecated, and
    ``failCgroupV1`` exists only here). On the serving port: client certificates of the dev CA
    only (no anonymous, no webhook), every request allowed; cgroupfs; no eviction, no node
    allocatable enforcement, no image GC (the host's disk is not the test's); status every
    second; the dev taint so that only pods that tolerate it land. ``minor`` >= 31:
    ``failCgroupV1: false`` (this host runs cgroup v1; kubelet 1.35+ refuses it otherwise);
    ``gates``: ``featureGates`` (``cluster.feature_gates``), none when empty."""
    k = state_dir / "kubelet"
    cgroup_v1 = "failCgroupV1: false\n" if minor >= 31 else ""
    if gates:
        cgroup_v1 += "featureGates:\n" + "".join(f"  {g}: {str(v).lower()}\n" for g, v in gates.items())
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {node_ip}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz_port}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {state_dir}/pki/ca.crt}}
authorization: {{mode: AlwaysAllow}}
containerRuntimeEndpoint: unix://{state_dir}/containerd/containerd.sock
runtimeRequestTimeout: 30s
cgroupDriver: cgroupfs
cgroupsPerQOS: true
enforceNodeAllocatable: []
failSwapOn: false
evictionHard: {{}}
imageGCHighThresholdPercent: 100
volumePluginDir: {k}/volume-plugins
nodeStatusUpdateFrequency: 1s
syncFrequency: 5s
registerNode: true
registerWithTaints:
- {{key: omaticaya.io/dev-kubelet, value: "true", effect: NoSchedule}}
{cgroup_v1}"""


def _tar_dir(t: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    i = tarfile.TarInfo(name)
    i.type, i.mode = tarfile.DIRTYPE, mode
    t.addfile(i)


def _docker_archive(out: Path, layer: bytes, config: dict[str, Any], tag: str) -> None:
    """Write a docker-save tarball (what ``ctr images import`` reads) of one image: one
    uncompressed ``layer``, the image ``config`` (``rootfs`` and ``os`` filled in here), tagged
    ``tag``."""
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config_bytes = json.dumps(
        {"os": "linux", **config, "rootfs": {"type": "layers", "diff_ids": [diff_id]}}
    ).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    manifest = json.dumps(
        [{"Config": config_name, "RepoTags": [tag], "Layers": ["layer/layer.tar"]}]
    ).encode()
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w") as t:
        for name, data in ((config_name, config_bytes), ("layer/layer.tar", layer),
                           ("manifest.json", manifest)):
            i = tarfile.TarInfo(name)
            i.size = len(data)
            t.addfile(i, io.BytesIO(data))
    os.replace(tmp, out)


def busybox_image_tar(out: Path, tag: str = KUBELET_IMAGE) -> None:
    """A docker-save tarball of one layer holding /bin/busybox and its applet links: both the
    sandbox ("pause") image and the test image."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for d in ("bin", "tmp", "etc", "proc", "sys", "dev", "out"):
            _tar_dir(t, d, 0o1777 if d == "tmp" else 0o755)
        t.add("/bin/busybox", "bin/busybox")
        for a in ("sh", "sleep", "echo", "cat", "env", "ls", "true", "printenv", "mkdir", "test"):
            i = tarfile.TarInfo(f"bin/{a}")
            i.type, i.linkname = tarfile.SYMTYPE, "busybox"
            t.addfile(i)
    pause = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait; done"
    _docker_archive(out, layer.getvalue(), {
        "architecture": "amd64",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh", "-c", pause]},
        "history": [{"created_by": "scripts/dev-cluster (busybox-static)"}],
    }, tag)


def go_arch() -> str:
    """This machine's architecture as Go and image configs name it (amd64, arm64, ...)."""
    m = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(m, m)


def scheduler_image_tar(out: Path, binary: Path, tag: str = SCHEDULER_IMAGE) -> None:
    """A docker-save tarball of the kube-scheduler image, laid out as the upstream one
    (``registry.k8s.io/kube-scheduler``: distroless/static + go-runner, the binary at
    ``/usr/local/bin/kube-scheduler``) as far as a pod that names ``kube-scheduler`` in its
    ``command`` (the chart, kubeadm) relies on it: one layer holding the static ``binary`` (built
    with CGO_ENABLED=0: it needs no libc) at ``SCHEDULER_IMAGE_BINARY``, ``/etc/nsswitch.conf``
    (``hosts: files dns``, as distroless has, so Go's resolver reads /etc/hosts first), ``/tmp``;
    ``PATH`` as distroless sets it; user root, as upstream. Not there: go-runner (upstream's
    ENTRYPOINT ``["/go-runner"]``, a log-redirecting wrapper): the ENTRYPOINT here is the
    scheduler itself, no CMD; the chart's ``command`` replaces the entrypoint either way.
    Every entry's mtime is 0: the same binary gives the same image."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for d in ("usr", "usr/local", "usr/local/bin", "etc", "tmp"):
            _tar_dir(t, d, 0o1777 if d == "tmp" else 0o755)
        nss = b"hosts: files dns\n"
        i = tarfile.TarInfo("etc/nsswitch.conf")
        i.size, i.mode = len(nss), 0o644
        t.addfile(i, io.BytesIO(nss))
        i = tarfile.TarInfo(SCHEDULER_IMAGE_BINARY.lstrip("/"))
        i.size, i.mode = binary.stat().st_size, 0o755
        with open(binary, "rb") as f:
            t.addfile(i, f)
    _docker_archive(out, layer.getvalue(), {
        "architecture": go_arch(),
        "config": {"Env": [f"PATH={IMAGE_PATH}"], "Entrypoint": [SCHEDULER_IMAGE_BINARY],
                   "WorkingDir": "/"},
        "history": [{"created_by": f"scripts/dev-cluster (kube-scheduler {K8S_VERSION}, "
                                   "one name of the multi-call binary built from Go modules)"}],
    }, tag)

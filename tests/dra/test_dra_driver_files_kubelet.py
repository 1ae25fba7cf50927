"""Issue 52, item 9, on the dev cluster: a container that holds a DRA claim of ours gets the
NVIDIA driver's files from the claim's CDI spec alone, applied by containerd 2's own CDI, with no
``nvidia`` runtime and no hook (the dev cluster's containerd has runc only).

The light dev cluster (kube-apiserver, etcd, the default kube-scheduler) with its real kubelet
(v1.37.2 by default) on containerd 2 (``scripts/dev-cluster up --kubelet``: CDI on, specs read from
``<state dir>/cdi``). ``omaticaya run`` runs on the host as the agent would in its pod: DRA on,
the kubelet's plugin folders, the cluster's fake device nodes, ``tests/data/h100-trace.json``
(one H100, driver 580.159.04) and ``OMATICAYA_DRA_DRIVER_ROOT`` a fake driver root this module
lays out (tests/dra/driver_root_support.py: ELF libraries with the driver's SONAMEs and their
links, ``nvidia-smi`` and ``nvidia-debugdump`` as scripts, GSP firmware, the persistenced
socket, an MPS pipe folder); ``omaticaya-driver-files`` (``scripts/build-driver-files``) is on
its PATH. A ResourceClaim of DeviceClass ``gpu.omaticaya.io`` (the chart's) and a busybox pod
holding it: the scheduler allocates the GPU, the kubelet asks the plugin to prepare the claim,
containerd applies its CDI spec. What is checked:

- the agent says what it found and counts it (``omaticaya_dra_driver_files``);
- the claim's CDI spec mounts every file read-only in its own ``containerEdits``, no hook;
- in the container: each file the driver has, at the toolkit's path, with the host file's bytes
  (``sha256sum``), ``libcuda.so.1`` and ``libcuda.so`` as files with ``libcuda.so.<version>``'s
  bytes, the socket a socket; each mounted read-only (``/proc/self/mountinfo``); the mounted
  ``nvidia-smi`` runs; no ``/tmp/nvidia-mps``;
- containerd ran the container with runc (``io.containerd.runc.v2``) and no OCI hook.

Needs Linux and root (the kubelet), Go and a C compiler (the tool, the fake libraries); skipped,
saying why, otherwise. Kubernetes 1.34 or later (DRA's ``resource.k8s.io/v1``, GA in 1.34; a
whole GPU needs no feature beyond it): skipped on an older dev cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.devcluster.cluster import K8S_VERSION, minor
from omaticaya_py.core.publish.dra import DRIVER
from tests.chart import helm  # noqa: F401 - a fixture
from tests.devcluster import REPO_ROOT, DevCluster
from tests.dra.claims_support import (
    chart_device_classes,
    create_device_classes,
    delete_device_classes,
    resource_api,
)
from tests.dra.driver_root_support import VERSION, driver_files_tool, make_driver_root
from tests.helpers import H100_TRACE, free_port
from tests.kubelet import IMAGE, default_service_account, kubelet_node
from tests.waiting import wait_for

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.kubelet,
    pytest.mark.skipif(minor() < 34, reason=f"Kubernetes {K8S_VERSION}: no resource.k8s.io/v1 (DRA, GA in 1.34)"),
]

CLAIM, POD = "driver-files", "driver-files"
#: the paths whose bytes the pod prints (a socket: "socket <path>"; absent: "missing <path>")
SCRIPT = (
    'for f in $FILES; do if [ -S "$f" ]; then echo "socket $f"; elif [ -f "$f" ]; then '
    'sha256sum "$f"; else echo "missing $f"; fi; done > /out/files; '
    "/usr/bin/nvidia-smi > /out/smi 2>&1; "
    "if [ -e /tmp/nvidia-mps ]; then echo yes; else echo no; fi > /out/mps; "
    "cat /proc/self/mountinfo > /out/mountinfo; "
    "echo done > /out/done; exec sleep 3600"
)


@pytest.fixture(scope="module")
def node(dev_cluster: DevCluster) -> Iterator[str]:
    dev_cluster.start_scheduler()
    yield from kubelet_node(dev_cluster)


@pytest.fixture(scope="module")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("drv")
    return root, make_driver_root(root)


@pytest.fixture(scope="module")
def agent(dev_cluster: DevCluster, node: str, driver_root: tuple[Path, dict[str, Path]],
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:  # fmt: skip
    """``omaticaya run`` with DRA on the kubelet's folders and the fake driver root."""
    tool = driver_files_tool()
    kubelet = dev_cluster.state_dir / "kubelet" / "root"
    port = free_port()
    log = tmp_path_factory.mktemp("agent") / "agent.log"
    env = {**os.environ, **dev_cluster.env()}
    env.update(NODE_NAME=node, OMATICAYA_TRACE=str(H100_TRACE),
               OMATICAYA_SCHEDULE="@every 1s", OMATICAYA_METRICS_PORT=str(port),
               OMATICAYA_METRICS_ADDRESS="127.0.0.1", OMATICAYA_DRA="true",
               OMATICAYA_DRA_PLUGIN_DIR=str(kubelet / "plugins" / DRIVER),
               OMATICAYA_DRA_REGISTRY_DIR=str(kubelet / "plugins_registry"),
               OMATICAYA_DRA_CDI_DIR=str(dev_cluster.cdi_dir), OMATICAYA_DRA_DEV_ROOT=str(dev_cluster.dev_root),
               OMATICAYA_DRA_DRIVER_ROOT=str(driver_root[0]),
               OMATICAYA_DRA_DRIVER_HOST_ROOT=str(driver_root[0]),
               PATH=f"{tool.parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "omaticaya_py", "run"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        yield {"proc": proc, "log": log, "port": port}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def gone(call: Any, *args: Any) -> bool:
    """Whether ``call(*args)`` (a read) answers 404."""
    from kubernetes.client.exceptions import ApiException

    try:
        call(*args)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def claim_and_pod(node: str, out: Path, files: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The claim (one whole GPU of ours) and the busybox pod holding it, on ``node`` by the
    scheduler (not bound by name: the scheduler allocates the claim), writing what it sees of
    ``files`` (container paths) to ``out``."""
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": CLAIM, "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}}}  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD, "namespace": "default"},
           "spec": {"hostNetwork": True, "automountServiceAccountToken": False,
                    "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": [{"operator": "Exists"}],
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": CLAIM}],
                    "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                                    "command": ["/bin/sh", "-c", SCRIPT],
                                    "env": [{"name": "FILES", "value": " ".join(files)}],
                                    "resources": {"claims": [{"name": "gpu"}]},
                                    "volumeMounts": [{"name": "out", "mountPath": "/out"}]}],
                    "volumes": [{"name": "out", "hostPath": {"path": str(out), "type": "Directory"}}]}}  # fmt: skip
    return claim, pod


def metric(port: int) -> str:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return "\n".join(line for line in text.splitlines() if line.startswith("omaticaya_dra_driver_files"))


def test_a_claims_container_gets_the_drivers_files_without_a_hook(
    dev_cluster: DevCluster, node: str, agent: dict[str, Any], driver_root: tuple[Path, dict[str, Path]],
    admin_client: Any, admin_api: Any, helm: dict[str, Any], tmp_path: Path,  # noqa: F811
) -> None:
    from kubernetes.client.exceptions import ApiException

    _root, expected = driver_root
    log: Path = agent["log"]
    resource = resource_api(admin_client)
    default_service_account(admin_api)
    created = create_device_classes(admin_client, chart_device_classes(helm))
    out = tmp_path / "out"
    out.mkdir()
    claim, pod = claim_and_pod(node, out, sorted(expected))
    spec_file: Path | None = None
    try:
        wait_for("the agent's line on the driver's files",
                 lambda: "mounted read-only in every prepared claim's" in log.read_text(errors="replace"), 60)  # fmt: skip
        want = f'omaticaya_dra_driver_files{{driver_version="{VERSION}"}} {float(len(expected))}'
        # the line is logged before the gauge is set and /metrics answers: wait for both
        wait_for("the gauge omaticaya_dra_driver_files", lambda: metric(agent["port"]) == want, 30)
        wait_for("the node's ResourceSlice", lambda: [
            s for s in resource.list_resource_slice().items
            if s.spec.node_name == node and s.spec.driver == DRIVER and s.spec.devices
        ], 60)  # fmt: skip
        resource.create_namespaced_resource_claim("default", claim)
        admin_api.create_namespaced_pod("default", pod)
        wait_for("the pod's report", lambda: (out / "done").exists(), 180)

        # the claim's CDI spec: the files in its own edits, read-only, no hook
        uid = resource.read_namespaced_resource_claim(CLAIM, "default").metadata.uid
        spec_file = dev_cluster.cdi_dir / f"{DRIVER}-claim_{uid}.json"
        spec = json.loads(spec_file.read_text())
        mounts = {m["containerPath"]: m for m in spec["containerEdits"]["mounts"]}
        assert {p: m["hostPath"] for p, m in mounts.items()} == {p: str(f) for p, f in expected.items()}
        assert all(m["options"][0] == "ro" for m in mounts.values())
        assert "hooks" not in json.dumps(spec)

        # in the container: every file, the host's bytes, read-only; nvidia-smi runs
        seen = {path: what for what, path in (line.split(maxsplit=1) for line in (out / "files").read_text().splitlines())}
        for path, host_file in expected.items():
            if host_file.is_socket():
                assert seen.get(path) == "socket", (path, seen.get(path))
            else:
                want = subprocess.run(["sha256sum", str(host_file)], capture_output=True, text=True,
                                      check=True).stdout.split()[0]  # fmt: skip
                assert seen.get(path) == want, (path, seen.get(path))
        assert f"nvidia-smi of the fake driver {VERSION}" in (out / "smi").read_text()
        assert (out / "mps").read_text().strip() == "no"
        points = {f[4]: f[5].split(",") for f in (line.split() for line in (out / "mountinfo").read_text().splitlines())}
        assert all("ro" in points.get(p, []) for p in expected), {p: points.get(p) for p in expected}

        # containerd ran it with runc and no OCI hook: no nvidia runtime was involved
        # (the kubelet may report the running container after the pod wrote its report)
        def container_id() -> str | None:
            statuses = admin_api.read_namespaced_pod(POD, "default").status.container_statuses or []
            return statuses[0].container_id if statuses else None

        cid = str(wait_for("the container's ID in the pod's status", container_id, 60, 0.5))
        cid = cid.removeprefix("containerd://")
        info = json.loads(dev_cluster.ctr("containers", "info", cid))
        assert info["Runtime"]["Name"] == "io.containerd.runc.v2"
        assert not (info["Spec"].get("hooks") or {}), info["Spec"].get("hooks")
    finally:
        try:
            admin_api.delete_namespaced_pod(POD, "default", grace_period_seconds=0)
        except ApiException:
            pass
        wait_for("the pod gone", lambda: gone(admin_api.read_namespaced_pod, POD, "default"), 60)
        # no controller-manager here: the claim's finalizer is the test's to remove
        try:
            resource.patch_namespaced_resource_claim(CLAIM, "default", {"metadata": {"finalizers": None}},
                                                     _content_type="application/merge-patch+json")  # fmt: skip
            resource.delete_namespaced_resource_claim(CLAIM, "default")
        except ApiException:
            pass
        delete_device_classes(admin_client, created)
    # unprepared when the pod went: the claim's spec is gone
    if spec_file is not None:
        wait_for("the claim's CDI spec removed", lambda: not spec_file.exists(), 60)
    assert agent["proc"].poll() is None, log.read_text(errors="replace")[-3000:]

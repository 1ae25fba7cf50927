"""``scripts/dev-cluster up --full`` leaves in containerd every image the chart needs by default
for the cluster's version: the agent's, and kube-scheduler's at the chart's default reference
(``registry.k8s.io/kube-scheduler:v1.20.2``, ``devtools.devcluster.files.SCHEDULER_IMAGE``),
made without a Docker daemon from the kube-scheduler binary the dev cluster builds (issue 30).

The image's layout is checked without a cluster (a stand-in binary; and the chart's default
reference and command, with ``helm template``); on the full cluster (Linux and root; a cluster of
this module's own, down at its end): the image is listed by ``ctr -n k8s.io images ls``, a pod
with the chart's ``command`` (``kube-scheduler`` by name), pull policy and securityContext runs it
on the kubelet and prints ``Kubernetes v1.20.2``, a second ``up --full`` imports nothing, and an
image removed from containerd is imported again by the next one.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.devcluster.cluster import K8S_VERSION
from devtools.devcluster.files import SCHEDULER_IMAGE, SCHEDULER_IMAGE_BINARY, scheduler_image_tar
from devtools.devcluster.state import DevClusterError
from tests import waiting
from tests.chart import CHART, render
from tests.devcluster import SCRIPT, UP_TIMEOUT_S, DevCluster, _run_script, start_dev_cluster
from tests.kubelet import kubelet_sock_in_use

# the machine's one kubelet: these tests run on one pytest-xdist worker (tests/conftest.py)
pytestmark = pytest.mark.kubelet

WAIT_S = float(os.environ.get("OMATICAYA_HELM_WAIT_S", "180"))


def _archive(path: Path) -> tuple[dict[str, Any], dict[str, Any], tarfile.TarFile]:
    """The manifest entry, the config and the layer of a one-image docker-save tarball."""
    outer = tarfile.open(path)
    (manifest,) = json.loads(outer.extractfile("manifest.json").read())  # type: ignore[union-attr]
    config = json.loads(outer.extractfile(manifest["Config"]).read())  # type: ignore[union-attr]
    (layer_name,) = manifest["Layers"]
    layer = outer.extractfile(layer_name).read()  # type: ignore[union-attr]
    assert config["rootfs"] == {
        "type": "layers",
        "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()],
    }
    assert manifest["Config"] == hashlib.sha256(
        outer.extractfile(manifest["Config"]).read()  # type: ignore[union-attr]
    ).hexdigest() + ".json"
    return manifest, config, tarfile.open(fileobj=io.BytesIO(layer))


def test_scheduler_image_layout(tmp_path: Path) -> None:
    """One layer: the binary at /usr/local/bin/kube-scheduler (0755, byte for byte), /tmp
    (1777), /etc/nsswitch.conf; PATH as distroless/static's; the entrypoint is the binary; tagged
    with the chart's default reference; the same binary gives the same bytes."""
    binary = tmp_path / "kube-scheduler"
    binary.write_bytes(b"\x7fELF stand-in " + os.urandom(4096))
    out = tmp_path / "img.tar"
    scheduler_image_tar(out, binary)
    manifest, config, layer = _archive(out)
    assert SCHEDULER_IMAGE == f"registry.k8s.io/kube-scheduler:{K8S_VERSION}"
    assert manifest["RepoTags"] == [SCHEDULER_IMAGE]
    assert config["os"] == "linux" and config["architecture"]
    cfg = config["config"]
    path_dirs = [e for e in cfg["Env"] if e.startswith("PATH=")][0][5:].split(":")
    assert "/usr/local/bin" in path_dirs
    assert cfg["Entrypoint"] == [SCHEDULER_IMAGE_BINARY] == ["/usr/local/bin/kube-scheduler"]
    assert "Cmd" not in cfg and "User" not in cfg  # root, as upstream; the chart sets its user
    members = {m.name: m for m in layer.getmembers()}
    bin_entry = members["usr/local/bin/kube-scheduler"]
    assert bin_entry.isfile() and bin_entry.mode == 0o755 and bin_entry.mtime == 0
    assert layer.extractfile(bin_entry).read() == binary.read_bytes()  # type: ignore[union-attr]
    assert members["tmp"].isdir() and members["tmp"].mode == 0o1777
    assert layer.extractfile("etc/nsswitch.conf").read() == b"hosts: files dns\n"  # type: ignore[union-attr]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    again = tmp_path / "again.tar"
    scheduler_image_tar(again, binary)
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.slow
def test_the_chart_default_scheduler_image_is_the_one_made(helm: dict[str, Any]) -> None:
    """On the dev cluster's version the chart's kube-scheduler container is ``SCHEDULER_IMAGE``,
    run as ``kube-scheduler`` by name (found on the image's PATH), without args (the image's
    CMD is not used)."""
    docs = render(helm, {"scheduler": {"enabled": True}}, "--kube-version", K8S_VERSION)
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    (c,) = [c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "kube-scheduler"]
    assert c["image"] == SCHEDULER_IMAGE
    assert c["command"][0] == Path(SCHEDULER_IMAGE_BINARY).name and "args" not in c


# -- on the full dev cluster -----------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    if os.environ.get("OMATICAYA_SKIP_CLUSTER") == "1":
        pytest.skip("OMATICAYA_SKIP_CLUSTER=1: real cluster tests disabled")
    if os.uname().sysname != "Linux" or os.geteuid() != 0:
        pytest.skip("the full dev cluster (kubelet, containerd, bridge, iptables) needs Linux and root")
    if kubelet_sock_in_use():
        pytest.skip("another kubelet runs on this machine (one per machine)")
    state_dir = tmp_path_factory.mktemp("fullcluster")
    try:
        cluster = start_dev_cluster(state_dir, full=True)
    except BaseException:
        try:
            _run_script(state_dir, "down")
        except Exception:  # noqa: BLE001
            pass
        raise
    try:
        yield cluster
    finally:
        cluster.down()


def _ctr_images(cluster: DevCluster) -> list[str]:
    return cluster.ctr("images", "ls", "-q").split()


def _up_full(cluster: DevCluster) -> str:
    """``up --full`` again; its stderr (the progress lines)."""
    proc = subprocess.run(
        [str(SCRIPT), "up", "--full"],
        env=dict(os.environ, OMATICAYA_DEV_DIR=str(cluster.state_dir)),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=UP_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise DevClusterError(f"up --full exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc.stderr


def _api(cluster: DevCluster, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    req = urllib.request.Request(
        cluster.server + path,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json", "Accept": "application/json",
                 "User-Agent": "omaticaya-tests"},
    )
    try:
        with urllib.request.urlopen(req, context=cluster.ssl_context(), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.cluster
@pytest.mark.slow
def test_up_full_leaves_the_scheduler_image_in_containerd(cluster: DevCluster) -> None:
    images = _ctr_images(cluster)
    assert SCHEDULER_IMAGE in images, images
    assert cluster.agent_image in images, images
    assert (cluster.state().scheduler_image_key or "").startswith(f"kube-scheduler-{K8S_VERSION}-")


@pytest.mark.cluster
@pytest.mark.slow
def test_a_pod_runs_the_scheduler_image_as_the_chart_does(cluster: DevCluster) -> None:
    """The chart's command (``kube-scheduler``, looked up on the image's PATH), pull policy
    (IfNotPresent: nothing is pulled) and pod and container securityContexts (uid 65532,
    read-only root, no capabilities, RuntimeDefault seccomp) on the dev kubelet."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    node = cluster.kubelet_node
    name = f"kube-scheduler-version-{uuid.uuid4().hex[:8]}"
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "nodeName": node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "securityContext": values["podSecurityContext"],
            "containers": [{
                "name": "kube-scheduler", "image": SCHEDULER_IMAGE,
                "imagePullPolicy": values["scheduler"]["image"]["pullPolicy"],
                "command": ["kube-scheduler", "--version"],
                "securityContext": values["securityContext"],
            }],
        },
    }
    # the controller-manager makes the `default` ServiceAccount, which admission requires
    waiting.wait_for(
        "the default ServiceAccount",
        lambda: _api(cluster, "GET", "/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
        timeout_s=WAIT_S, every_s=0.5,
    )
    status, body = _api(cluster, "POST", "/api/v1/namespaces/default/pods", pod)
    assert status == 201, body
    try:
        def done() -> dict[str, Any] | None:
            got = json.loads(_api(cluster, "GET", f"/api/v1/namespaces/default/pods/{name}")[1])
            return got if got["status"].get("phase") in ("Succeeded", "Failed") else None

        start = time.monotonic()
        got = waiting.wait_for(f"pod {name} to finish", done, timeout_s=WAIT_S, every_s=0.5)
        assert got is not None
        print(f"[devcluster-full] pod finished after {time.monotonic() - start:.1f} s")
        status, log = _api(cluster, "GET", f"/api/v1/namespaces/default/pods/{name}/log")
        assert got["status"]["phase"] == "Succeeded", (got["status"], log)
        assert status == 200 and log.decode().strip() == f"Kubernetes {K8S_VERSION}", log
        (cs,) = got["status"]["containerStatuses"]
        assert cs["image"].endswith(SCHEDULER_IMAGE), cs
    finally:
        _api(cluster, "DELETE", f"/api/v1/namespaces/default/pods/{name}?gracePeriodSeconds=0")


@pytest.mark.cluster
@pytest.mark.slow
def test_up_full_again_imports_nothing_and_reimports_what_is_missing(cluster: DevCluster) -> None:
    before = cluster.state()
    err = _up_full(cluster)
    assert f"kube-scheduler image already imported ({SCHEDULER_IMAGE})" in err, err
    after = cluster.state()
    assert after.procs == before.procs
    assert after.scheduler_image_key == before.scheduler_image_key
    assert SCHEDULER_IMAGE in _ctr_images(cluster)

    cluster.ctr("images", "rm", SCHEDULER_IMAGE)
    assert SCHEDULER_IMAGE not in _ctr_images(cluster)
    err = _up_full(cluster)
    assert f"importing {SCHEDULER_IMAGE}" in err, err
    assert SCHEDULER_IMAGE in _ctr_images(cluster)
    assert cluster.state().scheduler_image_key == before.scheduler_image_key
    assert not list((cluster.state_dir / "kubelet").glob("kube-scheduler-image.tar*"))

"""NVIDIA's device list strategies on a real kubelet v1.20 + containerd 1.6
(``scripts/dev-cluster up --kubelet``): what a container really gets from ``Allocate``.

``omaticaya device-plugin`` replays ``tests/data/multi-gpu-trace.json`` (8 healthy GPUs) as
``example.com/gpu`` with ``OMATICAYA_DEVICE_LIST_STRATEGY`` set, in its own process; each test
pod writes what it sees (its ``NVIDIA_VISIBLE_DEVICES``, the files under
``/var/run/nvidia-container-devices`` and their mounts) to a host folder. The CRI annotations
of a container are read from containerd (``ctr containers info``: the CRI plugin keeps the
container's CRI config in the extension ``io.cri-containerd.container.metadata``).

Needs Linux and root, like the other kubelet tests; skipped otherwise.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from omaticaya_py.deviceplugin.strategies import cdi_annotation_key
from tests.devcluster import REPO_ROOT, DevCluster
from tests.kubelet import kubelet_node, stop_plugin
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRACE = Path(__file__).parent / "data" / "multi-gpu-trace.json"
UUID = [f"GPU-{i:08d}-7fda-b7ae-a94e-630097a14ca4" for i in range(8)]
RESOURCE = "example.com/gpu"
IMAGE = "omaticaya.local/busybox:1"
ROOT = "/var/run/nvidia-container-devices"
#: what the pod writes: its variable, the device files with their type, their mounts
SCRIPT = (
    'echo "$NVIDIA_VISIBLE_DEVICES" > /out/visible; '
    f"for f in {ROOT}/*; do stat -c '%n %F %t:%T' \"$f\"; done > /out/files 2>&1; "
    "grep nvidia-container-devices /proc/self/mountinfo > /out/mounts; "
    "echo done > /out/done; exec sleep 3600"
)


class Plugin:
    """``omaticaya device-plugin --trace`` with the given strategies."""

    def __init__(self, workdir: Path, strategies: str) -> None:
        self.log_path = workdir / f"device-plugin-{strategies}.log"
        env = dict(
            os.environ,
            OMATICAYA_METRICS_PORT="0",
            OMATICAYA_LOG_LEVEL="INFO",
            OMATICAYA_DEVICE_PLUGIN_RESOURCE=RESOURCE,
            OMATICAYA_DEVICE_LIST_STRATEGY=strategies,
            PYTHONPATH=str(REPO_ROOT),
        )
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "omaticaya_py", "device-plugin",
                    "--trace", str(TRACE), "--schedule", "@every 500ms",
                ],
                cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        return stop_plugin(self.proc)


@pytest.fixture(scope="module")
def kubelet(dev_cluster: DevCluster) -> Iterator[str]:
    yield from kubelet_node(dev_cluster)


@pytest.fixture(scope="module")
def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="omaticaya-dls-"))


@pytest.fixture(scope="module")
def serve(kubelet: str, admin_api, workdir: Path) -> Iterator[Callable[[str], Plugin]]:
    """``serve(strategies)``: stop the plugin running (if any), start one with these
    strategies and wait until the Node's allocatable shows its 8 GPUs."""
    running: list[Plugin] = []

    def start(strategies: str) -> Plugin:
        for p in running:
            assert p.stop() == 0, p.log()
            wait_for("plugin gone", lambda: allocatable(admin_api, kubelet) == 0, 15)
        running.clear()
        plugin = Plugin(workdir, strategies)
        running.append(plugin)
        got = wait_for(
            "8 GPUs allocatable", lambda: allocatable(admin_api, kubelet) == 8 or None, 60
        )
        assert got, plugin.log()
        return plugin

    yield start
    for p in running:
        p.stop()


def allocatable(admin_api, node: str) -> int:
    return int((admin_api.read_node(node).status.allocatable or {}).get(RESOURCE, "0"))


@pytest.fixture(scope="module")
def pods(admin_api, kubelet: str, workdir: Path) -> Iterator[Callable[..., Path]]:
    """``make(name, gpus) -> host folder`` the pod writes to; pods are deleted afterwards."""
    from kubernetes.client.exceptions import ApiException

    try:
        admin_api.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    created: list[str] = []

    def make(name: str, gpus: int) -> Path:
        out = workdir / name
        admin_api.create_namespaced_pod("default", {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": kubelet,
                "hostNetwork": True,
                "automountServiceAccountToken": False,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{
                    "name": "c",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", SCRIPT],
                    "resources": {"limits": {RESOURCE: str(gpus)}},
                    "volumeMounts": [{"name": "out", "mountPath": "/out"}],
                }],
                "volumes": [
                    {"name": "out", "hostPath": {"path": str(out), "type": "DirectoryOrCreate"}}
                ],
            },
        })
        created.append(name)
        return out

    yield make
    for name in created:
        try:
            admin_api.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        except ApiException:
            pass


def seen(admin_api, name: str, out: Path) -> dict[str, str] | None:
    """What the running pod wrote, once it has: {visible, files, mounts}."""
    pod = admin_api.read_namespaced_pod(name, "default")
    if pod.status.phase == "Failed":
        raise AssertionError(f"pod {name} failed: {pod.status.reason} {pod.status.message}")
    if not (out / "done").is_file():
        return None
    return {f: (out / f).read_text().strip() for f in ("visible", "files", "mounts")}


def files_of(text: str) -> dict[str, str]:
    """``stat`` lines -> {device: 'character special file 1:3'}."""
    found = {}
    for line in text.splitlines():
        path, _, kind = line.partition(" ")
        found[path.removeprefix(ROOT + "/")] = kind
    return found


def mount_options(text: str) -> dict[str, set[str]]:
    """mountinfo lines -> {device: mount options}; the mount point may show as
    /run/nvidia-container-devices/... where the image links /var/run to /run."""
    found = {}
    for line in text.splitlines():
        fields = line.split()
        found[fields[4].rpartition("nvidia-container-devices/")[2]] = set(fields[5].split(","))
    return found


def cri_annotations(dev_cluster: DevCluster, admin_api, name: str) -> dict[str, str]:
    """The annotations of the pod's container in its CRI config, as containerd keeps them."""

    def running_id() -> str | None:  # the pod's status may lag behind what its container wrote
        statuses = admin_api.read_namespaced_pod(name, "default").status.container_statuses
        return statuses[0].container_id if statuses and statuses[0].container_id else None

    container_id = wait_for(f"{name}'s container ID", running_id, 30).removeprefix("containerd://")
    done = subprocess.run(
        [
            "ctr", "--address", str(dev_cluster.state_dir / "containerd" / "containerd.sock"),
            "-n", "k8s.io", "containers", "info", container_id,
        ],
        capture_output=True, text=True, timeout=30, check=True,
    )
    info = json.loads(done.stdout)
    ext = info["Extensions"]["io.cri-containerd.container.metadata"]
    metadata = json.loads(base64.b64decode(ext["value"]))
    return metadata["Metadata"]["Config"]["annotations"]


def test_all_four_strategies_reach_the_container(dev_cluster, admin_api, serve, pods) -> None:
    """volume-mounts: one read-only /dev/null per GPU under the mount root; envvar: the UUIDs
    (both on); cdi-annotations: the annotation in the container's CRI config; cdi-cri: the
    field is in the answer and a 1.20 kubelet runs the pod all the same."""
    plugin = serve("envvar,volume-mounts,cdi-annotations,cdi-cri")
    out = pods("dls-all", 2)
    got = wait_for("dls-all running", lambda: seen(admin_api, "dls-all", out), 60)
    gpus = got["visible"].split(",")
    assert len(gpus) == 2 and set(gpus) <= set(UUID), got
    assert files_of(got["files"]) == {g: "character special file 1:3" for g in gpus}, got
    options = mount_options(got["mounts"])
    assert set(options) == set(gpus), got
    assert all("ro" in o for o in options.values()), got
    annotations = cri_annotations(dev_cluster, admin_api, "dls-all")
    assert annotations[cdi_annotation_key(gpus)] == ",".join(f"nvidia.com/gpu={g}" for g in gpus)
    assert "device plugin: allocate" in plugin.log()


def test_volume_mounts_alone_sets_the_mount_root(dev_cluster, admin_api, serve, pods) -> None:
    """As NVIDIA's plugin: NVIDIA_VISIBLE_DEVICES names the mount root, no CDI annotation."""
    serve("volume-mounts")
    out = pods("dls-mounts", 1)
    got = wait_for("dls-mounts running", lambda: seen(admin_api, "dls-mounts", out), 60)
    assert got["visible"] == ROOT
    (gpu,) = files_of(got["files"])
    assert gpu in UUID
    assert set(mount_options(got["mounts"])) == {gpu}
    annotations = cri_annotations(dev_cluster, admin_api, "dls-mounts")
    assert not [k for k in annotations if k.startswith("cdi.k8s.io/")]


def test_cdi_annotations_alone_set_no_variable_and_no_mount(
    dev_cluster, admin_api, serve, pods
) -> None:
    serve("cdi-annotations")
    out = pods("dls-cdi", 1)
    got = wait_for("dls-cdi running", lambda: seen(admin_api, "dls-cdi", out), 60)
    assert got["visible"] == "" and got["mounts"] == ""
    annotations = cri_annotations(dev_cluster, admin_api, "dls-cdi")
    (key,) = [k for k in annotations if k.startswith("cdi.k8s.io/")]
    assert key.startswith("cdi.k8s.io/omaticaya-device-plugin_")
    (name,) = annotations[key].split(",")
    assert name.removeprefix("nvidia.com/gpu=") in UUID

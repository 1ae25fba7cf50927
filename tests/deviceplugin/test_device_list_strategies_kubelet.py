"""NVIDIA's device list strategies on a real kubelet (v1.37.2; v1.31.0 in the oldest release's
lane) + containerd 2 (``scripts/dev-cluster up --kubelet``): what a container really gets from
``Allocate``, CDI included: containerd 2 resolves the CDI names (the annotation, the kubelet's
``CDIDevices``) against the specs in the cluster's CDI folder, where this module writes one for
the trace's GPUs as ``nvidia-ctk cdi generate`` would name them (kind ``nvidia.com/gpu``, a
device per UUID): a device node ``/dev/nvidia<i>`` (the host's /dev/null, 1:3) and a variable
``OMATICAYA_CDI_GPU_<i>=<uuid>``, so that the test reads what CDI injected.

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
from tests.helpers import MULTI_TRACE as TRACE
from tests.kubelet import (
    default_service_account,
    delete_pods,
    kubelet_node,
    kubelet_pod,
    stop_plugin,
)
from tests.waiting import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.kubelet]

UUID = [f"GPU-{i:08d}-7fda-b7ae-a94e-630097a14ca4" for i in range(8)]
RESOURCE = "example.com/gpu"
SHARED = "omaticaya.io/gpu-memory"
ROOT = "/var/run/nvidia-container-devices"
#: what the pod writes: its variable, the device files with their type, their mounts
SCRIPT = (
    'echo "$NVIDIA_VISIBLE_DEVICES" > /out/visible; '
    'echo "$OMATICAYA_GPU_MEMORY_LIMIT_MIB" > /out/limit; '
    f"for f in {ROOT}/*; do stat -c '%n %F %t:%T' \"$f\"; done > /out/files 2>&1; "
    "grep nvidia-container-devices /proc/self/mountinfo > /out/mounts; "
    "for f in /dev/nvidia*; do test -e \"$f\" && stat -c '%n %F %t:%T' \"$f\"; done > /out/cdi-nodes; "
    "env | grep '^OMATICAYA_CDI_GPU_' | sort > /out/cdi-env; "
    "echo done > /out/done; exec sleep 3600"
)


class Plugin:
    """``omaticaya device-plugin --trace`` with the given strategies."""

    def __init__(self, workdir: Path, strategies: str, shared: str = "none") -> None:
        self.log_path = workdir / f"device-plugin-{strategies}-{shared}.log"
        env = dict(
            os.environ,
            OMATICAYA_SHARED_GPUS=shared,
            # no MPS daemon here (tests/mps/test_mps_cluster.py runs one)
            OMATICAYA_SHARE_ENFORCEMENT="none",
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
    spec = dev_cluster.cdi_dir / "omaticaya-test-gpus.json"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps(cdi_spec()))
    try:
        yield from kubelet_node(dev_cluster)
    finally:
        spec.unlink(missing_ok=True)


def cdi_spec() -> dict:
    """A CDI spec of the trace's eight GPUs, kind ``nvidia.com/gpu``, one device per UUID."""
    return {
        "cdiVersion": "0.6.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": uuid, "containerEdits": {
                "env": [f"OMATICAYA_CDI_GPU_{i}={uuid}"],
                "deviceNodes": [{"path": f"/dev/nvidia{i}", "hostPath": "/dev/null"}],
            }}
            for i, uuid in enumerate(UUID)
        ],
    }


def cdi_injected(got: dict[str, str]) -> dict[str, tuple[str, str]]:
    """What CDI put in the container: {uuid: (device node, its stat line)} from the variables
    and the /dev/nvidia* nodes the pod wrote."""
    nodes = dict(line.split(" ", 1) for line in got["cdi-nodes"].splitlines())
    out = {}
    for line in got["cdi-env"].splitlines():
        key, _, uuid = line.partition("=")
        node = f"/dev/nvidia{key.removeprefix('OMATICAYA_CDI_GPU_')}"
        out[uuid] = (node, nodes.get(node, ""))
    return out


@pytest.fixture(scope="module")
def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="omaticaya-dls-"))


@pytest.fixture(scope="module")
def serve(kubelet: str, admin_api, workdir: Path) -> Iterator[Callable[[str], Plugin]]:
    """``serve(strategies, shared)``: stop the plugin running (if any), start one with these
    strategies (and ``OMATICAYA_SHARED_GPUS``) and wait until the Node's allocatable shows its
    whole GPUs (and the shared GPUs' units)."""
    running: list[Plugin] = []

    def start(strategies: str, shared: str = "none") -> Plugin:
        for p in running:
            assert p.stop() == 0, p.log()
            wait_for("plugin gone", lambda: allocatable(admin_api, kubelet) == 0, 15)
        running.clear()
        plugin = Plugin(workdir, strategies, shared)
        running.append(plugin)
        whole = 8 if shared == "none" else 7
        wait_for(
            f"{whole} GPUs allocatable", lambda: allocatable(admin_api, kubelet) == whole, 60
        )
        if shared != "none":
            wait_for("units allocatable", lambda: allocatable(admin_api, kubelet, SHARED) > 0, 30)
        return plugin

    yield start
    for p in running:
        p.stop()


def allocatable(admin_api, node: str, resource: str = RESOURCE) -> int:
    return int((admin_api.read_node(node).status.allocatable or {}).get(resource, "0"))


@pytest.fixture(scope="module")
def pods(admin_api, kubelet: str, workdir: Path) -> Iterator[Callable[..., Path]]:
    """``make(name, gpus, resource) -> host folder`` the pod writes to; pods are deleted
    afterwards."""
    default_service_account(admin_api)
    created: list[str] = []

    def make(name: str, gpus: int, resource: str = RESOURCE) -> Path:
        out = workdir / name
        admin_api.create_namespaced_pod(
            "default", kubelet_pod(name, kubelet, SCRIPT, {resource: str(gpus)}, out)
        )
        created.append(name)
        return out

    yield make
    delete_pods(admin_api, created)


def seen(admin_api, name: str, out: Path) -> dict[str, str] | None:
    """What the running pod wrote, once it has: {visible, limit, files, mounts, cdi-nodes,
    cdi-env}."""
    pod = admin_api.read_namespaced_pod(name, "default")
    if pod.status.phase == "Failed":
        raise AssertionError(f"pod {name} failed: {pod.status.reason} {pod.status.message}")
    if not (out / "done").is_file():
        return None
    names = ("visible", "limit", "files", "mounts", "cdi-nodes", "cdi-env")
    return {f: (out / f).read_text().strip() for f in names}


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
    info = json.loads(dev_cluster.ctr("containers", "info", container_id))
    ext = info["Extensions"]["io.cri-containerd.container.metadata"]
    metadata = json.loads(base64.b64decode(ext["value"]))
    return metadata["Metadata"]["Config"]["annotations"]


def test_all_four_strategies_reach_the_container(dev_cluster, admin_api, serve, pods) -> None:
    """volume-mounts: one read-only /dev/null per GPU under the mount root; envvar: the UUIDs
    (both on); cdi-annotations and cdi-cri: the annotation in the container's CRI config, and
    containerd 2 injects what the CDI spec gives each of the pod's GPUs, once (both strategies
    name the same devices)."""
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
    injected = cdi_injected(got)
    assert set(injected) == set(gpus), got
    assert all(stat.endswith("character special file 1:3") for _, stat in injected.values()), got
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
    assert got["cdi-env"] == "" and got["cdi-nodes"] == "", got


@pytest.mark.parametrize("strategy", ["cdi-annotations", "cdi-cri"])
def test_cdi_alone_gives_what_the_spec_injects(
    dev_cluster, admin_api, serve, pods, strategy
) -> None:
    """The annotation (any CDI-enabled runtime) or the kubelet's ``CDIDevices`` (1.29+):
    containerd 2 injects the GPU's device node and variable from the spec; no
    NVIDIA_VISIBLE_DEVICES, no mount."""
    serve(strategy)
    name = f"dls-{strategy}"
    out = pods(name, 1)
    got = wait_for(f"{name} running", lambda: seen(admin_api, name, out), 60)
    assert got["visible"] == "" and got["mounts"] == "", got
    annotations = cri_annotations(dev_cluster, admin_api, name)
    keys = [k for k in annotations if k.startswith("cdi.k8s.io/")]
    ((gpu, (node, stat)),) = cdi_injected(got).items()
    assert gpu in UUID and node == f"/dev/nvidia{UUID.index(gpu)}", got
    assert stat == "character special file 1:3", got
    if strategy == "cdi-annotations":
        (key,) = keys
        assert key.startswith("cdi.k8s.io/omaticaya-device-plugin_")
        assert annotations[key] == f"nvidia.com/gpu={gpu}"
    else:
        assert keys == [], annotations


def test_a_memory_slice_gets_its_gpu_by_mounts_and_cdi(dev_cluster, admin_api, serve, pods) -> None:
    """GPU 0 shared (``omaticaya.io/gpu-memory``, 1024 MiB units): a pod asking 2 units gets
    GPU 0 by the mount of its UUID and the CDI annotation, with its limit in the environment;
    the unit IDs themselves never reach the runtime."""
    serve("volume-mounts,cdi-annotations", shared="0")
    out = pods("dls-slice", 2, SHARED)
    got = wait_for("dls-slice running", lambda: seen(admin_api, "dls-slice", out), 60)
    assert got["visible"] == ROOT and got["limit"] == "2048", got
    assert files_of(got["files"]) == {UUID[0]: "character special file 1:3"}, got
    assert set(mount_options(got["mounts"])) == {UUID[0]}, got
    annotations = cri_annotations(dev_cluster, admin_api, "dls-slice")
    assert annotations[cdi_annotation_key([UUID[0]])] == f"nvidia.com/gpu={UUID[0]}"
    assert set(cdi_injected(got)) == {UUID[0]}, got

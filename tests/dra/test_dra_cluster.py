"""Issue 41, item 7: the DRA driver ``gpu.omaticaya.io`` end to end, on the full dev cluster
(real kubelet v1.37.2 + containerd 2 with CDI, ``scripts/dev-cluster up --full``) and the image
of ``scripts/build-image``; the chart installed by ``helm`` (``dra.enabled``, no device plugin),
claims and pods by ``kubectl apply``.

The kubelet plugin's folders are the dev kubelet's (``<state dir>/kubelet/root/plugins`` and
``plugins_registry``), its CDI specs go where this containerd reads them (``<state dir>/cdi``)
and the device nodes it names are the dev cluster's fake ones (``<state dir>/dev``: character
devices ``nvidia<i>`` 195:i, ``nvidiactl``, ``nvidia-uvm``, made by ``up --kubelet``; no driver
answers them: a container sees the node, nothing more).

``test_a_gpu_that_goes_unhealthy_is_tainted_then_cleared`` (d), ``faults-trace.json`` (4 GPUs,
a 40 s loop; ``xidQuietS: 8``, ``minPatchIntervalS: 0`` so that a recovery is published at the
tick it happens), the chart's ``dra.taintEffect=NoExecute``: GPU 1's pending remap and GPU 2's
Xid 79 taint their devices (``gpu.omaticaya.io/unhealthy=<reason>:NoExecute``) and the taints
go when the health rules say the GPUs recovered; a pod holding GPU 1 by a claim that tolerates
nothing is evicted by kube-controller-manager's device-taint-eviction-controller (condition
``DisruptionTarget`` ``DeletionByDeviceTaintManager``, Event ``DeviceTaintManagerEviction``, the
pod deleted); a pod holding GPU 2 by a claim tolerating the taint (Exists, NoExecute) keeps
running and its status shows the device Unhealthy with the reason, then Healthy
(ResourceHealthStatus).

``test_claims_get_the_gpus_they_select_share_by_memory_and_survive_a_kubelet_restart``,
``multi-gpu-trace.json`` (8 H100s, steady; free MiB per GPU 0-7: 80896, 50176, 70656, 9216,
80896, 34816, 75776, 3072), GPUs 0 and 1 shared in units of 1 GiB, enforced by MPS (the image's
stand-in daemon):

a. a claim of one whole GPU (DeviceClass ``gpu.omaticaya.io``, CEL ``index == 4``) runs, and its
   container sees that GPU through CDI: ``NVIDIA_VISIBLE_DEVICES`` is GPU 4's UUID, ``/dev/nvidia4``
   a character device 195:4 (and no other ``/dev/nvidia<i>``);
a'. a claim with a bad opaque config of ours (``kind: Bogus``, pinned to GPU 7) is allocated,
   its pod never starts: the kubelet's Warning ``FailedPrepareDynamicResources`` on the pod
   carries the driver's reason naming the field; no CDI spec of the claim's UID, no entry in
   the plugin's ``checkpoint.json``; pod and claim deleted;
b. ``freeMemoryMiB >= 61440``: two claims land on GPUs 2 and 6 (4 is taken, 0 is shared and
   not in the class), a third stays Pending with the scheduler's reason;
c. two claims of ``memory: 20Gi`` (DeviceClass ``shared.gpu.omaticaya.io``) share one shared
   GPU, each container an MPS client limited to 20480M; a claim larger than what is left on that
   GPU, and one larger than what is left on any shared GPU, stay Pending;
e. a pod asking ``nvidia.com/gpu: 1`` and no claim gets a DRA device (the scheduler makes its
   claim: ``status.extendedResourceClaimStatus``) and runs with ``NVIDIA_VISIBLE_DEVICES`` set;
f. a kubelet restart: the plugin registers again (a new pod with a claim runs) and the running
   pods keep their devices (same containers, never restarted, the same environment; their CDI
   specs stay);
h. a reboot that lost a GPU (issue 48): ``helm upgrade`` to ``multi-gpu-lost-trace.json`` (GPU 3
   gone, GPUs 4-7 renumbered 3-6) restarts the agent; the devices keep their names (by UUID),
   the claim on GPU 4 keeps its UUID in the plugin's checkpoint and its pod runs on, and a new
   claim of index 3 or 4 gets GPU 5, not GPU 4 (index 3 now, still allocated);
g. the pods and claims deleted (their CDI specs go), ``helm uninstall`` leaves no
   ResourceSlice of the driver, no DeviceClass of ours, no CDI spec of ours, no socket in the
   plugin and registration folders.

Every wait is on a condition with a deadline; the figures printed are how long each took.
Needs Linux and root (the full dev cluster), like tests/mps/test_mps_cluster.py; Kubernetes 1.37:
``scripts/test`` runs it on v1.37.2 only (its v1.31.0 lane lists its files: resource.k8s.io/v1
does not exist on 1.31), and it skips, saying why, on an older dev cluster.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.devcluster.cluster import K8S_VERSION, minor
from devtools.devcluster.files import FAKE_GPU_DEVICES, fake_gpu_devices
from omaticaya_py.core.publish.dra import device_name
from omaticaya_py.dra.prepare import claim_slice_id
from tests.charts.helm_install_support import (  # noqa: F401 - cluster and tools are fixtures
    CHART,
    NAMESPACE,
    RELEASE,
    Kube,
    cluster,
    tools,
    values_file,
    wait_for,
)
from tests.kubelet import IMAGE
from tests.project.product_install_support import DEV_TAINT, running, unschedulable, uuid

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.skipif(
        minor() < 34,
        reason=f"Kubernetes {K8S_VERSION}: DRA's resource.k8s.io/v1 and the kubelet's DRA plugin "
        "API v1 are 1.34's; consumable capacity, extended resources backed by DRA and device "
        "taints are on by default from 1.36, and the dev cluster turns their gates on for 1.34 "
        "and 1.35 (devtools/devcluster/cluster.py, feature_gates)",
    ),
    pytest.mark.kubelet,
]

DRIVER = "gpu.omaticaya.io"
WHOLE, SHARED_CLASS, MIG_CLASS = DRIVER, f"shared.{DRIVER}", f"mig.{DRIVER}"
TAINT = f"{DRIVER}/unhealthy"
MULTI, FAULTS = "multi-gpu-trace.json", "faults-trace.json"
#: the multi-GPU node after a reboot that lost GPU 3: GPUs 4-7 renumbered 3-6, same UUIDs
LOST = "multi-gpu-lost-trace.json"
#: docs/install.md's DRA goal: the multi-GPU install passes it first, as the page says
DRA_GOAL = CHART.parent.parent / "examples" / "install" / "dra.yaml"
#: multi-gpu-trace.json's free memory per GPU, as the slice publishes it (steps of 1 GiB)
FREE_MIB = {0: 80896, 1: 50176, 2: 70656, 3: 9216, 4: 80896, 5: 34816, 6: 75776, 7: 3072}
SHARED = (0, 1)
GIB = 1024
WORK = "dra-work"
#: a finalizer the test puts on a pod it expects to be deleted by a controller, so that the
#: deleted pod (its conditions, its deletionTimestamp) can still be read; removed by the test
HOLD = "test.omaticaya.io/hold"
#: the chart's MPS root (the clients' pipe folders: <root>/<GPU UUID>/pipe)
MPS_ROOT = Path("/run/omaticaya/mps")
#: what each test pod prints: the GPU it was given, its MPS limits, the NVIDIA device nodes
SCRIPT = (
    "echo VISIBLE=$NVIDIA_VISIBLE_DEVICES; echo MPS_LIMIT=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; "
    "echo PIPE=$CUDA_MPS_PIPE_DIRECTORY; echo LIMIT=$OMATICAYA_GPU_MEMORY_LIMIT_MIB; "
    "echo \"CHR=$(for f in /dev/nvidia*; do test -c \"$f\" && printf '%s ' \"${f#/dev/}\"; done)\"; "
    "echo \"LS=$(ls -l /dev/nvidia* 2>/dev/null | tr '\\n' ';')\"; "
    "echo DONE=yes; exec sleep 3600"
)


# -- what the test applies ---------------------------------------------------------------------


def claim_spec(device_class: str, *selectors: str, memory: str | None = None,
               tolerations: list[dict[str, Any]] | None = None,
               config: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """A ResourceClaim's ``spec``: one device of ``device_class`` matching every CEL
    ``selectors``, taking ``memory`` of its capacity when given, tolerating ``tolerations``
    (device taints), with ``config`` as our driver's opaque parameters for its request."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    if tolerations:
        exactly["tolerations"] = tolerations
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if config is not None:
        devices["config"] = [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": config}}]
    return {"devices": devices}


def claim(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": WORK}, "spec": spec}  # fmt: skip


def template(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": WORK}, "spec": {"spec": spec}}  # fmt: skip


def pod(name: str, *, claim_name: str | None = None, template_name: str | None = None,
        limits: dict[str, str] | None = None, finalizers: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """A busybox pod printing ``SCRIPT``: its one container holds the claim ``claim_name``, or
    one made from ``template_name``, or asks ``limits`` (no claim); ``finalizers`` keep its
    object readable once deleted (``Stack.delete_work`` removes them)."""
    container: dict[str, Any] = {"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                                 "command": ["sh", "-c", SCRIPT]}  # fmt: skip
    spec: dict[str, Any] = {"tolerations": [DEV_TAINT], "terminationGracePeriodSeconds": 0,
                            "automountServiceAccountToken": False, "containers": [container]}  # fmt: skip
    if claim_name or template_name:
        ref = {"resourceClaimName": claim_name} if claim_name else {"resourceClaimTemplateName": template_name}
        spec["resourceClaims"] = [{"name": "gpu", **ref}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    else:
        container["resources"] = {"limits": limits or {}}
    meta: dict[str, Any] = {"name": name, "namespace": WORK}
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def apply(kube: Kube, *docs: dict[str, Any]) -> None:
    path = kube.cluster.state_dir / f"dra-{len(list(kube.cluster.state_dir.glob('dra-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    kube.kubectl("apply", "-f", str(path))


# -- what the test reads -----------------------------------------------------------------------


def get(kube: Kube, *args: str) -> Any:
    """``kubectl get ... -o json``, ``None`` when it fails (not there yet, gone)."""
    proc = kube.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def slices(kube: Kube) -> list[dict[str, Any]]:
    """Every ResourceSlice of our driver."""
    return (get(kube, "resourceslices", "--field-selector", f"spec.driver={DRIVER}") or {}).get("items", [])


def devices(kube: Kube, node: str) -> dict[str, dict[str, Any]]:
    """Our devices published for ``node``: name -> the device as stored."""
    return {d["name"]: d for s in slices(kube) if s["spec"].get("nodeName") == node
            for d in s["spec"].get("devices") or []}  # fmt: skip


def attr(device: dict[str, Any], name: str) -> Any:
    """The value of attribute ``name`` (ours, or fully qualified ``<domain>/<name>``)."""
    attrs = device.get("attributes") or {}
    value = attrs.get(name, attrs.get(f"{DRIVER}/{name}"))
    return None if value is None else next(iter(value.values()))


def taints(device: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(t["key"], t.get("value", ""), t["effect"]) for t in device.get("taints") or []}


def results(kube: Kube, name: str) -> list[dict[str, Any]]:
    """The allocation results of claim ``name`` (``[]``: not allocated)."""
    c = get(kube, "-n", WORK, "resourceclaim", name) or {}
    return ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []


def device_of(kube: Kube, name: str) -> str | None:
    got = results(kube, name)
    return got[0]["device"] if got else None


def pod_claim(kube: Kube, pod_name: str) -> str | None:
    """The claim of the pod's ``gpu`` entry: the one it names, the one made from its template,
    or the one the scheduler made for its extended resource."""
    p = get(kube, "-n", WORK, "pod", pod_name) or {}
    for ref in (p.get("spec") or {}).get("resourceClaims") or []:
        if ref.get("name") == "gpu" and ref.get("resourceClaimName"):
            return str(ref["resourceClaimName"])
    status = p.get("status") or {}
    for s in status.get("resourceClaimStatuses") or []:
        if s.get("name") == "gpu" and s.get("resourceClaimName"):
            return str(s["resourceClaimName"])
    ext = status.get("extendedResourceClaimStatus") or {}
    return ext.get("resourceClaimName")


def printed(kube: Kube, pod_name: str) -> dict[str, str] | None:
    """What the pod printed (``SCRIPT``), once it runs and printed it all."""
    p = get(kube, "-n", WORK, "pod", pod_name)
    if p is None or not running(p):
        return None
    out = kube.kubectl("-n", WORK, "logs", pod_name, check=False).stdout
    got = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return got if got.get("DONE") == "yes" else None


def pending_reason(kube: Kube, pod_name: str) -> str | None:
    p = get(kube, "-n", WORK, "pod", pod_name)
    return None if p is None else unschedulable(p)


def containers(kube: Kube, pod_name: str) -> list[tuple[str, int, bool]]:
    """(container ID, restart count, running) of the pod's containers."""
    p = get(kube, "-n", WORK, "pod", pod_name) or {}
    return [(c.get("containerID", ""), c.get("restartCount", 0), "running" in (c.get("state") or {}))
            for c in (p.get("status") or {}).get("containerStatuses") or []]  # fmt: skip


def our_cdi_specs(cdi_dir: Path) -> list[Path]:
    """The CDI specs of our driver in ``cdi_dir``: named for it, or of a kind of its domain."""
    out = []
    for f in sorted(cdi_dir.iterdir()) if cdi_dir.is_dir() else []:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        if "omaticaya" in f.name or DRIVER in text:
            out.append(f)
    return out


def prepare_failure(kube: Kube, pod_name: str) -> dict[str, Any] | None:
    """The kubelet's Event on the pod saying a claim could not be prepared (its reason
    ``FailedPrepareDynamicResources``, kubelet/events), ``None`` until there is one."""
    evs = (get(kube, "-n", WORK, "events", "--field-selector",
               f"involvedObject.kind=Pod,involvedObject.name={pod_name}") or {}).get("items", [])
    return next((e for e in evs if e.get("reason") == "FailedPrepareDynamicResources"), None)


def checkpointed(plugins: Path) -> dict[str, Any]:
    """The claims in the plugin's checkpoint (``<plugins>/<driver>/checkpoint.json``): UID ->
    entry (none: no file)."""
    path = plugins / DRIVER / "checkpoint.json"
    return dict(json.loads(path.read_text())["claims"]) if path.exists() else {}


def sockets(*folders: Path) -> list[str]:
    """Unix sockets at any depth under ``folders``."""
    return sorted(str(p) for d in folders if d.is_dir() for p in d.rglob("*") if p.is_socket())


def telemetry_holders(kube: Kube, node: str) -> dict[tuple[str, str], set[int]]:
    """(namespace, pod) -> the GPUs the Node's telemetry annotation says it holds (the kubelet's
    PodResources, DRA devices included)."""
    notes = kube.json("get", "node", node)["metadata"].get("annotations") or {}
    doc = json.loads(notes.get("omaticaya.io/telemetry", "{}"))
    out: dict[tuple[str, str], set[int]] = {}
    for g in doc.get("gpus") or []:
        for p in g.get("pods") or []:
            out.setdefault((p.get("namespace"), p["pod"]), set()).add(g["index"])
    return out


def named(index: int) -> str:
    """The device name of the traces' GPU ``index`` (named by its UUID, issue 48)."""
    return device_name(uuid(index))


def index_of(device: str) -> int:
    """The traces' GPU (its index in multi-gpu-trace.json) a whole GPU's device name is."""
    by_name = {named(i): i for i in range(8)}
    assert device in by_name, f"not a whole GPU's device: {device!r}"
    return by_name[device]


def dra_values(tmp: Path, kube: Kube, node: str, trace: str, *, taint_effect: str = "NoSchedule",
               **extra: Any) -> Path:  # fmt: skip
    """The chart's values: DRA on (no device plugin) on the dev kubelet's folders, the
    cluster's CDI folder and its fake device nodes, on ``trace``; an unhealthy GPU's taint
    ``taint_effect`` (``dra.taintEffect``)."""
    c = kube.cluster
    root = c.state_dir / "kubelet" / "root"
    socket = root / "pod-resources" / "kubelet.sock"  # who holds each GPU: the telemetry
    return values_file(tmp, c, node, trace=trace, devicePlugin=False, podResourcesSocket=str(socket),
                       dra={"enabled": True, "kubeletPluginsDir": str(root / "plugins"),
                            "kubeletRegistryDir": str(root / "plugins_registry"),
                            "cdiDir": str(c.cdi_dir), "devRoot": str(c.dev_root),
                            "taintEffect": taint_effect},
                       **extra)  # fmt: skip


class Timer:
    """Figures: how long each step took, printed at the end."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.times: dict[str, float] = {}

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 90) -> Any:
        start = time.monotonic()
        got = wait_for(what, probe, timeout=timeout)
        self.times[what] = time.monotonic() - start
        return got

    def took(self, what: str, start: float) -> None:
        self.times[what] = time.monotonic() - start

    def show(self) -> None:
        print(f"[{self.tag}] " + "; ".join(f"{k}: {v:.1f} s" for k, v in self.times.items()))


class Stack:
    """The chart installed with DRA on; torn down (and checked: item g) by ``uninstall``."""

    def __init__(self, kube: Kube, node: str, timer: Timer) -> None:
        self.kube, self.node, self.timer = kube, node, timer
        root = kube.cluster.state_dir / "kubelet" / "root"
        self.plugins, self.registry = root / "plugins", root / "plugins_registry"
        self.reg_sock = self.registry / f"{DRIVER}-reg.sock"
        self.installed = False

    def install(self, values: Path, goal: Path | None = None) -> None:
        """``helm install --wait`` with ``values``; after ``goal`` (docs/install.md's goal file,
        passed first as the page says) when given."""
        start = time.monotonic()
        files = ["-f", str(goal)] if goal is not None else []
        self.kube.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "--create-namespace",
                       *files, "-f", str(values), "--wait", "--timeout", "180s")  # fmt: skip
        self.installed = True
        self.timer.took("install --wait (Ready)", start)

    def delete_work(self) -> None:
        """The work namespace deleted, and waited for: its pods' finalizers (``HOLD``) first."""
        for p in (get(self.kube, "-n", WORK, "pods") or {}).get("items", []):
            if p["metadata"].get("finalizers"):
                self.release(p["metadata"]["name"])
        self.kube.kubectl("delete", "namespace", WORK, "--ignore-not-found", "--wait=true",
                          "--timeout=90s", check=False)  # fmt: skip

    def release(self, pod_name: str) -> None:
        """Remove the pod's finalizers (a deleted pod held by ``HOLD`` then goes)."""
        self.kube.kubectl("-n", WORK, "patch", "pod", pod_name, "--type=json", "-p",
                          '[{"op": "remove", "path": "/metadata/finalizers"}]', check=False)  # fmt: skip

    def uninstall(self) -> None:
        start = time.monotonic()
        self.kube.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s")
        self.installed = False
        # the mps pods too: their supervisor removes the MPS root (and its parent) as it stops,
        # and the next module's install expects neither (seen in CI: /run/omaticaya still there)
        wait_for("the agent and mps pods gone",
                 lambda: not self.kube.pods() and not self.kube.pods("mps"), timeout=90)  # fmt: skip
        self.timer.took("uninstall until the agent and mps pods are gone", start)

    def leftovers(self) -> dict[str, Any]:
        """What of ours is still there after the uninstall (item g: all empty)."""
        ours = [d["metadata"]["name"] for d in (get(self.kube, "deviceclasses") or {}).get("items", [])
                if d["metadata"]["name"] in (WHOLE, SHARED_CLASS, MIG_CLASS)
                or d["metadata"]["name"].endswith(f".{DRIVER}")
                or (d["metadata"].get("labels") or {}).get("app.kubernetes.io/instance") == RELEASE]  # fmt: skip
        return {
            "resourceslices": [s["metadata"]["name"] for s in slices(self.kube)],
            "deviceclasses": ours,
            "cdi specs": [str(p) for p in our_cdi_specs(self.kube.cluster.cdi_dir)],
            "sockets": [s for s in sockets(self.plugins, self.registry) if DRIVER in s],
        }

    def teardown(self) -> None:
        """After a failure: nothing of the test left for the next one."""
        self.delete_work()
        if self.installed:
            self.kube.helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s",
                           check=False)  # fmt: skip
            self.installed = False
            wait_for("the agent and mps pods gone",
                     lambda: not self.kube.pods() and not self.kube.pods("mps"), timeout=90)  # fmt: skip


@pytest.fixture
def stack(cluster, tools, tmp_path) -> Iterator[tuple[Stack, Path]]:  # noqa: F811
    helm, kubectl = tools
    node = cluster.start_full()
    kube = Kube(cluster, helm, kubectl, tmp_path / "helm")
    st = Stack(kube, node, Timer("dra"))
    try:
        yield st, tmp_path
    finally:
        st.teardown()
        st.timer.show()


# -- the dev cluster's fake device nodes -----------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root (as the full dev cluster does)")
def test_the_dev_roots_fake_gpu_device_nodes(tmp_path):
    """``up --kubelet`` makes ``<state dir>/dev``: the driver's character devices with the
    NVIDIA majors and minors, 0666; a second run keeps them, a wrong one is made again."""
    root = tmp_path / "dev"
    fake_gpu_devices(root)
    got = {p.name: (os.major(p.stat().st_rdev), os.minor(p.stat().st_rdev)) for p in root.iterdir()
           if stat.S_ISCHR(p.lstat().st_mode) and stat.S_IMODE(p.lstat().st_mode) == 0o666}  # fmt: skip
    assert got == FAKE_GPU_DEVICES
    assert got["nvidia4"] == (195, 4) and got["nvidiactl"] == (195, 255)
    ino = (root / "nvidia0").stat().st_ino
    (root / "nvidia1").unlink()
    (root / "nvidia1").write_text("not a device")
    fake_gpu_devices(root)
    assert (root / "nvidia0").stat().st_ino == ino  # kept
    assert stat.S_ISCHR((root / "nvidia1").lstat().st_mode)  # made again
    assert (root / "nvidia1").stat().st_rdev == os.makedev(195, 1)


#: whether the pod's status shows its DRA device's health (``allocatedResourcesStatus``). Not on
#: v1.34.4, seen in the DRA lane with ResourceHealthStatus on for every component: the kubelet
#: takes the plugin's health stream (its log: "Sending health update notification for pods") yet
#: no ``allocatedResourcesStatus`` reaches the pod; on v1.37.2 it does (docs/dra.md says so)
POD_HEALTH = minor() != 34
#: whether kube-controller-manager's device-taint-eviction-controller spares the pod of a claim
#: whose request tolerates the NoExecute taint. Not on v1.34.4, seen in the DRA lane: it deleted
#: that pod too ("Deleting pod" dra-work/on-gpu-2); on v1.37.2 the pod runs through its taint
#: (docs/dra.md: keep dra.taintEffect NoSchedule, the default, on 1.34)
TOLERATED = minor() != 34


# -- d: health as device taints that clear ------------------------------------------------------


def test_a_gpu_that_goes_unhealthy_is_tainted_then_cleared(stack):
    """faults-trace.json on the chart with ``dra.taintEffect=NoExecute`` (its 40 s loop from
    the agent's start): GPU 1's rows pending remap (t 10-15 s) and GPU 2's Xid 79 (t 20 s,
    quiet for 8 s) taint their devices with the reason, NoExecute, and the taints go when the
    GPUs recover; GPU 0 has no fault of its own (only while NVML cannot be read at all,
    t 32-35 s, may every device be).

    Both sides of NoExecute (kube-controller-manager's device-taint-eviction-controller, on by
    default: DRADeviceTaints is GA in 1.37):

    - a pod holding GPU 1 by a claim that tolerates nothing is evicted when GPU 1's taint
      comes: the controller puts the condition ``DisruptionTarget`` (reason
      ``DeletionByDeviceTaintManager``) on the pod, records the Event
      ``DeviceTaintManagerEviction`` and deletes it (the test's finalizer ``HOLD`` keeps the
      deleted pod readable; its container is stopped);
    - a pod holding GPU 2 by a claim whose request tolerates ``gpu.omaticaya.io/unhealthy``
      (Exists, NoExecute) keeps running through its fault, and its status shows the device's
      health from the plugin's health stream (ResourceHealthStatus, beta and on in 1.36+):
      Healthy, Unhealthy with the reason, Healthy (neither asked of 1.34: ``POD_HEALTH``,
      ``TOLERATED``)."""
    st, tmp = stack
    st.timer.tag = "dra faults"
    kube, node, effect = st.kube, st.node, "NoExecute"
    st.install(dra_values(tmp, kube, node, FAULTS, taint_effect=effect, xidQuietS=8,
                          minPatchIntervalS=0))  # fmt: skip
    names = {named(i) for i in range(4)}
    st.timer.wait("the slice's four devices", lambda: set(devices(kube, node)) == names)
    kube.kubectl("create", "namespace", WORK)
    tolerate = [{"key": TAINT, "operator": "Exists", "effect": effect}]
    apply(kube, claim("gpu-2", claim_spec(WHOLE, f'device.attributes["{DRIVER}"].index == 2',
                                          tolerations=tolerate)),
          pod("on-gpu-2", claim_name="gpu-2"),
          claim("gpu-1", claim_spec(WHOLE, f'device.attributes["{DRIVER}"].index == 1')),
          pod("on-gpu-1", claim_name="gpu-1", finalizers=[HOLD]))  # fmt: skip
    #: (seconds since the slice showed, the devices' taints) at each change seen
    seen: list[tuple[float, dict[str, set[tuple[str, str, str]]]]] = []
    #: (seconds, [(health, message)] of the pod's device) at each change seen, once it runs
    health: list[tuple[float, list[tuple[str, str]]]] = []
    #: the GPU 1 pod: when its claim was first seen allocated, it first ran, it was deleted
    gpu1: dict[str, float] = {}
    start = time.monotonic()
    faults = {named(1): "remap-pending", named(2): "xid-79"}

    def when(dev: str, value: str) -> tuple[float | None, float | None]:
        """When the taint was first seen, and when the device was first clean after that."""
        on = next((t for t, s in seen if (TAINT, value, effect) in s.get(dev, set())), None)
        off = None if on is None else next(
            (t for t, s in seen if t > on and dev in s and not s[dev]), None)
        return on, off

    def tainted_spans(dev: str) -> list[tuple[float, float]]:
        """(first seen tainted, first seen without it after, or +inf) of each of ``dev``'s
        taints that evict (``effect``: the health rules' taints; ``nvml-unreadable`` is always
        NoSchedule)."""
        out: list[tuple[float, float]] = []
        on: float | None = None
        for t, s in seen:
            evicting = dev in s and any(x[2] == effect for x in s[dev])
            if evicting and on is None:
                on = t
            elif dev in s and not evicting and on is not None:
                out.append((on, t))
                on = None
        return out + ([(on, float("inf"))] if on is not None else [])

    def pod_health_went_and_came_back() -> bool:
        states = [h for _, h in health]
        bad = next((i for i, h in enumerate(states) if ("Unhealthy", "xid-79") in h), None)
        return bad is not None and any(h == [("Healthy", "")] for h in states[bad + 1:])

    def probe() -> bool:
        now = {n: taints(d) for n, d in devices(kube, node).items()}
        t = time.monotonic() - start
        if not seen or seen[-1][1] != now:
            seen.append((t, now))
        p = get(kube, "-n", WORK, "pod", "on-gpu-2") or {}
        statuses = (p.get("status") or {}).get("containerStatuses") or []
        h = [(r.get("health", ""), r.get("message", "")) for c in statuses
             for s in c.get("allocatedResourcesStatus") or [] for r in s.get("resources") or []]
        if h and (not health or health[-1][1] != h):
            health.append((t, h))
        if "allocated" not in gpu1 and device_of(kube, "gpu-1") == named(1):
            gpu1["allocated"] = t
        p1 = get(kube, "-n", WORK, "pod", "on-gpu-1") or {}
        if "ran" not in gpu1 and running(p1):
            gpu1["ran"] = t
        if "deleted" not in gpu1 and (p1.get("metadata") or {}).get("deletionTimestamp"):
            gpu1["deleted"] = t
        return (all(when(dev, value)[1] is not None for dev, value in faults.items())
                and (pod_health_went_and_came_back() or not POD_HEALTH) and "deleted" in gpu1)

    # a loop is 40 s: each fault and its recovery come within one loop and a half of any moment
    # (two loops when a pod's claim could not have its GPU before its first fault)
    def report() -> None:
        """What was seen, printed after the wait, and before its failure (what did not come)."""
        for t, state in seen:
            print(f"[dra faults] +{t:5.1f} s " + ", ".join(
                f"{n}: {'/'.join(v for _, v, _ in sorted(ts)) or '-'}" for n, ts in sorted(state.items())))
        for dev, value in faults.items():
            on, off = when(dev, value)
            at = ["never" if x is None else f"+{x:.1f} s" for x in (on, off)]
            print(f"[dra faults] {dev} {value}:{effect}: tainted at {at[0]}, cleared at {at[1]}")
        for t, h in health:
            print(f"[dra faults] +{t:5.1f} s the GPU 2 pod's device: {h}")
        print("[dra faults] the GPU 1 pod: " + ", ".join(f"{k} at +{v:.1f} s" for k, v in gpu1.items()))

    try:
        st.timer.wait("GPUs 1 and 2 tainted and cleared, the GPU 1 pod evicted, the GPU 2 pod's "
                      "device Unhealthy and back", probe, timeout=150)  # fmt: skip
    finally:
        report()
    gpu0 = {v for _, s in seen for _, v, _ in s.get(named(0), set())}
    assert gpu0 <= {"nvml-unreadable"}, seen
    # the health rules' taints evict (NoExecute); NVML unreadable (the trace's driver-gone
    # phase) says nothing of the GPUs: NoSchedule only, no pod evicted for it
    assert {e for _, s in seen for ts in s.values() for _, v, e in ts if v != "nvml-unreadable"} == {effect}, seen
    assert {e for _, s in seen for ts in s.values() for _, v, e in ts if v == "nvml-unreadable"} <= {"NoSchedule"}, seen

    # the tolerating side: GPU 2's pod ran through its taint, never restarted
    if TOLERATED:
        (res2,) = results(kube, "gpu-2")
        assert res2["device"] == named(2), res2
        assert [(x.get("key"), x.get("operator"), x.get("effect")) for x in res2.get("tolerations") or []] == [
            (TAINT, "Exists", effect)], res2  # fmt: skip
        assert [(c[1], c[2]) for c in containers(kube, "on-gpu-2")] == [(0, True)]  # not evicted

    # the other side: GPU 1's pod, deleted by the eviction controller while GPU 1 was tainted
    deleted = gpu1["deleted"]
    assert "allocated" in gpu1 and gpu1["allocated"] <= deleted, gpu1
    spans = tainted_spans(named(1))
    # the poll reads the slice before the pod: an eviction may be seen a poll before its taint
    assert any(on - 1.5 <= deleted <= off for on, off in spans), (gpu1, spans, seen)
    assert {v for _, s in seen for _, v, _ in s.get(named(1), set())} <= {"remap-pending", "nvml-unreadable"}, seen
    p1 = get(kube, "-n", WORK, "pod", "on-gpu-1")
    assert p1 is not None and p1["metadata"].get("deletionTimestamp"), p1
    cond = [c for c in p1["status"].get("conditions") or [] if c["type"] == "DisruptionTarget"]
    assert [(c["status"], c.get("reason")) for c in cond] == [("True", "DeletionByDeviceTaintManager")], cond
    print(f"[dra faults] the GPU 1 pod's condition: {cond[0]['type']}={cond[0]['status']} "
          f"{cond[0]['reason']}: {cond[0].get('message')}")

    def eviction_event() -> dict[str, Any] | None:
        evs = (get(kube, "-n", WORK, "events", "--field-selector",
                   "involvedObject.kind=Pod,involvedObject.name=on-gpu-1") or {}).get("items", [])
        return next((e for e in evs if e.get("reason") == "DeviceTaintManagerEviction"
                     and e["involvedObject"].get("uid") == p1["metadata"]["uid"]), None)  # fmt: skip

    ev = st.timer.wait("the GPU 1 pod's eviction Event", eviction_event, timeout=30)
    print(f"[dra faults] the GPU 1 pod's Event: {ev['type']} {ev['reason']} from "
          f"{(ev.get('source') or {}).get('component') or ev.get('reportingComponent')}: {ev.get('message')}")
    assert ev["type"] == "Normal", ev
    st.timer.wait("the evicted pod's container stopped", lambda: (
        (cs := containers(kube, "on-gpu-1")) and not any(c[2] for c in cs)), timeout=30)  # fmt: skip
    st.release("on-gpu-1")
    st.timer.wait("the evicted pod gone", lambda: get(kube, "-n", WORK, "pod", "on-gpu-1") is None,
                  timeout=30)  # fmt: skip
    st.delete_work()
    st.uninstall()
    assert slices(kube) == [], slices(kube)


# -- a-c, e, f, g: claims on the multi-GPU trace ------------------------------------------------


def test_claims_get_the_gpus_they_select_share_by_memory_and_survive_a_kubelet_restart(stack):
    st, tmp = stack
    kube, node, timer = st.kube, st.node, st.timer
    assert not our_cdi_specs(kube.cluster.cdi_dir), our_cdi_specs(kube.cluster.cdi_dir)
    # docs/install.md's DRA goal, then this cluster's own values (the dev kubelet's folders)
    st.install(dra_values(tmp, kube, node, MULTI, sharing={"gpus": "0-1"}), goal=DRA_GOAL)

    # --- the slice: eight GPUs, 0 and 1 shared by 1 GiB units, free memory as the trace's
    names = {named(i) for i in range(8)}
    timer.wait("the slice's eight devices", lambda: set(devices(kube, node)) == names)
    # a shared GPU is tainted until its MPS daemon is up (nothing would enforce a slice)
    devs = timer.wait("no device tainted (the MPS daemons up)", lambda: (
        (d := devices(kube, node)) and not any(taints(x) for x in d.values()) and d))  # fmt: skip
    assert timer.wait("the plugin's registration socket", st.reg_sock.is_socket)
    for i in range(8):
        d = devs[named(i)]
        assert attr(d, "index") == i and attr(d, "uuid") == uuid(i) and attr(d, "type") == "gpu", d
        assert attr(d, "shared") is (i in SHARED), d
        assert bool(d.get("allowMultipleAllocations")) is (i in SHARED), d
    free = {i: attr(devs[named(i)], "freeMemoryMiB") for i in range(8)}
    print(f"[dra] freeMemoryMiB: {free}")
    assert {i: free[i] for i in range(8) if i not in SHARED} == {
        i: m for i, m in FREE_MIB.items() if i not in SHARED}, free
    policy = devs[named(0)]["capacity"]["memory"].get("requestPolicy") or {}
    assert policy.get("validRange", {}).get("step") in ("1Gi", "1024Mi"), policy
    kube.kubectl("create", "namespace", WORK)

    # --- a. one whole GPU, pinned to GPU 4, seen through CDI
    start = time.monotonic()
    apply(kube, claim("gpu-4", claim_spec(WHOLE, f'device.attributes["{DRIVER}"].index == 4')),
          pod("whole", claim_name="gpu-4"))
    got = timer.wait("a: the GPU 4 pod running and printed", lambda: printed(kube, "whole"))
    timer.took("a: claim + pod applied to printed", start)
    assert device_of(kube, "gpu-4") == named(4)
    assert got["VISIBLE"] == uuid(4), got
    chr_nodes = got["CHR"].split()
    assert "nvidia4" in chr_nodes and "nvidiactl" in chr_nodes, got
    assert [n for n in chr_nodes if re.fullmatch(r"nvidia\d+", n)] == ["nvidia4"], got
    (ls4,) = [x for x in got["LS"].split(";") if x.endswith("/dev/nvidia4")]
    assert ls4.startswith("c") and re.search(r"\b195,\s*4\b", ls4), got  # 195:4
    specs = our_cdi_specs(kube.cluster.cdi_dir)
    assert len(specs) == 1, specs
    whole = printed(kube, "whole")
    # the agent names the pod holding GPU 4 (the kubelet's PodResources lists DRA devices)
    timer.wait("a: the telemetry naming the GPU 4 pod its holder",
               lambda: telemetry_holders(kube, node).get((WORK, "whole")) == {4})

    # --- a'. a claim the driver cannot prepare (a bad opaque config of ours), pinned to GPU 7
    # (nobody else's): allocated, never started, the refusal in the pod's events, nothing kept
    start = time.monotonic()
    apply(kube, claim("bogus", claim_spec(WHOLE, f'device.attributes["{DRIVER}"].index == 7',
                                          config={"apiVersion": f"{DRIVER}/v1alpha1", "kind": "Bogus"})),
          pod("bogus", claim_name="bogus"))  # fmt: skip
    event = timer.wait("a': the bogus claim's FailedPrepareDynamicResources event",
                       lambda: prepare_failure(kube, "bogus"))  # fmt: skip
    timer.took("a': applied to the kubelet's event", start)
    print(f"[dra] a': {event['type']} {event['reason']} (x{event.get('count', 1)}): {event['message']}")
    assert event["type"] == "Warning", event
    assert re.search(r"NodePrepareResources failed for ResourceClaim bogus: status\.allocation\.devices"
                     r"\.config\[\d+\]\.opaque\.parameters\.kind: expected GpuConfig; got 'Bogus'",
                     event["message"]), event  # fmt: skip
    assert device_of(kube, "bogus") == named(7)  # the scheduler allocated it
    bogus = get(kube, "-n", WORK, "pod", "bogus")
    assert bogus["spec"].get("nodeName") == node and not running(bogus), bogus
    assert not any(c[0] for c in containers(kube, "bogus")), containers(kube, "bogus")  # none made
    uid = get(kube, "-n", WORK, "resourceclaim", "bogus")["metadata"]["uid"]
    whole_uid = get(kube, "-n", WORK, "resourceclaim", "gpu-4")["metadata"]["uid"]
    cdi_files = [f.name for f in sorted(kube.cluster.cdi_dir.iterdir())]
    assert not [f for f in cdi_files if uid in f], cdi_files
    assert any(whole_uid in f for f in cdi_files), cdi_files  # the prepared claim's is there
    held = checkpointed(st.plugins)
    assert uid not in held and whole_uid in held, held
    print(f"[dra] a': claim {uid}: no CDI spec in {len(cdi_files)} file(s), not among the "
          f"checkpoint's {len(held)} claim(s)")
    start = time.monotonic()
    kube.kubectl("-n", WORK, "delete", "pod", "bogus", "--wait=true", "--timeout=60s")
    kube.kubectl("-n", WORK, "delete", "resourceclaim", "bogus", "--wait=true", "--timeout=60s")
    timer.took("a': the bogus pod and claim deleted", start)
    assert not [f for f in kube.cluster.cdi_dir.iterdir() if uid in f.name]
    assert uid not in checkpointed(st.plugins)

    # --- b. free memory >= 60 GiB: GPUs 2 and 6 (4 is taken, 0 shared), the third pending
    roomy = claim_spec(WHOLE, f'device.attributes["{DRIVER}"].freeMemoryMiB >= 61440')
    start = time.monotonic()
    apply(kube, template("roomy", roomy), *(pod(f"roomy-{k}", template_name="roomy") for k in (1, 2, 3)))

    def two_run_one_waits() -> Any:
        got = {k: printed(kube, f"roomy-{k}") for k in (1, 2, 3)}
        reasons = {k: pending_reason(kube, f"roomy-{k}") for k in (1, 2, 3)}
        ran = {k: v for k, v in got.items() if v}
        waiting = [k for k, r in reasons.items() if r]
        return len(ran) == 2 and len(waiting) == 1 and (ran, reasons[waiting[0]], waiting[0])

    ran, reason, left = timer.wait("b: two roomy pods running, one Unschedulable", two_run_one_waits)
    timer.took("b: applied to two running and one pending", start)
    placed = {k: device_of(kube, pod_claim(kube, f"roomy-{k}") or "") for k in ran}
    assert sorted(placed.values()) == sorted([named(2), named(6)]), placed
    for k, got in ran.items():
        assert got["VISIBLE"] == uuid(index_of(placed[k])), (k, got)
    print(f"[dra] b: roomy-{left} pending: {reason}")
    assert "cannot allocate all claims" in reason, reason
    assert not results(kube, pod_claim(kube, f"roomy-{left}") or "-"), "the third claim allocated"

    # --- c. two 20 GiB slices share one shared GPU, each its MPS client at 20480M (the
    # scheduler's allocator tries a slice's devices in order: the second fits beside the first)
    start = time.monotonic()
    apply(kube, template("share-20", claim_spec(SHARED_CLASS, memory="20Gi")),
          pod("share-1", template_name="share-20"), pod("share-2", template_name="share-20"))
    shares = timer.wait("c: two 20 GiB pods running and printed", lambda: (
        (a := printed(kube, "share-1")) and (b := printed(kube, "share-2")) and (a, b)))  # fmt: skip
    timer.took("c: applied to both printed", start)
    allocs = [results(kube, pod_claim(kube, f"share-{k}") or "")[0] for k in (1, 2)]
    assert allocs[0]["device"] == allocs[1]["device"], allocs
    dev = allocs[0]["device"]
    gpu = index_of(dev)
    assert gpu in SHARED, allocs
    assert [a.get("consumedCapacity", {}).get("memory") for a in allocs] == ["20Gi", "20Gi"], allocs
    assert allocs[0].get("shareID") and allocs[0].get("shareID") != allocs[1].get("shareID"), allocs
    for k, got in zip((1, 2), shares, strict=True):
        assert got["VISIBLE"] == uuid(gpu), got
        assert got["MPS_LIMIT"].rsplit("=", 1)[-1] == "20480M", got
        # each claim the client of an MPS daemon of its own (issue 47), named by claim and device
        claim_uid = (get(kube, "-n", WORK, "resourceclaim", pod_claim(kube, f"share-{k}") or "")
                     or {})["metadata"]["uid"]  # fmt: skip
        sid = claim_slice_id(claim_uid, dev)
        assert got["PIPE"] == str(MPS_ROOT / "slices" / sid / "pipe"), got
    print(f"[dra] c: both on {dev}; MPS limits {[g['MPS_LIMIT'] for g in shares]}")
    # what is left: on that GPU its capacity less 40 GiB; on the other its whole capacity
    caps = {i: devs[named(i)]["capacity"]["memory"]["value"] for i in SHARED}
    cap_gib = {i: mib_of(v) // GIB for i, v in caps.items()}
    left_gib = {i: cap_gib[i] - (40 if i == gpu else 0) for i in SHARED}
    pinned = claim_spec(SHARED_CLASS, f'device.attributes["{DRIVER}"].uuid == "{uuid(gpu)}"',
                        memory=f"{left_gib[gpu] + 1}Gi")
    anywhere = claim_spec(SHARED_CLASS, memory=f"{max(left_gib.values()) + 1}Gi")
    start = time.monotonic()
    apply(kube, claim("too-big-here", pinned), pod("too-big-here", claim_name="too-big-here"),
          claim("too-big", anywhere), pod("too-big", claim_name="too-big"))
    reasons = timer.wait("c: the too-large claims Unschedulable", lambda: (
        (a := pending_reason(kube, "too-big-here")) and (b := pending_reason(kube, "too-big"))
        and (a, b)))  # fmt: skip
    timer.took("c: too-large applied to pending", start)
    print(f"[dra] c: left {left_gib} GiB; {left_gib[gpu] + 1} GiB on {dev}: {reasons[0]}; "
          f"{max(left_gib.values()) + 1} GiB anywhere: {reasons[1]}")
    assert all("cannot allocate all claims" in r for r in reasons), reasons
    assert not results(kube, "too-big-here") and not results(kube, "too-big")

    # --- e. a pod asking nvidia.com/gpu: 1, no claim: the scheduler makes one
    start = time.monotonic()
    apply(kube, pod("legacy", limits={"nvidia.com/gpu": "1"}))
    legacy = timer.wait("e: the nvidia.com/gpu pod running and printed", lambda: printed(kube, "legacy"))
    timer.took("e: applied to printed", start)
    ext = (get(kube, "-n", WORK, "pod", "legacy") or {})["status"].get("extendedResourceClaimStatus") or {}
    assert ext.get("resourceClaimName"), ext
    assert [m.get("resourceName") for m in ext.get("requestMappings") or []] == ["nvidia.com/gpu"], ext
    (res,) = results(kube, ext["resourceClaimName"])
    assert res["driver"] == DRIVER and res["pool"] == node, res
    gpu_e = index_of(res["device"])
    assert gpu_e not in (*SHARED, 2, 4, 6), res  # a whole GPU nobody holds
    assert legacy["VISIBLE"] == uuid(gpu_e), legacy
    print(f"[dra] e: nvidia.com/gpu -> claim {ext['resourceClaimName']} on {res['device']}")

    # --- f. a kubelet restart: the plugin registers again, the running pods keep their GPUs
    holders = ["whole", *(f"roomy-{k}" for k in ran), "share-1", "share-2", "legacy"]
    before = {p: containers(kube, p) for p in holders}
    env_before = {p: printed(kube, p) for p in holders}
    specs_before = {p.name for p in our_cdi_specs(kube.cluster.cdi_dir)}
    assert len(specs_before) == len(holders), specs_before  # one per prepared claim
    claims_before = {p: pod_claim(kube, p) for p in holders}
    kubelet_pid = kube.cluster.pid("kubelet")
    start = time.monotonic()
    kube.cluster.restart_kubelet()
    timer.took("f: kubelet restarted (Node Ready)", start)
    assert kube.cluster.pid("kubelet") not in (None, kubelet_pid), "the kubelet did not restart"
    start = time.monotonic()
    apply(kube, claim("after", claim_spec(WHOLE)), pod("after", claim_name="after"))
    after = timer.wait("f: a new claim's pod running after the restart", lambda: printed(kube, "after"))
    timer.took("f: restart to the new pod printed", start)
    (res,) = results(kube, "after")
    assert after["VISIBLE"] == uuid(index_of(res["device"])), (after, res)
    for p in holders:
        assert containers(kube, p) == before[p], (p, before[p], containers(kube, p))
        reserved = (get(kube, "-n", WORK, "resourceclaim", claims_before[p] or "-") or {}).get(
            "status", {}).get("reservedFor") or []
        assert [r.get("name") for r in reserved] == [p], (p, reserved)
        assert all(c[2] and c[1] == 0 for c in before[p]), (p, before[p])
        assert printed(kube, p) == env_before[p], p
    assert specs_before <= {p.name for p in our_cdi_specs(kube.cluster.cdi_dir)}
    assert whole == env_before["whole"]

    # --- h. a reboot that lost a GPU (issue 48): the agent restarted on LOST (GPU 3 gone, GPUs
    # 4-7 renumbered 3-6). The claim on GPU 4 keeps its device and its UUID; a new claim of
    # index 3 or 4 gets GPU 5 (index 4 now): GPU 4 (index 3 now) keeps its name, allocated.
    # Before the fix (names gpu-<index>) gpu-3 was free and named GPU 4: the new claim was
    # prepared on the GPU the running pod holds. First the legacy and after pods go, so that
    # GPUs 3, 5 and 7 are free.
    start = time.monotonic()
    kube.kubectl("-n", WORK, "delete", "pod", "legacy", "after", "--wait=true", "--timeout=60s")
    kube.kubectl("-n", WORK, "delete", "resourceclaim", "after", "--wait=true", "--timeout=60s")
    timer.wait("h: the legacy and after claims' CDI specs gone", lambda: len(
        our_cdi_specs(kube.cluster.cdi_dir)) == len(holders) - 1, timeout=60)  # fmt: skip
    agent = kube.pods()
    # --wait=legacy: the mps DaemonSet (OnDelete) keeps its pod, which kstatus never calls ready
    kube.helm("upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values", "--set",
              f"trace={LOST}", "--wait=legacy", "--timeout", "180s")  # fmt: skip
    timer.took("h: helm upgrade to the lost-GPU trace", start)
    renamed = {named(i) for i in (0, 1, 2, 4, 5, 6, 7)}
    devs = timer.wait("h: the slice without GPU 3, GPU 4 at index 3", lambda: (
        (d := devices(kube, node)) and set(d) == renamed and attr(d[named(4)], "index") == 3
        and attr(d[named(5)], "index") == 4 and d), timeout=120)  # fmt: skip
    assert [p["metadata"]["uid"] for p in kube.pods()] != [p["metadata"]["uid"] for p in agent]
    assert {attr(devs[named(i)], "uuid") for i in (4, 5)} == {uuid(4), uuid(5)}
    whole_claim = get(kube, "-n", WORK, "resourceclaim", "gpu-4")
    assert device_of(kube, "gpu-4") == named(4)
    assert [d.get("uuid") for d in checkpointed(st.plugins)[whole_claim["metadata"]["uid"]]["devices"]] == [uuid(4)]
    start = time.monotonic()
    apply(kube, claim("reboot", claim_spec(WHOLE, f'device.attributes["{DRIVER}"].index == 3 || '
                                                  f'device.attributes["{DRIVER}"].index == 4')),
          pod("reboot", claim_name="reboot"))  # fmt: skip
    rebooted = timer.wait("h: the new claim's pod running after the reboot", lambda: printed(kube, "reboot"))
    timer.took("h: applied to printed", start)
    print(f"[dra] h: after the reboot: whole on {device_of(kube, 'gpu-4')}, the new claim on "
          f"{device_of(kube, 'reboot')} ({rebooted['VISIBLE']})")
    assert device_of(kube, "reboot") == named(5), results(kube, "reboot")
    assert rebooted["VISIBLE"] == uuid(5) != uuid(4), rebooted
    assert containers(kube, "whole") == before["whole"] and printed(kube, "whole") == whole

    # --- g. pods and claims deleted, then helm uninstall: nothing of ours left
    start = time.monotonic()
    st.delete_work()
    timer.wait("g: every claim's CDI spec removed", lambda: not our_cdi_specs(kube.cluster.cdi_dir),
               timeout=60)  # fmt: skip
    timer.took("g: namespace deleted to no CDI spec", start)
    st.uninstall()
    left = st.leftovers()
    assert left == {"resourceslices": [], "deviceclasses": [], "cdi specs": [], "sockets": []}, left
    # KNOWN FAULT (seen once in three runs, 2026-12-07): the MPS root and its parent were still
    # there once the mps pod was gone; printed until the supervisor's stop is fixed
    mps_left = [str(p) for p in (MPS_ROOT, MPS_ROOT.parent) if p.exists()]
    if mps_left:
        print(f"[dra] KNOWN FAULT: left after the uninstall: {mps_left}: "
              f"{sorted(str(p) for p in MPS_ROOT.parent.rglob('*'))}")


def mib_of(quantity: str) -> int:
    """MiB in a binary quantity (``80896Mi``, ``79Gi``)."""
    m = re.fullmatch(r"(\d+)(Mi|Gi|Ki|)", quantity)
    assert m, quantity
    n, unit = int(m.group(1)), m.group(2)
    return {"Mi": n, "Gi": n * 1024, "Ki": n // 1024, "": n // (1024 * 1024)}[unit]

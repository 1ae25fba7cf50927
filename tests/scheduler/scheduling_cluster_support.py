"""What other test files share of test_scheduling_cluster.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.devcluster import DevCluster
from tests.helpers import H100_TRACE, free_port
from tests.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]


EXAMPLES = REPO / "examples" / "scheduler"


MIB = 1024 * 1024


TTL_S, GRACE_S = 4.0, 1.0


def write_trace(path: Path, free_mib: int, *, unhealthy: bool = False) -> Path:
    """A two-sample trace of one H100 with ``free_mib`` free (and an ECC error if unhealthy)."""
    base = json.loads(H100_TRACE.read_text())
    sample = base["samples"][0]
    g = copy.deepcopy(sample["gpus"][0])
    total = g["memory_bytes"]["total"]
    free = free_mib * MIB
    g["memory_bytes"].update(free=free, used=total - free)
    if "memory_v2_bytes" in g:
        g["memory_v2_bytes"].update(free=free, used=total - free - g["memory_v2_bytes"]["reserved"])
    if unhealthy:
        g["ecc_uncorrected_volatile"] = 1
    base["samples"] = [{"t": 0.0, "gpus": [g]}, {"t": 1.0, "gpus": [copy.deepcopy(g)]}]
    base["phases"] = [{"t": 0.0, "phase": "steady"}]
    path.write_text(json.dumps(base))
    return path


@pytest.fixture(scope="module")
def api(scheduling_cluster: DevCluster, admin_api: Any) -> Any:
    """conftest's admin client, once the cluster runs kube-scheduler."""
    return admin_api


def schedulable(api: Any, name: str) -> None:
    """What a kubelet and the node lifecycle controller would do: Ready, capacity, no taint."""
    api.patch_node(name, {"spec": {"taints": None}})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    api.patch_node_status(
        name,
        {
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "test",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
            }
        },
    )


class Agents:
    """``omaticaya run`` processes, one per Node, replaying one-GPU traces."""

    def __init__(self, cluster: DevCluster, tmp: Path) -> None:
        self.cluster, self.tmp = cluster, tmp
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, node: str, free_mib: int, *, unhealthy: bool = False) -> None:
        trace = write_trace(self.tmp / f"{node}.json", free_mib, unhealthy=unhealthy)
        env = dict(
            self.cluster.env(),
            OMATICAYA_METRICS_PORT="0",
            OMATICAYA_HEARTBEAT_S="1",
            OMATICAYA_CLEANUP_ON_EXIT="true",
        )
        with open(self.tmp / f"{node}.log", "ab") as log:
            self.procs[node] = subprocess.Popen(
                [sys.executable, "-m", "omaticaya_py", "run", "--node", node, "--trace",
                 str(trace), "--schedule", "@every 1s"],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
            )  # fmt: skip

    def kill(self, node: str) -> None:
        """SIGKILL: the agent dies without cleaning up; its labels stay, ``read_at`` freezes."""
        proc = self.procs.pop(node)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()


def load_pod(path: Path, name: str, **changes: Any) -> dict[str, Any]:
    """An example pod, renamed, with ``changes`` (annotations merged, spec keys replaced). The
    Nodes here are written through the API, with no kubelet and no device plugin: a container's
    ``nvidia.com/gpu`` limit (pod-extender.yaml's whole GPU) would fit none of them, so each
    container keeps its image and loses its resources; the extender decides on the annotation.
    tests/project/test_product_install.py applies the examples as written on a kubelet."""
    pod = yaml.safe_load(path.read_text())
    pod["metadata"]["name"] = name
    for container in pod["spec"]["containers"]:
        container.pop("resources", None)
    for key, value in changes.items():
        if key == "annotations":
            pod["metadata"].setdefault("annotations", {}).update(value)
        else:
            pod["spec"][key] = value
    return pod


def bound_node(api: Any, ns: str, pod: str, timeout_s: float = 20) -> str:
    return wait_for(
        f"pod {pod} to be bound",
        lambda: api.read_namespaced_pod(pod, ns).spec.node_name,
        timeout_s,
    )


def unschedulable_message(api: Any, ns: str, pod: str, timeout_s: float = 20) -> str:
    def check() -> str | None:
        p = api.read_namespaced_pod(pod, ns)
        assert not p.spec.node_name, f"{pod} was bound to {p.spec.node_name}"
        for c in p.status.conditions or []:
            if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
                return c.message
        return None

    return wait_for(f"pod {pod} to be Unschedulable", check, timeout_s)


#: what kube-scheduler logs once it has read its configuration and starts (it serves nothing
#: here: ``spawn_scheduler`` turns the secure port off, and from v1beta3 /healthz has no address
#: of its own)
SCHEDULER_STARTED = "Starting Kubernetes Scheduler"


def scheduler_config(examples: Path = EXAMPLES) -> dict[str, Any]:
    """The example KubeSchedulerConfiguration the dev cluster's kube-scheduler reads,
    ``scheduler-config-v1.yaml`` (``kubescheduler.config.k8s.io/v1``, 1.25 and later: every
    release the dev cluster runs). Its ``extenders`` entry is the chart's (tests/scheduler/test_extender.py).
    ``examples``: the folder it is read from (bench/burst.py reads another rev's)."""
    return yaml.safe_load((examples / "scheduler-config-v1.yaml").read_text())


class ExtenderScheduler:
    """An in-process ``omaticaya extender`` (real HTTP on 127.0.0.1, real Node cache) and a
    kube-scheduler from the example configuration of its release (``scheduler_config``) that
    calls it."""

    def __init__(
        self, cluster: DevCluster, tmp: Path, name: str, strategy: str, settle_s: float = 0.0,
        signal: str = "now", serve_kw: dict[str, Any] | None = None,
        plugins: dict[str, Any] | None = None,
    ) -> None:
        from omaticaya_py.scheduler import ExtenderSettings
        from omaticaya_py.scheduler.server import serve

        port = free_port()
        settings = ExtenderSettings(
            address="127.0.0.1",
            port=port,
            placement_policy=strategy,
            ttl_s=TTL_S,
            grace_s=GRACE_S,
            kubeconfig=str(cluster.kubeconfig),
            # these tests place one pod at a time and read the result: no in-flight accounting
            # unless asked (tests/scheduler/test_placement_cluster.py's bursts ask for it)
            settle_s=settle_s,
            signal=signal,
        )
        self.ready, self.stop_event = threading.Event(), threading.Event()
        self.thread = threading.Thread(
            target=serve, args=(settings,),
            kwargs={"ready": self.ready, "stop": self.stop_event, **(serve_kw or {})},
            daemon=True,
        )  # fmt: skip
        self.thread.start()
        assert self.ready.wait(15), "extender did not start"
        config = scheduler_config()
        config["clientConnection"]["kubeconfig"] = str(cluster.kubeconfig)
        config["leaderElection"] = {"leaderElect": False}
        config["profiles"][0]["schedulerName"] = name
        if plugins is not None:  # e.g. {"postFilter": {"disabled": [{"name": "*"}]}}
            config["profiles"][0]["plugins"] = plugins
        self.url = config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{port}"
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        self.log = tmp / f"{name}.log"
        self.proc = cluster.spawn_scheduler(path, self.log)
        self.name = name

        def started() -> bool:
            if self.proc.poll() is not None:
                tail = "\n".join(self.log.read_text().splitlines()[-5:])
                raise AssertionError(f"kube-scheduler {name} exited {self.proc.returncode}: {tail}")
            return SCHEDULER_STARTED in self.log.read_text()

        wait_for(f"kube-scheduler {name} to start", started, 20)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.stop_event.set()
        self.thread.join(10)


def gpu_pod(name: str, scheduler: str, mib: int = 30720, count: int | None = None) -> dict:
    annotations = {"omaticaya.io/gpu-memory-mib": str(mib)}
    if count is not None:
        annotations["omaticaya.io/gpu-count"] = str(count)
    return load_pod(
        EXAMPLES / "pod-extender.yaml", name, schedulerName=scheduler, annotations=annotations
    )

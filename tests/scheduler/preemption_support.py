"""What other test files share of test_preemption.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from omaticaya_py.core.publish.render import render
from omaticaya_py.core.publish.render_telemetry import telemetry_annotation
from omaticaya_py.core.rules.attribution import ContainerDevices, GpuAttribution, PodMemory
from omaticaya_py.core.rules.health import assess
from omaticaya_py.core.schema import parse_node
from omaticaya_py.scheduler import Extender, ExtenderSettings
from omaticaya_py.scheduler.need import Need
from omaticaya_py.scheduler.preempt import Candidate, node_view
from omaticaya_py.scheduler.victims import (
    PodOnNode,
)
from tests.helpers import H100_TOTAL_MIB, PREFIX, READ_AT, gpu, settings, snapshot

NOW = READ_AT.timestamp() + 5

if TYPE_CHECKING:
    from omaticaya_py.scheduler.deadline import Deadline


GIB = 1024


NEED = Need(60 * GIB)  # 61440 MiB on one GPU


#: one GPU: (free MiB, holders as (namespace/name, MiB or None: not known))
Gpu = tuple[int, Sequence[tuple[str, int | None]]]


def holder_books(
    i: int, uuid: str, holders: Sequence[tuple[str, int | None]]
) -> tuple[list[ContainerDevices], list[PodMemory], list[int]]:
    """GPU ``i``'s holders (``("ns/pod", MiB or None)``) as the agent's books: the kubelet's
    device per holder (container ``main``), the memory of each known one (PID ``1000*i+n``),
    the PIDs whose memory could not be placed."""
    devices, pods, unknown = [], [], []
    for n, (key, mib) in enumerate(holders):
        ns, pod = key.split("/")
        devices.append(ContainerDevices(ns, pod, "main", "nvidia.com/gpu", (uuid,)))
        if mib is None:
            unknown.append(1000 * i + n)
        else:
            pods.append(PodMemory(f"uid-{pod}", None, ns, pod, "main", mib, (1000 * i + n,)))
    return devices, pods, unknown


def gpu_node(
    name: str,
    gpus: Sequence[Gpu],
    *,
    read_at: datetime = READ_AT,
    refresh_s: float | None = None,
    total_mib: int = H100_TOTAL_MIB,
    unhealthy: Sequence[int] = (),
) -> dict[str, Any]:
    """A v1.Node document as an agent writes it: labels and telemetry rendered by core from a
    snapshot of these GPUs, each with the pods the kubelet gave it (one holder with a known
    memory figure: its processes'; ``None``: processes that could not be placed)."""
    readings, attribution = [], {}
    for i, (free, holders) in enumerate(gpus):
        g = gpu(
            i, memory_free_mib=free, memory_total_mib=total_mib,
            memory_used_mib=total_mib - free, process_count=len(holders),
            ecc_uncorrected_volatile=1 if i in unhealthy else 0,
        )  # fmt: skip
        devices, pods, unknown = holder_books(i, g.uuid, holders)
        attribution[g.uuid] = GpuAttribution(
            g.uuid, tuple(devices), tuple(pods), unknown_pids=tuple(unknown)
        )
        readings.append(g)
    snap = snapshot(*readings, read_at=read_at)
    health = assess(snap)
    labels = render(snap, health, settings(), with_telemetry=False).labels
    annotations, _ = telemetry_annotation(
        snap, health, PREFIX, refresh_s=refresh_s, attribution=attribution
    )
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations}}


def pod_doc(key: str, priority: int | None = 0, *, node: str = "", started: int = 0, **meta: Any) -> dict:
    """A v1.Pod document bound to ``node`` (``uid-<name>``; ``started``: seconds after READ_AT)."""
    ns, name = key.split("/")
    start = datetime.fromtimestamp(READ_AT.timestamp() - 600 + started, timezone.utc)
    spec: dict[str, Any] = {"nodeName": node}
    if priority is not None:
        spec["priority"] = priority
    return {
        "metadata": {"uid": f"uid-{name}", "namespace": ns, "name": name, **meta},
        "spec": spec,
        "status": {"phase": "Running", "startTime": start.strftime("%Y-%m-%dT%H:%M:%SZ")},
    }


def gpu_pod(mib: int = NEED.memory_mib, priority: int = 1000, count: int = 1) -> dict:
    return {
        "metadata": {
            "uid": "uid-preemptor", "namespace": "ml", "name": "preemptor",
            "annotations": {f"{PREFIX}/gpu-memory-mib": str(mib), f"{PREFIX}/gpu-count": str(count)},
        },
        "spec": {"priority": priority},
    }  # fmt: skip


def pods(*spec: tuple[str, int]) -> list[PodOnNode]:
    return [PodOnNode(f"uid-{k.split('/')[1]}", k, p) for k, p in spec]


#: three full nodes of low-priority pods: on "fits" one pod's memory makes room on its GPU; on
#: "small" the GPU is 40 GiB (nothing there can make 60 GiB); on "shared" the GPU's holders'
#: memory is unknown (two holders): evicting them is not known to free anything
NODES = {
    "fits": gpu_node("fits", [(10_000, [("low/a", 70_000)]), (1_000, [("low/b", 80_000)])]),
    "small": gpu_node("small", [(1_000, [("low/c", 39_000)])], total_mib=40_960),
    "shared": gpu_node("shared", [(1_000, [("low/d", None), ("low/e", None)])]),
    "sick": gpu_node("sick", [(1_000, [("low/f", 80_000)])], unhealthy=[0]),
}


ON_NODE = {
    "fits": [pod_doc("low/a", node="fits"), pod_doc("low/b", node="fits", started=5),
             pod_doc("low/idle", node="fits")],
    "small": [pod_doc("low/c", node="small")],
    "shared": [pod_doc("low/d", node="shared"), pod_doc("low/e", node="shared")],
    "sick": [pod_doc("low/f", node="sick")],
}  # fmt: skip


def extender(**kw: Any) -> Extender:
    cache = {
        n: parse_node(n, d["metadata"]["labels"], d["metadata"]["annotations"], PREFIX)
        for n, d in NODES.items()
    }
    s = ExtenderSettings(_env_file=None, **kw)  # type: ignore[call-arg]
    return Extender(s, cache.get, clock=lambda: NOW)


def reader(read: list[str] | None = None, bad: dict[str, Any] | None = None):
    def read_node(node: str, deadline: Deadline | None = None) -> Candidate:
        if read is not None:
            read.append(node)
        if node not in NODES:
            raise OSError("connection refused")
        items = [*ON_NODE[node], *((bad or {}).get(node, ()))]
        return node_view(NODES[node], {"items": items}, PREFIX)

    return read_node


def meta_args(pod: Any, **victims: Sequence[str]) -> dict[str, Any]:
    return {
        "Pod": pod,
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {
            n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0}
            for n, uids in victims.items()
        },
    }


def kept(result: dict[str, Any]) -> dict[str, list[str]]:
    return {n: [p["UID"] for p in v["Pods"]] for n, v in result["NodeNameToMetaVictims"].items()}

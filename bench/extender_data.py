"""The extender bench's synthetic cluster: Nodes as the agent labels them (``core.publish.render`` and
its telemetry annotation), the pod kube-scheduler sends, and a pod cache stand-in for
``scheduler.placements.InFlight``."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from bench.common import bench_settings, load_raw, replicate, write_trace

__all__ = ["POD_MIB", "POD_UID", "PodCacheStub", "node_docs", "pod_doc"]

POD_MIB = 30720
POD_UID = "0f6f9a52-bench-pod"


def node_docs(n: int, now: float, seed: int = 7) -> list[dict[str, Any]]:
    """``n`` Nodes as the agent labels them: 8 H100s each (the recorded trace's first sample),
    random free memory per GPU, 1 in 20 nodes with a failed GPU 0, read 0-60 s before ``now``,
    telemetry promising a rewrite within 330 s (heartbeat 300 s + schedule)."""
    from omaticaya_py.core.publish.render import render
    from omaticaya_py.core.publish.render_telemetry import telemetry_annotation
    from omaticaya_py.core.rules.health import assess
    from omaticaya_py.sources.replay import TraceReader

    base = TraceReader(write_trace(replicate(load_raw(), 8), "extender-8gpu"), loop=True).read()
    settings = bench_settings(node_name="bench")
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        name = f"gpu-node-{i:05d}"
        broken = rng.random() < 0.05
        gpus = []
        for g in base.gpus:
            total = g.memory_total_mib or 81559
            free = rng.randrange(0, total + 1)
            gpus.append(replace(
                g, memory_free_mib=free, memory_used_mib=total - free,
                uuid=f"GPU-{i:08d}-0000-0000-0000-{g.index:012d}",
                remapped_rows_failure=broken and g.index == 0,
            ))  # fmt: skip
        read_at = datetime.fromtimestamp(now - rng.uniform(0, 60), timezone.utc)
        snap = replace(base, gpus=tuple(gpus), read_at=read_at)
        health = assess(snap)
        labels = dict(render(snap, health, settings, with_telemetry=False).labels)
        labels["kubernetes.io/hostname"] = name
        annotations, _ = telemetry_annotation(snap, health, settings.prefix, refresh_s=330)
        docs.append({"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": name, "labels": labels, "annotations": annotations},
                     "status": {"capacity": {"cpu": "128", "memory": "2Ti", "pods": "110"}}})  # fmt: skip
    return docs


class PodCacheStub:
    """What ``InFlight`` reads of ``kube.PodCache``: ``version``, ``snapshot()``, ``len()``."""

    def __init__(self, placements: dict[str, Any]) -> None:
        self.placements, self.version = placements, 1

    def snapshot(self) -> dict[str, Any]:
        return dict(self.placements)

    def __len__(self) -> int:
        return len(self.placements)


def pod_doc(prefix: str) -> dict[str, Any]:
    """The pod as kube-scheduler sends it (a small but complete v1.Pod)."""
    return {"metadata": {"name": "train-0", "namespace": "default", "uid": POD_UID,
                         "annotations": {f"{prefix}/gpu-memory-mib": str(POD_MIB)}},
            "spec": {"schedulerName": "omaticaya-scheduler", "containers": [
                {"name": "main", "image": "registry.local/train:1",
                 "resources": {"requests": {"cpu": "4", "memory": "32Gi"}}}]},
            "status": {"phase": "Pending"}}  # fmt: skip

"""What other test files share of test_slices_cluster.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from tests.helpers import gpu, settings, snapshot
from tests.scheduler.placement_cluster_support import api  # noqa: F401
from tests.scheduler.scheduling_cluster_support import schedulable

R = "omaticaya.io/gpu-memory"


def write_shared_node(core: Any, name: str, free_mib: list[int], units: int) -> None:
    """A Node as an agent sharing every GPU writes it (labels + telemetry), schedulable, with
    ``units`` of the shared resource in its capacity and allocatable."""
    from omaticaya_py.core.model.sharing import Sharing
    from omaticaya_py.core.publish.render import render
    from omaticaya_py.core.publish.render_telemetry import telemetry_annotation
    from omaticaya_py.core.rules.health import assess

    snap = snapshot(*(gpu(i, memory_free_mib=f) for i, f in enumerate(free_mib)),
                    read_at=datetime.now(timezone.utc))  # fmt: skip
    health = assess(snap)
    s = settings(shared_gpus="all")
    labels = dict(render(snap, health, s, with_telemetry=False).labels)
    annotations, _ = telemetry_annotation(snap, health, s.prefix, refresh_s=600,
                                          sharing=Sharing.of(s))  # fmt: skip
    core.create_node({"metadata": {"name": name, "annotations": annotations,
                                  "labels": {"kubernetes.io/hostname": name, **labels}}})  # fmt: skip
    schedulable(core, name)
    extra = {R: str(units)}
    core.patch_node_status(name, {"status": {"capacity": extra, "allocatable": extra}})


def slice_pod(name: str, scheduler: str, units: int) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"schedulerName": scheduler, "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.2",
                 "resources": {"limits": {R: str(units)}}}]}}  # fmt: skip

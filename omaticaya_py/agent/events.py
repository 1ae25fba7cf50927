"""Node Events for GPU health changes: ``GpuUnhealthy`` and ``GpuRecovered``, by GPU UUID."""

from __future__ import annotations

from collections import Counter

from loguru import logger

from ..core.health import NodeHealth
from ..core.snapshot import NodeSnapshot
from ..kube import KubeError, NodeClient

__all__ = ["HealthEvents"]


class HealthEvents:
    """Posts an Event for each GPU whose health differs from the last one reported.

    GPUs are keyed by UUID (their index when NVML gave none): indices shift when a GPU is gone
    after a re-init, UUIDs do not. A GPU whose Event could not be posted (API down) is compared
    again next time, so no change is lost. A GPU starts as healthy: one unhealthy at the first
    reading gets its Event too. ``posted`` counts Events by reason (for ``/metrics``)."""

    def __init__(self) -> None:
        self.posted: Counter[str] = Counter()
        self._reported_healthy: dict[str | int, bool] = {}

    def post(self, node: NodeClient, node_uid: str, after: NodeHealth, snapshot: NodeSnapshot):
        """Post the Events due for ``after`` on the Node ``node_uid`` (``events.k8s.io``
        through ``NodeClient.create_node_event``); failures are logged, never raised."""
        uuids = {g.index: g.uuid for g in snapshot.gpus}
        for index, gpu in after.gpus.items():
            key: str | int = uuids.get(index) or index
            if self._reported_healthy.get(key, True) == gpu.healthy:
                continue
            reason = "GpuRecovered" if gpu.healthy else "GpuUnhealthy"
            detail = "healthy again" if gpu.healthy else "unhealthy: " + ",".join(gpu.reasons)
            try:
                node.create_node_event(
                    node_uid=node_uid,
                    reason=reason,
                    message=f"GPU {index} {detail}",
                    warning=not gpu.healthy,
                )
            except KubeError as exc:
                logger.warning("could not post Event {} for GPU {}: {}", reason, index, exc)
                continue
            self.posted[reason] += 1
            self._reported_healthy[key] = gpu.healthy

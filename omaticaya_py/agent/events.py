"""Node Events: GPU health changes (``GpuUnhealthy``, ``GpuRecovered``, by GPU UUID) and
out-of-band memory (``GpuOutOfBandMemory``, once per episode)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from loguru import logger

from ..core.attribution import GpuAttribution
from ..core.health import NodeHealth
from ..core.sayonce import SayOnce
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
        #: said once posted: GPUs reported unhealthy; devices in an out-of-band episode
        self._unhealthy: SayOnce[str | int, bool] = SayOnce()
        self._out_of_band: SayOnce[str, bool] = SayOnce()

    def post(self, node: NodeClient, node_uid: str, after: NodeHealth, snapshot: NodeSnapshot):
        """Post the Events due for ``after`` on the Node ``node_uid`` (``events.k8s.io``
        through ``NodeClient.create_node_event``); failures are logged, never raised."""
        uuids = {g.index: g.uuid for g in snapshot.gpus}
        for index, gpu in after.gpus.items():
            key: str | int = uuids.get(index) or index
            if (key not in self._unhealthy) == gpu.healthy:
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
            if gpu.healthy:
                self._unhealthy.end(key)
            else:
                self._unhealthy.start(key, True)

    def post_out_of_band(
        self,
        node: NodeClient,
        node_uid: str,
        attribution: Mapping[str, GpuAttribution],
        snapshot: NodeSnapshot,
        threshold_mib: int,
    ) -> None:
        """A ``GpuOutOfBandMemory`` Warning once per episode: when the memory of processes in
        no pod on one GPU or MIG device reaches ``threshold_mib``; the episode ends when it
        falls below (then a later rise is a new Event). A failed post is tried next tick."""
        names = _device_names(snapshot)
        for device_id, att in attribution.items():
            over = att.out_of_band_memory_mib >= threshold_mib
            if not over:
                self._out_of_band.end(device_id)
                continue
            if device_id in self._out_of_band:
                continue
            pids = ",".join(map(str, att.out_of_band_pids[:10]))
            try:
                node.create_node_event(
                    node_uid=node_uid,
                    reason="GpuOutOfBandMemory",
                    message=f"{names.get(device_id, device_id)}: {att.out_of_band_memory_mib} MiB "
                    f"held by processes in no pod (PIDs {pids}), over {threshold_mib} MiB",
                    warning=True,
                )
            except KubeError as exc:
                logger.warning("could not post Event GpuOutOfBandMemory for {}: {}", device_id, exc)
                continue
            self.posted["GpuOutOfBandMemory"] += 1
            self._out_of_band.start(device_id, True)


def _device_names(snapshot: NodeSnapshot) -> dict[str, str]:
    """UUID -> ``GPU <index>`` or ``GPU <index> MIG <slot>``, for Event messages."""
    out: dict[str, str] = {}
    for g in snapshot.gpus:
        if g.uuid:
            out[g.uuid] = f"GPU {g.index}"
        for m in g.mig_devices:
            if m.uuid:
                out[m.uuid] = f"GPU {g.index} MIG {m.index}"
    return out

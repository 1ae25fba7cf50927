"""A shared GPU index that moved (``core.model.sharing.IndexMoved``), told to the cluster: the Warning
Event ``SharedGpuIndexMoved`` on the Node (``post_index_moved``) and the gauge
``omaticaya_shared_gpu_index_moved`` (``moved_family``, ``MovedGauge``). Both kubelet plugins, the DRA plugin
and the device plugin, report a moved index with these two."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from loguru import logger
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core.model.sharing import IndexMoved
from ..core.schema.events import SHARED_GPU_INDEX_MOVED
from .errors import KubeError
from .events import EventNote, post_event
from .session import ApiSession

__all__ = ["EVENT_REASON", "GAUGE", "MovedGauge", "moved_family", "post_index_moved"]

#: the Event's reason (``core.schema.events``)
EVENT_REASON = SHARED_GPU_INDEX_MOVED
#: the gauge's name
GAUGE = "omaticaya_shared_gpu_index_moved"


def post_index_moved(session: ApiSession, node: str, moved: IndexMoved, who: str) -> bool:
    """POST the Warning Event ``SharedGpuIndexMoved`` about Node ``node`` (core/v1, namespace
    ``default``, as the kubelet's own Node Events), its message ``moved.message()`` (both GPU
    UUIDs and the safe form). Returns whether it was posted; a ``KubeError`` (no create on
    events, the API server unreachable) is logged as a warning prefixed ``who`` and never
    raised."""
    try:
        post_event(session, namespace="default",
                   involved={"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
                   note=EventNote(EVENT_REASON, moved.message(), warning=True),
                   reporter=node, what=f"event {EVENT_REASON} on node {node}")  # fmt: skip
    except KubeError as exc:
        logger.warning("{}: could not post the Event {}: {}", who, EVENT_REASON, exc)
        return False
    return True


def moved_family(moved: Iterable[IndexMoved]) -> GaugeMetricFamily:
    """``omaticaya_shared_gpu_index_moved{index,before,now}``: 1 for each of ``moved`` (``now``
    empty: no GPU at that index now); no series when none moved."""
    family = GaugeMetricFamily(
        GAUGE, "1 for each OMATICAYA_SHARED_GPUS index that names another GPU than at the last "
        "start (before, now: the GPU UUIDs; now empty: no GPU there): sharing followed the "
        "index; name shared GPUs by UUID.",
        labels=["index", "before", "now"])  # fmt: skip
    for m in moved:
        family.add_metric([str(m.index), m.before, m.now or ""], 1)
    return family


class MovedGauge(Collector):
    """A collector of ``moved_family(moved())``: ``moved`` returns the moved indices of the
    plugin's start (``deviceplugin.DevicePluginSet.moved``), so it can be registered on the
    agent's ``/metrics`` before that plugin exists."""

    def __init__(self, moved: Callable[[], Iterable[IndexMoved]]) -> None:
        self._moved = moved

    def collect(self) -> Iterator[Metric]:
        yield moved_family(self._moved())

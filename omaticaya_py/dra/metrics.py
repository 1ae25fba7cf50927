"""The DRA plugin's counters on the agent's ``/metrics``: ``omaticaya_dra_prepare_total{result}``
and ``omaticaya_dra_unprepare_total{result}``.

Prepare results: ``prepared`` (a claim prepared now), ``repeated`` (prepared before: answered
from the checkpoint), ``refused`` (the claim cannot be prepared: its reason is in the pod's
events), ``failed`` (the API server or a file could not be reached: the kubelet tries again).
Unprepare results: ``unprepared``, ``unknown`` (not prepared here: success), ``failed``.

``omaticaya_shared_gpu_index_moved{index,before,now}``: 1 for each ``OMATICAYA_SHARED_GPUS``
index that names another GPU (UUID ``now``; empty: none) than at the plugin's last start
(``before``), until the next start; no series when none moved.

``omaticaya_dra_driver_files{driver_version}``: how many of the NVIDIA driver's files every
prepared claim's containers get mounted (``driverfiles``); 0 with ``driver_version=""`` when
none were found (the log says why); no series with ``OMATICAYA_DRA_DRIVER_FILES`` off.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core.model.sharing import IndexMoved
from ..kube.index_moved import moved_family

__all__ = ["DraCounters", "DraCounts", "PREPARE_RESULTS", "UNPREPARE_RESULTS"]

PREPARE_RESULTS = ("prepared", "repeated", "refused", "failed")
UNPREPARE_RESULTS = ("unprepared", "unknown", "failed")


class DraCounts:
    """The plugin's live counts: ``prepare[result]`` and ``unprepare[result]`` (claims), and
    ``moved``: the shared GPU indices that name another GPU than at the last start
    (``core.model.sharing.IndexMoved``, set once a start's first reading is compared);
    ``driver_files``: the driver's version and how many of its files claims get mounted
    (``("", 0)``: none found; ``None``: off, or not looked for yet)."""

    def __init__(self) -> None:
        self.prepare: Counter[str] = Counter()
        self.unprepare: Counter[str] = Counter()
        self.moved: tuple[IndexMoved, ...] = ()
        self.driver_files: tuple[str, int] | None = None


class DraCounters(Collector):
    """``omaticaya_dra_prepare_total{result}`` and ``omaticaya_dra_unprepare_total{result}``,
    from ``counts`` (every result listed, 0 until it happens)."""

    def __init__(self, counts: DraCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        for name, doc, results, counts in (
            ("omaticaya_dra_prepare", "ResourceClaims the DRA plugin was asked to prepare, by "
             "result (prepared, repeated: from the checkpoint, refused: the reason is in the "
             "pod's events, failed: API or file error, retried by the kubelet).",
             PREPARE_RESULTS, self._counts.prepare),
            ("omaticaya_dra_unprepare", "ResourceClaims the DRA plugin was asked to unprepare, by "
             "result (unprepared, unknown: not prepared here, failed).",
             UNPREPARE_RESULTS, self._counts.unprepare),
        ):  # fmt: skip
            family = CounterMetricFamily(name, doc, labels=["result"])
            for result in results:
                family.add_metric([result], counts.get(result, 0))
            yield family
        yield moved_family(self._counts.moved)
        if self._counts.driver_files is not None:
            version, count = self._counts.driver_files
            files = GaugeMetricFamily(
                "omaticaya_dra_driver_files", "NVIDIA driver files mounted read-only in every "
                "prepared claim's containers (0: none found under OMATICAYA_DRA_DRIVER_ROOT, the "
                "log says why; containers then need the nvidia runtime to get their driver).",
                labels=["driver_version"])  # fmt: skip
            files.add_metric([version], count)
            yield files

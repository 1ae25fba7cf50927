"""The MPS supervisor's metrics and probes, on one port (``OMATICAYA_MPS_METRICS_PORT``, 9403):

- ``/metrics``: ``omaticaya_mps_daemon_up{gpu,uuid}`` (1 while the GPU's control daemon
  answers and is configured, else 0), ``omaticaya_mps_daemon_starts_total{gpu,uuid}`` (every
  start, the first included), ``omaticaya_mps_daemon_failures_total{gpu,uuid,reason}``
  (``reason``: one of ``daemon.REASONS``; each failed start and each fall of a daemon that was
  up counts once): each shared GPU's probe daemon;
- ``omaticaya_mps_slice_daemons{gpu,uuid}`` (the slices' daemons up on the GPU),
  ``omaticaya_mps_slice_daemon_starts_total{gpu,uuid}``,
  ``omaticaya_mps_slice_daemon_failures_total{gpu,uuid,reason}`` (the same reasons), and
  ``omaticaya_mps_slice_requests_skipped_total{reason}`` (a request file that is no request,
  ``unreadable``, or asks for a GPU that is not shared here, ``unknown-gpu``);
- ``/healthz``: 200 while the supervisor's checks run; ``/readyz``: 200 iff every daemon is up
  (503 with the reason otherwise).

Served by ``serving.HttpServer`` (uvicorn in a background thread).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from ..serving import HttpServer, probe_app

__all__ = ["MpsMetrics", "make_app", "serve"]

#: a probe: ``(ok, reason)``
Probe = Callable[[], tuple[bool, str]]


class MpsMetrics:
    """The supervisor's metric families on a registry of their own (``registry``). Each GPU's
    series exist from ``add_gpu``; ``up``/``started``/``failed`` set them. Thread-safe
    (prometheus-client's)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._up = Gauge(
            "omaticaya_mps_daemon_up", "1 while the GPU's MPS control daemon answers and is "
            "configured, else 0.", ["gpu", "uuid"], registry=self.registry,
        )  # fmt: skip
        self._starts = Counter(
            "omaticaya_mps_daemon_starts", "Starts of the GPU's MPS control daemon (the first "
            "included).", ["gpu", "uuid"], registry=self.registry,
        )  # fmt: skip
        self._failures = Counter(
            "omaticaya_mps_daemon_failures", "Failures of the GPU's MPS control daemon: failed "
            "starts and falls of a daemon that was up, by reason.", ["gpu", "uuid", "reason"],
            registry=self.registry,
        )  # fmt: skip
        self._slices = Gauge(
            "omaticaya_mps_slice_daemons", "The slices' MPS control daemons up on the GPU (one "
            "per slice: its default pinned-memory limit is the slice).", ["gpu", "uuid"],
            registry=self.registry,
        )  # fmt: skip
        self._slice_starts = Counter(
            "omaticaya_mps_slice_daemon_starts", "Starts of slices' MPS control daemons on the "
            "GPU (restarts included).", ["gpu", "uuid"], registry=self.registry,
        )  # fmt: skip
        self._slice_failures = Counter(
            "omaticaya_mps_slice_daemon_failures", "Failures of slices' MPS control daemons on "
            "the GPU, by reason.", ["gpu", "uuid", "reason"], registry=self.registry,
        )  # fmt: skip
        self._skipped = Counter(
            "omaticaya_mps_slice_requests_skipped", "Slice requests skipped: unreadable, or for "
            "a GPU that is not shared here (unknown-gpu).", ["reason"], registry=self.registry,
        )  # fmt: skip

    def add_gpu(self, index: int, uuid: str) -> None:
        """Create GPU ``index``'s series (up 0, no start yet)."""
        self._up.labels(str(index), uuid).set(0)
        self._starts.labels(str(index), uuid)
        self._slices.labels(str(index), uuid).set(0)
        self._slice_starts.labels(str(index), uuid)

    def up(self, index: int, uuid: str, is_up: bool) -> None:
        """Set ``omaticaya_mps_daemon_up`` of the GPU."""
        self._up.labels(str(index), uuid).set(1 if is_up else 0)

    def started(self, index: int, uuid: str) -> None:
        """Count one start of the GPU's daemon."""
        self._starts.labels(str(index), uuid).inc()

    def failed(self, index: int, uuid: str, reason: str) -> None:
        """Count one failure of the GPU's daemon, ``reason`` one of ``daemon.REASONS``."""
        self._failures.labels(str(index), uuid, reason).inc()

    def slices_up(self, index: int, uuid: str, count: int) -> None:
        """Set ``omaticaya_mps_slice_daemons`` of the GPU."""
        self._slices.labels(str(index), uuid).set(count)

    def slice_started(self, index: int, uuid: str) -> None:
        """Count one start of a slice's daemon on the GPU."""
        self._slice_starts.labels(str(index), uuid).inc()

    def slice_failed(self, index: int, uuid: str, reason: str) -> None:
        """Count one failure of a slice's daemon on the GPU (``daemon.REASONS``)."""
        self._slice_failures.labels(str(index), uuid, reason).inc()

    def skipped(self, reason: str) -> None:
        """Count one skipped slice request (``unreadable``, ``unknown-gpu``)."""
        self._skipped.labels(reason).inc()


def make_app(registry: CollectorRegistry, healthz: Probe, readyz: Probe) -> Any:
    """The Starlette application: ``/metrics`` (``registry``), ``/healthz`` and ``/readyz``
    (``serving.probe_app``)."""
    return probe_app(registry, healthz, readyz)


def serve(registry: CollectorRegistry, healthz: Probe, readyz: Probe, address: str,
          port: int) -> HttpServer:  # fmt: skip
    """Start ``make_app`` on ``address:port`` in a daemon thread (``port`` 0: a free port, see
    ``.port``; stop with ``.shutdown()``). Raises ``OSError`` when the address cannot be
    bound."""
    return HttpServer(make_app(registry, healthz, readyz), address, port).start()

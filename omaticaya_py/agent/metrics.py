"""Prometheus metrics and probes on one port: ``/metrics``, ``/healthz``, ``/readyz``.

``/metrics`` is one ``CollectorRegistry`` of small collectors (``agent.gpu_collectors``: GPU
readings; ``agent.collectors``: build info, NVML errors, PodResources, slice API errors, the slices over their limit,
API requests, the agent's counters), each given only what it reads, and the probes
(``liveness``, ``readiness``) over the ``SnapshotCache`` and the running ``Daemon``. ``agent_registry`` and ``serve`` are the wiring:
the one place that takes these from an ``Agent``. A scrape costs no NVML call and no API
request.

- ``/healthz``: 200 while the scheduler runs and a tick finished within ``stuck_tick_periods``
  schedule periods (plus the jitter); 503 with the reason otherwise (a tick stuck in a hung
  call: restarting the container is the cure). Also 503 once every read for
  ``LIBRARY_MISSING_RESTART_S`` found no NVML library in the container: the NVIDIA container
  toolkit injects the library when a container is created, so a pod started before the toolkit
  was ready (the GPU Operator installing it) never gets it by re-initialising NVML; the
  liveness probe's restart makes a container that does.
- ``/readyz``: 200 when NVML was read and the API server answered (or needed no request)
  within the last ``3 * schedule period`` (at least 30 s); 503 with the reason otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from ..core.model.sharing import Sharing
from ..serving import HttpServer, probe_app
from .collectors import (
    AgentCounters,
    ApiRequests,
    BuildInfo,
    MpsStateErrors,
    NvmlErrors,
    PodResourcesErrors,
    SliceApiErrors,
    SliceOverLimit,
)
from .gpu_collectors import GpuReadings

if TYPE_CHECKING:
    from .agent import Agent
    from .state import Runner, SnapshotCache

__all__ = ["MetricsServer", "agent_registry", "liveness", "make_app", "readiness", "serve"]


def _clock_steps(runner: Runner | None) -> int:
    """The wall-clock steps the running daemon's watchdog saw (0 before it runs)."""
    watchdog = runner.watchdog if runner is not None else None
    return int(watchdog.steps) if watchdog is not None else 0


def agent_registry(agent: Agent, registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Register the agent's collectors on ``registry`` (a new one by default) and return it:
    the wiring, each collector given the one thing of ``agent`` it reads (the reader's counts,
    the PodResources client's, the slices', the Node client's session's, the cache's). A trace
    replay's reader counts no NVML errors; no attribution, no sharing, no Node client (dry
    run): those families have no series."""
    registry = registry if registry is not None else CollectorRegistry()
    reader: Any = agent.reader  # an NVML reader has counts; a trace replay has none
    attribution, slices, node = agent.attribution, agent.slices, agent.node
    for collector in (
        BuildInfo(),
        GpuReadings(lambda: agent.cache.last, Sharing.of(agent.settings)),
        NvmlErrors(
            reader.errors if hasattr(reader, "errors") else {},
            (lambda: reader.xid_events_dropped) if hasattr(reader, "xid_events_dropped") else (lambda: 0),
        ),
        PodResourcesErrors(
            attribution.errors if attribution is not None else {},
            attribution.skipped if attribution is not None else {},
        ),
        SliceApiErrors(slices.errors if slices is not None else {}),
        MpsStateErrors((lambda: mps.errors) if (mps := agent.mps) is not None else None),
        SliceOverLimit(
            (lambda: slices.over_now) if slices is not None else dict,
            slices.episodes if slices is not None else {},
            slices.evictions if slices is not None else {},
        ),
        ApiRequests(node.requests if node is not None else {}),
        AgentCounters(
            agent.cache, agent.ledger, agent.events_posted,
            clock_steps=lambda: _clock_steps(agent.daemon),
            on_lease=lambda: agent.lease is not None,
        ),
    ):  # fmt: skip
        registry.register(collector)
    return registry


def readiness(
    cache: SnapshotCache, period_s: float, now_s: float | None = None
) -> tuple[bool, str]:
    """(ready, reason) for ``/readyz`` (see the module docstring), from the cache's times of
    the last good read and API answer, on its clock; ``period_s``: the schedule's period."""
    now_s = cache.clock() if now_s is None else now_s
    horizon = max(3 * period_s, 30.0)
    if cache.last_read_ok_s is None or now_s - cache.last_read_ok_s > horizon:
        return False, "no successful NVML read recently"
    if cache.last_api_ok_s is None or now_s - cache.last_api_ok_s > horizon:
        return False, "Kubernetes API not reached recently"
    return True, "ok"


#: seconds without an NVML library in the container before ``/healthz`` fails (the toolkit
#: may still be installing: the GPU Operator's validation takes about a minute)
LIBRARY_MISSING_RESTART_S = 60.0


def liveness(
    runner: Runner | None, cache: SnapshotCache, now_s: float | None = None
) -> tuple[bool, str]:
    """(alive, reason) for ``/healthz`` (see the module docstring): ``runner`` (the
    ``Daemon``; ``None``: none) must be running, the cache's last tick not overdue, and the
    NVML library not missing from the container for ``LIBRARY_MISSING_RESTART_S``."""
    if runner is None or not runner.running:
        return False, "scheduler not running"
    missing_since = cache.library_missing_since_s
    now = cache.clock() if now_s is None else now_s
    if missing_since is not None and now - missing_since > LIBRARY_MISSING_RESTART_S:
        return False, (
            f"no NVML library in this container for {now - missing_since:.0f}s: the NVIDIA "
            "container toolkit was not ready when it started; a restart brings the library in"
        )
    if cache.tick_overdue(now_s):
        stage = f"stuck in '{cache.tick_stage}'" if cache.tick_stage else "none running"
        return False, f"no tick finished for {cache.tick_age_s(now_s):.0f}s ({stage})"
    return True, "ok"


def make_app(
    registry: CollectorRegistry,
    healthz_probe: Callable[[], tuple[bool, str]],
    readyz_probe: Callable[[], tuple[bool, str]],
) -> Any:
    """The Starlette application: prometheus-client's exposition of ``registry`` on
    ``/metrics`` plus the probes, each ``(ok, reason)`` (``serving.probe_app``)."""
    return probe_app(registry, healthz_probe, readyz_probe)


#: a running metrics/probe server: ``port`` is the bound port, ``shutdown()`` stops it
MetricsServer = HttpServer


def serve(agent: Agent, address: str, port: int, *, collectors: Iterable[Collector] = ()) -> HttpServer:
    """Start ``/metrics``, ``/healthz`` and ``/readyz`` on ``address:port`` in a daemon thread
    (``serving.HttpServer``: uvicorn; ``'::'`` listens on IPv6, and on IPv4 too where the host
    is dual-stack). ``port`` 0 picks a free port (``.port``). ``collectors``: more on the same
    registry (the DRA plugin's counters, ``dra.metrics.DraCounters``). Raises ``OSError`` when
    the address cannot be bound (port in use, address not on this host, no IPv6)."""
    registry = agent_registry(agent)
    for collector in collectors:
        registry.register(collector)
    app = make_app(
        registry,
        lambda: liveness(agent.daemon, agent.cache),
        lambda: readiness(agent.cache, agent.period_s),
    )
    return HttpServer(app, address, port).start()

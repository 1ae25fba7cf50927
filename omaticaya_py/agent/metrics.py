"""Prometheus metrics and probes on one port: ``/metrics``, ``/healthz``, ``/readyz``.

``AgentCollector`` yields metric families from values the agent already holds (its
``SnapshotCache``, the reader's NVML error counts, the Kubernetes edge's request counts), so a
scrape costs no NVML call and no API request. Names follow Prometheus conventions: base units
(bytes, seconds, watts, celsius, ratio), ``_total`` for counters.

- ``/healthz``: 200 while the scheduler runs and a tick finished within ``stuck_tick_periods``
  schedule periods (plus the jitter); 503 with the reason otherwise (a tick stuck in a hung
  call: restarting the container is the cure).
- ``/readyz``: 200 when NVML was read and the API server answered (or needed no request)
  within the last ``3 * schedule period`` (at least 30 s); 503 with the reason otherwise.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..core.attribution import GpuAttribution, gpu_out_of_band_mib
from ..core.slices import Sharing
from ..core.snapshot import GpuReading
from ..serving import HttpServer, metrics_route
from .slices import slice_families

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["AgentCollector", "MetricsServer", "liveness", "readiness", "serve", "make_app"]

MIB = 1024 * 1024
#: dcgm-exporter's label names for the pod holding a GPU, so that its dashboards work
POD_LABELS = ("pod", "namespace", "container")


def holders(
    g: GpuReading, attribution: Mapping[str, GpuAttribution]
) -> list[tuple[str, str, str]]:
    """(pod, namespace, container) of each container holding whole GPU ``g`` (PodResources);
    ``[("", "", "")]`` when none does, or for a GPU with MIG on (its MIG devices are held)."""
    att = attribution.get(g.uuid or "") if not g.mig_enabled else None
    found = [(h.pod, h.namespace, h.container) for h in att.holders] if att else []
    return found or [("", "", "")]


class AgentCollector(Collector):
    """Collector over one ``Agent``'s cache. Register it in a ``CollectorRegistry``."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        agent = self.agent
        cache = agent.cache
        info = GaugeMetricFamily(
            "omaticaya_build_info", "Agent version.", labels=["version", "python"]
        )
        info.add_metric([__version__, platform.python_version()], 1)
        yield info

        last = cache.last
        gauges = {
            name: GaugeMetricFamily(f"omaticaya_gpu_{name}", doc, labels=["gpu", "uuid"])
            for name, doc in (
                ("memory_free_bytes", "Free GPU memory (nvmlDeviceGetMemoryInfo)."),
                ("memory_total_bytes", "Total GPU memory."),
                ("temperature_celsius", "GPU temperature."),
                ("power_watts", "GPU power draw."),
                ("healthy", "1 when the GPU is healthy by the agent's rules, else 0."),
                (
                    "out_of_band_memory_bytes",
                    "GPU memory of processes in no pod (out-of-band); only where processes are "
                    "placed (OMATICAYA_PROC_ROOT).",
                ),
            )
        }
        # by the pod holding the GPU, with dcgm-exporter's label names (empty: no holder)
        by_pod = {
            name: GaugeMetricFamily(
                f"omaticaya_gpu_{name}", doc, labels=["gpu", "uuid", *POD_LABELS]
            )
            for name, doc in (
                ("memory_used_bytes", "Used GPU memory, driver reservation included; labelled "
                 "with the container holding the GPU (kubelet PodResources), if any."),
                ("utilization_ratio", "GPU utilisation, mean over the last interval (0-1); "
                 "labelled with the container holding the GPU, if any."),
            )
        }
        node_health = GaugeMetricFamily(
            "omaticaya_node_health", "1 for the node's current gpu.health state.", labels=["state"]
        )
        unhealthy_reason = GaugeMetricFamily(
            "omaticaya_gpu_unhealthy_reason",
            "1 for each reason an unhealthy GPU has (lost, read-error, remap-pending, "
            "remap-failure, ecc-dbe, xid-<N>); no series for a healthy GPU.",
            labels=["gpu", "uuid", "reason"],
        )
        if last is not None:
            attribution = last.attribution
            for g in last.snapshot.gpus:
                key = [str(g.index), g.uuid or ""]
                for name, value, scale in (
                    ("memory_free_bytes", g.memory_free_mib, MIB),
                    ("memory_total_bytes", g.memory_total_mib, MIB),
                    ("temperature_celsius", g.temperature_c, 1),
                    ("power_watts", g.power_w, 1),
                    ("out_of_band_memory_bytes", gpu_out_of_band_mib(g, attribution), MIB),
                ):
                    if value is not None:
                        gauges[name].add_metric(key, value * scale)
                for pod in holders(g, attribution):
                    for name, value, scale in (
                        ("memory_used_bytes", g.memory_used_mib, MIB),
                        ("utilization_ratio", g.utilization_pct, 0.01),
                    ):
                        if value is not None:
                            by_pod[name].add_metric([*key, *pod], value * scale)
                gauges["healthy"].add_metric(key, 1 if last.health.gpus[g.index].healthy else 0)
            for state in ("Healthy", "Degraded", "Unhealthy", "Unknown"):
                node_health.add_metric([state], 1 if str(last.health.state) == state else 0)
            for g in last.snapshot.gpus:
                for reason in last.health.gpus[g.index].reasons:
                    unhealthy_reason.add_metric([str(g.index), g.uuid or "", reason], 1)
        yield from gauges.values()
        yield from by_pod.values()
        yield from slice_families(
            last.snapshot if last is not None else None,
            last.attribution if last is not None else {},
            Sharing.of(agent.settings),
        )
        yield node_health
        yield unhealthy_reason

        nvml_errors = CounterMetricFamily(
            "omaticaya_nvml_errors", "NVML calls that failed, by call and error.",
            labels=["call", "error"],
        )
        for (call, error), n in sorted(getattr(agent.reader, "errors", {}).items()):
            nvml_errors.add_metric([call, error], n)
        yield nvml_errors
        pod_resources = CounterMetricFamily(
            "omaticaya_pod_resources_errors",
            "kubelet PodResources List calls that failed, by gRPC code (absent: no socket).",
            labels=["code"],
        )
        attribution_edge = getattr(agent, "attribution", None)
        for code, n in sorted(getattr(attribution_edge, "errors", {}).items()):
            pod_resources.add_metric([code], n)
        yield pod_resources
        skipped = CounterMetricFamily(
            "omaticaya_pod_resources_skipped",
            "Device IDs from kubelet PodResources skipped, by reason (unknown-gpu: a memory "
            "unit naming no GPU of this node).",
            labels=["reason"],
        )
        for reason, n in sorted(getattr(attribution_edge, "skipped", {}).items()):
            skipped.add_metric([reason], n)
        yield skipped
        slice_errors = CounterMetricFamily(
            "omaticaya_slice_api_errors",
            "API requests for shared GPU slices that failed (get-forbidden, get-failed: reading "
            "a slice's pod; event-failed: its over-use Event).",
            labels=["kind"],
        )
        for kind, n in sorted(getattr(getattr(agent, "slices", None), "errors", {}).items()):
            slice_errors.add_metric([kind], n)
        yield slice_errors

        requests = CounterMetricFamily(
            "omaticaya_api_requests", "Kubernetes API requests, by verb and result.",
            labels=["verb", "result"],
        )
        for (verb, result), n in sorted(getattr(agent.node, "requests", {}).items()):
            requests.add_metric([verb, result], n)
        yield requests

        for name, doc, value in (
            ("omaticaya_ticks", "Ticks run.", cache.ticks),
            ("omaticaya_tick_errors", "Ticks that failed on an unexpected error.", cache.tick_errors),
            ("omaticaya_patches", "Merge patches sent to the Node.", cache.patches_sent),
            ("omaticaya_labels_changed", "Label keys set or removed by patches.", cache.labels_changed),
            ("omaticaya_patches_held", "Patches the write budget held back for a later tick.", cache.patches_held),
            ("omaticaya_lease_renewals", "Renewals of the liveness Lease.", cache.lease_renewals),
            ("omaticaya_lease_failures", "Lease renewals that failed (other than a 403).", cache.lease_failures),
            ("omaticaya_lease_fallbacks", "403s on the Lease: heartbeat back on the Node annotation.", cache.lease_fallbacks),
            ("omaticaya_writes_superseded", "API rounds replaced by a newer reading before they started (a slow API server).", cache.writes_superseded),
            ("omaticaya_clock_steps", "Steps of the wall clock seen by the watchdog (ticks rescheduled).", getattr(getattr(agent, "watchdog", None), "steps", 0)),
            ("omaticaya_xid_events_seeded", "Fatal Xid events carried over from the Node's telemetry at start (NVML does not replay old events).", agent.ledger.seeded),
            ("omaticaya_xid_seed_refused", "GPU entries of the Node's telemetry refused when seeding the Xid ledger at start (forged or malformed).", agent.ledger.seed_refused),
            ("omaticaya_xid_events_dropped", "Xid events dropped from the event thread's bounded buffer (the latest per GPU and Xid is kept).", getattr(agent.reader, "xid_events_dropped", 0)),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily(
            "omaticaya_last_tick_age_seconds",
            "Seconds since the last tick's read path finished (since start before the first).",
            value=cache.tick_age_s(),
        )
        events = CounterMetricFamily(
            "omaticaya_events", "Kubernetes Events posted, by reason.", labels=["reason"]
        )
        for reason, n in sorted(agent.events_posted.items()):
            events.add_metric([reason], n)
        yield events
        if cache.last_patch_wall_s is not None:
            yield GaugeMetricFamily(
                "omaticaya_last_patch_timestamp_seconds",
                "Unix time of the last successful patch.",
                value=cache.last_patch_wall_s,
            )
        yield GaugeMetricFamily(
            "omaticaya_heartbeat_on_lease",
            "1 while liveness goes on a Lease, 0 while on the Node's telemetry annotation.",
            value=1 if getattr(agent, "lease", None) is not None else 0,
        )
        yield from cache.tick_seconds.collect()


def readiness(agent: Agent, now_s: float | None = None) -> tuple[bool, str]:
    """(ready, reason) for ``/readyz`` (see the module docstring)."""
    now_s = agent.clock() if now_s is None else now_s
    horizon = max(3 * agent.period_s, 30.0)
    cache = agent.cache
    if cache.last_read_ok_s is None or now_s - cache.last_read_ok_s > horizon:
        return False, "no successful NVML read recently"
    if cache.last_api_ok_s is None or now_s - cache.last_api_ok_s > horizon:
        return False, "Kubernetes API not reached recently"
    return True, "ok"


def liveness(agent: Agent, now_s: float | None = None) -> tuple[bool, str]:
    """(alive, reason) for ``/healthz`` (see the module docstring)."""
    if not agent.running:
        return False, "scheduler not running"
    cache = agent.cache
    if cache.tick_overdue(now_s):
        stage = f"stuck in '{cache.tick_stage}'" if cache.tick_stage else "none running"
        return False, f"no tick finished for {cache.tick_age_s(now_s):.0f}s ({stage})"
    return True, "ok"


def make_app(agent: Agent, registry: CollectorRegistry) -> Any:
    """The Starlette application: prometheus-client's exposition on ``/metrics`` plus the
    probes (plain text, the reason on one line)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    def answer(ok: bool, reason: str) -> PlainTextResponse:
        return PlainTextResponse(reason + "\n", status_code=200 if ok else 503)

    async def healthz(request: Request) -> PlainTextResponse:
        return answer(*liveness(agent))

    async def readyz(request: Request) -> PlainTextResponse:
        return answer(*readiness(agent))

    return Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            metrics_route(registry),
        ]
    )


#: a running metrics/probe server: ``port`` is the bound port, ``shutdown()`` stops it
MetricsServer = HttpServer


def serve(agent: Agent, address: str, port: int) -> HttpServer:
    """Start ``/metrics``, ``/healthz`` and ``/readyz`` on ``address:port`` in a daemon thread
    (``serving.HttpServer``: uvicorn; ``'::'`` listens on IPv6, and on IPv4 too where the host
    is dual-stack). ``port`` 0 picks a free port (``.port``). Raises ``OSError`` when the
    address cannot be bound (port in use, address not on this host, no IPv6)."""
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent))
    return HttpServer(make_app(agent, registry), address, port).start()

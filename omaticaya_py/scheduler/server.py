"""Run the extender: the Node cache (list + watch), the app, and uvicorn until SIGTERM; with
``scrape_port``, a second server of ``/metrics`` alone on ``scrape_address``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from loguru import logger as log

from ..core.rules.liveness import observe
from ..core.schema import NodeGpuState, parse_node
from ..serving import HttpServer, metrics_route
from .app import LeaseProblems, NodeProblems, create_app
from .ledger import Ledger, PodProblems, placement_from_pod
from .metrics import MetricSources, metrics_registry
from .need import need_reader
from .nodeview import LeaseState, lease_from_object, seen_of, with_policy, with_signal
from .preempt import preemptor
from .protocol import Extender
from .settings import ExtenderSettings
from .unasked import unasked_preemption


def serve(
    settings: ExtenderSettings,
    *,
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
    cache_factory: Callable[..., Any] | None = None,
    ledger: Ledger | None = None,
) -> int:
    """Start the caches and serve until ``stop`` is set (or SIGTERM/SIGINT when run in the
    main thread). Returns the exit status. ``ready`` is set once the socket listens; ``ledger``:
    the reservation ledger to fill (``None``: a new one; tests pass theirs to read it);
    ``cache_factory``: the Node cache's class (``kube.NodeCache``)."""
    from ..kube import KubeError

    problems = NodeProblems()
    try:
        cache = _start_node_cache(settings, problems, cache_factory)
    except KubeError as err:
        log.error("{}", err)
        return 1
    ledger = ledger if ledger is not None else Ledger(settings.settle_s, settings.assume_s)
    pods, pod_problems = _start_pod_cache(settings, ledger)
    leases = _start_lease_cache(settings)
    ext = _extender(settings, cache, pods, leases, ledger, problems)
    if stop is None:  # a process of its own (the command line), not a test's thread
        threading.Thread(
            target=settle_heap, args=(cache, pods), name="settle-heap", daemon=True
        ).start()
    registry = metrics_registry(MetricSources(cache, problems, pods, pod_problems, ext.decisions,
                                              leases, ledger, cache.requests))  # fmt: skip
    app = create_app(ext, registry, preempt=preemptor(ext, settings.kubeconfig))
    unasked_stop = threading.Event()
    if settings.preempt_unasked:
        ext.unasked = unasked_preemption(ext, settings.kubeconfig)
        if ext.unasked is not None:
            threading.Thread(target=ext.unasked.run, args=(unasked_stop,),
                             name="preempt-unasked", daemon=True).start()  # fmt: skip
    servers = _bind(settings, app, registry)
    if servers is None:
        unasked_stop.set()
        _stop_caches(cache, pods, leases)
        return 1
    server, metrics = servers
    _signal_when(server, ready, stop)
    s = settings
    log.info(
        "extender on {}:{} metrics={} placement_policy={} signal={} ttl={:g}s+{:g}s "
        "max_clock_skew={:g}s fail_open={} prefix={} leases={} preempt_unasked={}", s.address,
        s.port, f"{s.scrape_address}:{s.scrape_port}" if s.scrape_port else "-",
        s.placement_policy, s.signal, s.ttl_s, s.grace_s, s.max_clock_skew_s, s.fail_open,
        s.prefix, s.lease_namespace or "-", s.preempt_unasked,
    )  # fmt: skip
    try:
        served = server.run()
    finally:
        unasked_stop.set()
        if metrics is not None:
            metrics.shutdown()
        _stop_caches(cache, pods, leases)
    return 0 if served else 1


def _bind(settings: ExtenderSettings, app: Any,
          registry: Any) -> tuple[HttpServer, HttpServer | None] | None:  # fmt: skip
    """The verbs' server on ``address:port`` (bound, not started) and the metrics server
    (``_metrics_server``: started, or ``None``); ``None`` when either cannot listen (logged,
    nothing left open)."""
    try:
        server = _listen(app, settings.address, settings.port, settings)
    except OSError:
        return None
    try:
        return server, _metrics_server(settings, registry)
    except OSError:
        server.sock.close()
        return None


def _listen(app: Any, address: str, port: int, settings: ExtenderSettings) -> HttpServer:
    """``HttpServer`` of ``app`` bound on ``address:port`` (not started). Raises ``OSError``,
    logged here with the address: port in use, address not on this host, no IPv6."""
    try:
        return HttpServer(app, address, port, log_level=settings.log_level,
                          access_log=settings.log_level == "DEBUG")  # fmt: skip
    except OSError as err:
        log.error("extender cannot listen on {}:{}: {}", address, port, err)
        raise


def _metrics_server(settings: ExtenderSettings, registry: Any) -> HttpServer | None:
    """With ``scrape_port``: ``/metrics`` of ``registry`` alone (no verb, no probe: those stay
    on ``address``, the loopback in the chart) served on ``scrape_address:scrape_port`` in a
    background thread, for Prometheus to scrape from the pod's IP; ``None`` without. Raises
    ``OSError`` when it cannot listen (logged)."""
    if not settings.scrape_port:
        return None
    from starlette.applications import Starlette

    app = Starlette(routes=[metrics_route(registry)])
    return _listen(app, settings.scrape_address, settings.scrape_port, settings).start()


def _start_node_cache(settings: ExtenderSettings, problems: NodeProblems,
                      factory: Callable[..., Any] | None) -> Any:  # fmt: skip
    """The Node list+watch, each Node parsed (``parse_node``), its problems told to
    ``problems``, viewed as the extender decides on it (``nodeview``), started. Raises
    ``KubeError`` when it cannot be configured."""
    from ..kube import KubeError, NodeCache

    prefix = settings.prefix
    cache: Any = None

    def transform(meta: Any) -> NodeGpuState:
        state = problems.seen(parse_node(meta.name, meta.labels, meta.annotations, prefix))
        # when this watch saw read_at take its value (core.rules.liveness): the agent's liveness
        before = cache.get(meta.name) if cache is not None else None
        seen = observe(before.read_at if before is not None else None, seen_of(before),
                       state.read_at, time.monotonic())  # fmt: skip
        return with_policy(with_signal(state, settings.signal), meta.annotations, prefix, seen)

    def on_error(err: KubeError) -> None:
        log.warning("node cache: {}", err)

    cache = (factory or NodeCache)(transform, kubeconfig=settings.kubeconfig,
                                   on_error=on_error, on_skip=problems.skipped)  # fmt: skip
    return cache.start() or cache


def _extender(settings: ExtenderSettings, cache: Any, pods: Any, leases: Any, ledger: Ledger,
              problems: NodeProblems) -> Extender:  # fmt: skip
    """The protocol handlers over the caches: ready once the Nodes and the pods are listed
    (the reservations of bound pods come from the pod LIST: a restarted extender would
    otherwise narrow pods onto room that bound pods hold)."""
    ext = Extender(
        settings, cache.get, health=cache.health,
        synced=lambda: cache.synced and (pods is None or pods.synced),
    )  # fmt: skip
    ext.on_problem, ext.flagged = problems.judged, problems.flagged
    if leases is not None:
        ext.leases, ext.leases_synced = leases.lease, lambda: leases.synced
    if pods is not None:
        ext.ledger = ledger
    return ext


def _signal_when(server: HttpServer, ready: threading.Event | None,
                 stop: threading.Event | None) -> None:  # fmt: skip
    """Stop ``server`` once ``stop`` is set; set ``ready`` once it listens."""
    if stop is not None:
        threading.Thread(
            target=lambda: (stop.wait(), server.stop()),  # type: ignore[func-returns-value]  # 2 calls
            name="extender-stop", daemon=True,
        ).start()
    if ready is not None:

        def watch_started() -> None:
            while not server.started and not server.server.should_exit:
                time.sleep(0.02)
            ready.set()

        threading.Thread(target=watch_started, daemon=True).start()


def settle_heap(*caches: Any, timeout_s: float | None = None) -> bool:
    """Once every cache has synced (``wait_synced``): a full collection, then ``gc.freeze()``
    (what the first LISTs built is never scanned by the cyclic collector again), and a higher
    first-generation threshold (a request at 5,000 names makes thousands of small objects). At
    5,000 nodes a full collection took ~60 ms, the p99 of a filter + prioritize
    (docs/benchmarks.md section 7). Returns False when a cache did not sync in time."""
    import gc

    for cache in caches:
        wait = getattr(cache, "wait_synced", None)
        if wait is not None and not wait(timeout_s):
            return False
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    return True


def _stop_caches(*caches: Any) -> None:
    for cache in caches:
        if cache is not None:
            cache.stop()


def _start_pod_cache(settings: ExtenderSettings, ledger: Ledger) -> tuple[Any, PodProblems]:
    """The pod list+watch behind the ledger's bound placements, each change handed to
    ``ledger.pod_changed`` (``None`` with ``settle_s`` 0, or when it cannot be configured: the
    extender then filters on telemetry alone, without reservations)."""
    from ..kube import KubeError, PodCache

    problems = PodProblems()
    if settings.settle_s <= 0:
        return None, problems
    selector = "spec.nodeName!="
    if settings.scheduler_name:
        selector = f"spec.schedulerName={settings.scheduler_name},{selector}"

    def transform(pod: Any, previous: Any) -> Any:
        return placement_from_pod(pod, previous, now=time.monotonic(),
                                  read_need=need_reader(settings))  # fmt: skip

    def on_error(err: KubeError) -> None:
        log.warning("pod cache (in-flight placements): {}", err)

    try:
        pods = PodCache(
            transform,
            field_selector=selector,
            kubeconfig=settings.kubeconfig,
            on_error=on_error,
            on_skip=problems.skipped,
            on_change=ledger.pod_changed,
        )
    except KubeError as err:
        log.error("pod cache (in-flight placements off): {}", err)
        return None, problems
    return pods.start(), problems


def _start_lease_cache(settings: ExtenderSettings) -> Any:
    """The list+watch of the agents' Leases in ``lease_namespace`` (``None`` when it is empty
    or the cache cannot be configured: nodes are then judged by their telemetry's times)."""
    from ..kube import KubeError, LeaseCache

    if not settings.lease_namespace:
        return None
    problems = LeaseProblems()
    leases: Any = None

    def transform(lease: Any) -> LeaseState:
        meta = lease.get("metadata") if isinstance(lease, dict) else None
        key = (meta or {}).get("name", "")
        name = f"{settings.lease_namespace}/{key}"
        # the state held before: when this watch saw renewTime change (core.rules.liveness)
        before = leases.get(key) if leases is not None and isinstance(key, str) else None
        state = lease_from_object(lease, before, time.monotonic())
        problems.good(name)
        return state

    def on_skip(name: str, exc: Exception) -> None:
        problems.skipped(f"{settings.lease_namespace}/{name}", exc)

    def on_error(err: KubeError) -> None:
        log.warning("lease cache: {}", err)

    try:
        leases = LeaseCache(
            transform,
            settings.lease_namespace,
            kubeconfig=settings.kubeconfig,
            on_error=on_error,
            on_skip=on_skip,
        )
    except KubeError as err:
        log.error("lease cache (Lease liveness off): {}", err)
        return None
    return leases.start()

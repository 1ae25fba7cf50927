"""The one place that wires the stages: read -> cache -> assess -> render -> write.

``Agent.tick()`` runs one pass and can be called alone (tests, ``omaticaya once``); the agent
only ticks. Its lifecycle is ``agent.daemon.Daemon``'s: the APScheduler 3.x schedule, the
signals, the API writer thread, the watchdog and the cleanup on exit; a scheduled tick is the
read path here (``read_path``: read, cache, tell the listeners) and the API work (``write``)
handed to the writer thread, so that a slow API server never delays a reading. Liveness goes
on a ``coordination.k8s.io``
Lease renewed every ``heartbeat_s``, or on the Node's telemetry annotation
(``agent.heartbeat``); the Node is written by ``agent.node_writer`` within the write budget; API
outages are logged once and refusals paced (``agent.outage``); GPU health changes become Node
Events (``agent.events``).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Literal

from loguru import logger

from ..core.config.settings import Settings, stuck_after_s
from ..core.model.sayonce import SayOnce
from ..core.model.snapshot import NodeSnapshot, Reader
from ..core.model.window import PeakWindow
from ..core.publish.patch import MergePatch
from ..core.publish.readings import TickListener, TickResult
from ..core.publish.render import Desired, render
from ..core.rules.attribution import GpuAttribution
from ..core.rules.health import NodeHealth, XidLedger, assess
from ..kube import KubeError, KubeNotFound, LeaseClient
from ..kube.pod_client import PodClient
from ..sources.mps import MpsWatch
from .attribution_reader import Attribution, make_attribution
from .events import HealthEvents, SliceWatch
from .heartbeat import Heartbeat
from .node_writer import NodeWriter, TelemetryFeed
from .outage import ApiOutage
from .state import AgentStopping, Runner, SnapshotCache
from .wiring import (
    NodeApi,
    enforcement_now,
    mps_watch,
    refresh_s,
    resourceslice_writer,
    xid_policy,
)
from .xid_seed_reader import XidSeeder

__all__ = ["Agent", "AgentStopping", "NodeApi", "SnapshotCache", "TickResult"]


class Agent:
    """Labels one Node from one reader.

    - ``api``: the way to the Node (``NodeApi``: its client, dry run, the liveness Lease).
    - ``clock``: monotonic seconds for heartbeat and probe bookkeeping.
    - ``attribution``: who uses each GPU (``Attribution``); ``"auto"``: as the settings ask
      (``make_attribution``); ``None``: nobody is attributed.
    """

    def __init__(
        self,
        settings: Settings,
        reader: Reader,
        api: NodeApi,
        *,
        clock: Callable[[], float] = time.monotonic,
        attribution: Attribution | None | Literal["auto"] = "auto",
    ) -> None:
        self.settings = settings
        self.reader = reader
        self.node = api.node
        self.dry_run = api.dry_run
        self.clock = clock
        self.cache = SnapshotCache(clock)
        self.period_s = settings.schedule.period_s()
        #: the longest the telemetry annotation goes unrewritten while the agent runs
        #: (``wiring.refresh_s``)
        self.refresh_s = refresh_s(settings, self.period_s)
        self._wire_health(settings)
        self.heartbeat = Heartbeat(
            api.liveness_lease(settings, self.refresh_s), settings.heartbeat_s, self.cache
        )
        self._wire_attribution(settings, attribution)
        self._wire_writers(settings, api)
        self._wire_threads()

    def _wire_health(self, settings: Settings) -> None:
        """The health side: the Xid rules and ledger (seeded from the Node's telemetry), the
        Events, the API outage bookkeeping and the stuck-tick bound."""
        self.policy = xid_policy(settings)
        self.ledger = XidLedger(self.policy)
        #: carries Xid health over a restart from the Node's telemetry (until the first seed)
        self.xid_seeder = XidSeeder(self.node, settings.prefix) if self.node is not None else None
        self.events = HealthEvents()
        #: no finished tick for this long: /healthz fails (``SnapshotCache.tick_overdue``); the
        #: device plugin applies the same bound to the age of the reading it serves
        self.cache.stuck_after_s = stuck_after_s(settings)
        self.outage = ApiOutage(self.period_s, self.cache)
        self.slow_warned_s = float("-inf")  # the last slow-tick warning (``guarded``)

    def _wire_attribution(
        self, settings: Settings, attribution: Attribution | None | Literal["auto"]
    ) -> None:
        """Who uses each GPU (PodResources + /proc) and, with shared GPUs, the slices' pods
        named from the API and the MPS daemons' watch."""
        self.attribution = make_attribution(settings) if attribution == "auto" else attribution
        self.last_attribution: dict[str, GpuAttribution] = {}
        #: the device IDs the kubelet's last PodResources list that answered names as assigned,
        #: and when (``clock``) it was asked for (``None``: none answered): the device plugin's
        self.last_listed: tuple[frozenset[str], float] | None = None
        #: shared GPUs enforced by CUDA MPS: the daemons' states (``wiring.mps_watch``)
        self.mps: MpsWatch | None = mps_watch(settings)
        #: shared GPUs: the pods holding slices named from the API, over-use Events
        self.slices = (
            SliceWatch(settings, self.events.posted, self.mps) if settings.shared_gpus else None
        )
        if self.slices is not None and self.attribution is not None:
            self.attribution.names = self.slices.names.maps

    def _wire_writers(self, settings: Settings, api: NodeApi) -> None:
        """What writes the Node (its labels and telemetry within the write budget, with the
        peak window) and its DRA ResourceSlice."""
        #: the peak signal (least free memory, p95 utilisation) per GPU over ``window_s``
        self.window = PeakWindow(settings.window_s) if settings.window_s > 0 else None
        feed = TelemetryFeed(self.refresh_s, self.window, enforcement_now(self.mps))
        self.writer = NodeWriter(
            settings, self.node, self.heartbeat, self.cache, feed, dry_run=self.dry_run
        )
        #: the Node's DRA ResourceSlice (``OMATICAYA_DRA``), kept in step with each tick
        self.resourceslice_writer = resourceslice_writer(settings, api, self.cache, self.mps)

    def _wire_threads(self) -> None:
        """The locks the read path, the API work and the cleanup take, the stop flag, what is
        said once, and the tick's listeners."""
        self._said: SayOnce[str, bool] = SayOnce()  # NVML unreadable
        self._slice_failing: SayOnce[str, bool] = SayOnce()  # ResourceSlice writes, by error
        self._dropped_seen: set[tuple[str, str]] = set()
        #: held by each tick's read path (and by a whole ``tick()``)
        self.tick_lock = threading.Lock()
        #: held by each round of API work and by the exit cleanup (see ``write``)
        self.write_lock = threading.Lock()
        self._stopping = threading.Event()
        #: the ``agent.daemon.Daemon`` running this agent (``None``: ticked by hand); the probes
        #: and metrics read its ``running`` and ``watchdog``
        self.daemon: Runner | None = None
        #: called once per tick with the reading and its health, as soon as they are cached and
        #: before any API request (the device plugin listens here; an outage must not delay it)
        self.on_tick: list[TickListener] = []

    # -- one tick --------------------------------------------------------------------------

    def evaluate(self, with_telemetry: bool = True) -> tuple[NodeSnapshot, NodeHealth, Desired]:
        """Read, assess and render, with no API request (``with_telemetry``: see ``render``).
        Each stage is noted in the cache, so that a stuck one can be named."""
        self.cache.stage("read")
        snapshot = self.reader.read()
        if self.window is not None:
            self.window.add(snapshot)
        if self.attribution is not None:
            self.cache.stage("attribution")
            listed_at_s = self.clock()  # before the kubelet is asked: what it had recorded by then
            self.last_attribution = self.attribution.observe(snapshot)
            self.last_listed = (
                (frozenset(d for a in self.last_attribution.values() for h in a.holders
                           for d in h.device_ids), listed_at_s)
                if getattr(self.attribution, "listed", False) else None
            )  # fmt: skip
        self.cache.stage("render")
        if self.xid_seeder is not None:
            self.xid_seeder = self.xid_seeder.seed(self.ledger, snapshot, self.writer)
        self.ledger.record(snapshot.xid_events)
        health = assess(snapshot, self.ledger.recent(snapshot.clock_s), self.policy)
        previous = self.cache.last.desired.labels if self.cache.last is not None else None
        desired = render(
            snapshot, health, self.settings, previous, with_telemetry=with_telemetry,
            attribution=self.last_attribution,
        )
        for key, value in desired.dropped:
            if (key, value) not in self._dropped_seen:  # once per bad pair, not every tick
                self._dropped_seen.add((key, value))
                logger.warning("dropped invalid label {}={!r}", key, value)
        self._log_nvml(snapshot)
        return snapshot, health, desired

    def _log_nvml(self, snapshot: NodeSnapshot) -> None:
        if snapshot.error is None:
            if self._said.end("nvml") is not None:
                logger.info("NVML readable again: {} GPUs", len(snapshot.gpus))
        elif self._said.start("nvml", True):
            logger.error("NVML cannot be read ({}): gpu.health=Unknown, retrying", snapshot.error)

    @property
    def lease(self) -> LeaseClient | None:
        """The liveness Lease; ``None`` in annotation-heartbeat mode (see ``Heartbeat``)."""
        return self.heartbeat.lease

    @property
    def events_posted(self) -> Counter[str]:
        """Node Events posted, by reason (``GpuUnhealthy``, ``GpuRecovered``)."""
        return self.events.posted

    def tick(self) -> TickResult:
        """One pass: read -> cache -> assess -> render -> diff -> patch, the API work inline.

        Returns what was done. Raises ``KubeError`` when the API server cannot be reached or
        refuses (after the edge's retries); the reading is cached before that. Raises
        ``AgentStopping`` after ``stop()``: a tick must never put back what the cleanup removed.
        """
        with self.tick_lock:
            result, now_s = self.read_path()
            result = self.write(result, now_s)
            self.cache.store(result, now_s)
            return result

    def read_path(self) -> tuple[TickResult, float]:
        """Read, assess, render, cache and tell the listeners (no API request); returns the
        result and the agent-clock time it was read at. Call under ``tick_lock``. Raises
        ``AgentStopping`` after ``stop()``."""
        if self._stopping.is_set():
            raise AgentStopping("the agent is stopping: no more ticks")
        started = time.perf_counter()
        now_s = self.clock()
        try:
            snapshot, health, desired = self.evaluate(with_telemetry=False)
            result = TickResult(snapshot, health, desired, None, False, self.last_attribution)
            self.cache.store(result, now_s)
            self.cache.stage("listeners")
            self._notify(result)  # health is known before any API request: tell listeners now
        finally:
            self.cache.stage(None)
            self.cache.ticks += 1
            self.cache.tick_seconds.observe(time.perf_counter() - started)
        return result, now_s

    def _notify(self, result: TickResult) -> None:
        for listener in self.on_tick:
            try:
                listener(result)
            except Exception:  # noqa: BLE001 - a listener must not stop the agent
                logger.exception("on_tick listener failed")

    def write(self, result: TickResult, now_s: float) -> TickResult:
        """The API work of a tick: renew the Lease when due, bring the Node to
        ``result.desired`` within the write budget, post the Events due; returns ``result``
        with the desired state written, the patch and whether it was sent. Runs under
        ``write_lock``. Raises ``AgentStopping`` after ``stop()`` (nothing is written after the
        cleanup), ``KubeError`` when the API server cannot be reached or refuses (after the
        edge's retries; logged once per outage)."""
        snapshot, health, desired, attribution = (
            result.snapshot, result.health, result.desired, result.attribution
        )
        with self.write_lock:
            if self.stopping:
                raise AgentStopping("the agent is stopping: no more writes")
            if self.outage.paused(now_s):  # RBAC refused us: do not hammer
                return result
            started = time.perf_counter()
            try:
                if self.heartbeat.lease_due(now_s) and not self.dry_run:
                    if self.heartbeat.renew(now_s):
                        self.writer.forget()  # re-read the Node each heartbeat: re-created, edited
                        if self.resourceslice_writer is not None:
                            self.resourceslice_writer.forget()
                desired, patch, sent = self.writer.write(
                    desired, snapshot, health, now_s, attribution
                )
                self.outage.ok(now_s)
                self.write_slice(snapshot, health, now_s)
                if self.node is not None and not self.dry_run:
                    self.post_events(health, snapshot, attribution)
            except KubeNotFound as exc:
                self.writer.forget()
                self.outage.failed(exc, now_s)
                raise
            except KubeError as exc:
                self.outage.failed(exc, now_s)
                raise
            finally:
                self.cache.write_seconds.observe(time.perf_counter() - started)
        return TickResult(snapshot, health, desired, patch, sent, attribution)

    def write_slice(self, snapshot: NodeSnapshot, health: NodeHealth, now_s: float) -> None:
        """Bring the Node's DRA ResourceSlice to this reading (``resourceslice_writer``; nothing without
        ``OMATICAYA_DRA``). A failure is logged once per kind until a write succeeds, counted
        (``omaticaya_resourceslice_errors``) and retried next tick; the Node's labels do not
        wait for it."""
        if self.resourceslice_writer is None:
            return
        uid = self.writer.meta.uid if self.writer.meta else None
        try:
            self.resourceslice_writer.write(snapshot, health, uid, now_s)
        except KubeError as exc:
            if self._slice_failing.start(type(exc).__name__, True):
                logger.error("could not write the ResourceSlice (retried each tick): {}", exc)
            return
        for kind in list(self._slice_failing.current):
            self._slice_failing.end(kind)
            logger.info("ResourceSlice written again")

    def post_events(
        self, health: NodeHealth, snapshot: NodeSnapshot, att: Mapping[str, GpuAttribution]
    ) -> None:
        """Post the Events due (health changes and out-of-band memory on the Node; with shared
        GPUs, the slices' pods named and their over-use on the pod, and on the Node too when
        the GPU's MPS daemon was up and should have held it); never raises."""
        assert self.node is not None
        uid = self.writer.meta.uid if self.writer.meta else ""
        self.events.post(self.node, uid, health, snapshot)
        threshold = self.settings.out_of_band_event_mib
        if threshold > 0 and att:
            self.events.post_out_of_band(self.node, uid, att, snapshot, threshold)
        if self.slices is not None and att:
            pods = PodClient(self.node.session, self.node.node_name)
            node = self.node

            def node_event(reason: str, message: str) -> None:
                node.create_node_event(node_uid=uid, reason=reason, message=message, warning=True)

            self.slices.round(pods, snapshot, att, self.clock(), node_event=node_event)

    def safe_tick(self) -> None:
        """``tick()`` (the API work inline) that never raises: every failure is logged (once per
        outage) and counted, so that a loop of them goes on."""
        self.guarded(self.tick)

    def guarded(self, tick: Callable[[], object]) -> None:
        """Run ``tick`` so that it never raises: every failure is logged (an API outage once,
        in ``ApiOutage``) and counted, so the schedule goes on; a tick that took more than half
        the period is warned about at most every 5 min."""
        started = self.clock()
        try:
            tick()
        except AgentStopping:
            return
        except KubeError:
            pass  # logged once per outage in ApiOutage.failed
        except Exception:  # noqa: BLE001 - the daemon must survive any bug in one tick
            self.cache.tick_errors += 1
            logger.exception("tick failed")
        took_s = self.clock() - started
        if took_s > self.period_s / 2 and started - self.slow_warned_s > 300:
            self.slow_warned_s = started
            logger.warning(
                "a tick took {:.2f}s, more than half the {:.3g}s interval; later ticks may be "
                "skipped (warned at most every 5 min)", took_s, self.period_s
            )

    def cleanup(self, *, keep_static: bool) -> MergePatch | None:
        """Remove our keys from the Node: the dynamic ones (``keep_static``) or all of them.
        Returns the patch sent, or ``None`` when there was nothing to remove. Raises
        ``KubeError``."""
        return self.writer.cleanup(keep_static=keep_static)

    # -- stopping --------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """True once ``stop()`` was called."""
        return self._stopping.is_set()

    def stop(self) -> None:
        """No more ticks or writes (``AgentStopping``); safe from a signal handler.

        Starts the shutdown deadline (``settings.shutdown_timeout_s`` from now): from here on
        the Kubernetes edge retries nothing and cuts each request to the time left, so that
        the tick in flight and the cleanup end before the kubelet's SIGKILL. The schedule is
        the ``Daemon``'s to stop (``Daemon.stop``)."""
        if not self._stopping.is_set():
            self._stopping.set()
            if self.node is not None:
                self.node.begin_shutdown(time.monotonic() + self.settings.shutdown_timeout_s)

    @property
    def node_name(self) -> str:
        return self.settings.node_name or ""

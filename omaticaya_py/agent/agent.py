"""The one place that wires the stages: read -> cache -> assess -> render -> diff -> patch.

``Agent.tick()`` runs one pass and can be called alone (tests, ``omaticaya once``);
``Agent.run()`` calls it from an APScheduler 3.x ``BlockingScheduler`` (one instance at a time,
misfires coalesced) until SIGTERM/SIGINT, then finishes the tick in flight, removes the dynamic
labels (unless ``cleanup_on_exit`` is off) and returns.

The Node's metadata is cached from the last GET or merge-patch response, so a tick in which no
value changed sends no request at all. The telemetry annotation is rewritten with any label
change; liveness goes on a ``coordination.k8s.io`` Lease renewed every ``heartbeat_s`` (the
Node is re-read then, not written), or, where the agent has no namespace of its own or its RBAC
lacks Leases (an older chart: said once), on the annotation rewritten every ``heartbeat_s``.
Each patch response is checked against the desired state, so a Node that was re-created or
edited by hand is put right at once. The write budget (``min_patch_interval_s``) holds back a
change that makes the Node more attractive until the interval since the last patch has passed;
one that makes it less attractive goes at once (``core.budget``).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

from loguru import logger
from prometheus_client import Histogram

from ..core.budget import hold_back, urgent
from ..core.health import NodeHealth, XidLedger, XidPolicy, assess
from ..core.patch import MergePatch, NodeMeta, apply_patch, diff, diff_section, removal_patch
from ..core.render import Desired, is_static, render, telemetry_annotation
from ..core.schema import TELEMETRY
from ..core.settings import Settings
from ..core.snapshot import NodeSnapshot, Reader
from ..kube import KubeError, KubeForbidden, LeaseClient, NodeClient, NodeNotFound
from ..kube.lease import lease_name, lease_namespace

__all__ = ["Agent", "AgentStopping", "SnapshotCache", "TickResult"]


class AgentStopping(RuntimeError):
    """``tick()`` was called after ``stop()``: nothing is read or written any more."""


@dataclass(frozen=True)
class TickResult:
    """What one tick saw and did: ``patch`` is the merge patch computed (``None``: nothing
    changed), ``sent`` whether it reached the API server."""

    snapshot: NodeSnapshot
    health: NodeHealth
    desired: Desired
    patch: MergePatch | None
    sent: bool


class SnapshotCache:
    """The last tick's results and the times of the last good read and patch.

    Written by the tick thread, read by ``/metrics`` and the probes; each attribute is replaced
    whole, so readers never see a half-written value. Times are ``time.monotonic()`` seconds.
    """

    def __init__(self) -> None:
        self.last: TickResult | None = None
        self.last_read_ok_s: float | None = None
        self.last_api_ok_s: float | None = None
        self.last_patch_wall_s: float | None = None
        self.patches_sent = 0
        self.patches_held = 0  # ticks whose patch the write budget held back
        self.lease_renewals = 0
        self.lease_failures = 0
        self.lease_fallbacks = 0  # 403 on the Lease: heartbeat back on the Node annotation
        self.labels_changed = 0
        self.ticks = 0
        self.tick_errors = 0
        self.tick_seconds = Histogram(
            "omaticaya_tick_duration_seconds",
            "Wall time of one tick: read, render, diff and patch.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=None,
        )

    def store(self, result: TickResult, now_s: float) -> None:
        self.last = result
        if result.snapshot.error is None:
            self.last_read_ok_s = now_s


class Agent:
    """Labels one Node from one reader.

    - ``node``: the Kubernetes edge; ``None`` (dry run without API) diffs against an empty Node.
    - ``dry_run``: compute patches but never send them (the Node is still read if reachable).
    - ``clock``: monotonic seconds for heartbeat and probe bookkeeping.
    - ``lease``: the liveness Lease; ``"auto"`` holds ``omaticaya-node-<node>`` in the agent's
      own namespace (``POD_NAMESPACE`` in ``environ``, else the service account's), or none
      when there is no such namespace (outside a cluster) or no ``node``; ``None``: no Lease,
      the heartbeat goes on the Node's telemetry annotation.
    """

    def __init__(
        self,
        settings: Settings,
        reader: Reader,
        node: NodeClient | None,
        *,
        dry_run: bool = False,
        clock: Callable[[], float] = time.monotonic,
        lease: LeaseClient | None | str = "auto",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.reader = reader
        self.node = node
        self.dry_run = dry_run
        self.clock = clock
        self.cache = SnapshotCache()
        self.policy = XidPolicy(
            ignore=settings.xid_ignore,
            all_fatal=settings.xid_all_fatal,
            quiet_s=settings.xid_quiet_s,
        )
        self.ledger = XidLedger(self.policy)
        self.telemetry_key = f"{settings.prefix}/{TELEMETRY}"
        self.events_posted: Counter[str] = Counter()
        self._meta: NodeMeta | None = None
        self._telemetry_at_s: float | None = None
        self._api_failing_since: float | None = None
        self._forbidden = 0  # consecutive 401/403 answers
        self._api_paused_until_s = float("-inf")
        self.period_s = settings.schedule.period_s()
        #: the longest the telemetry annotation goes unrewritten while the agent runs: it is
        #: rewritten on the first tick after the heartbeat is due (published as ``refresh_s``
        #: and ``expires_at``, so that readers judge staleness by the publisher's own pace)
        self.refresh_s = settings.heartbeat_s + self.period_s + settings.jitter_s
        self._slow_warned_s = float("-inf")
        self._last_patch_s: float | None = None
        self._lease_at_s: float | None = None
        self._lease_failing = False
        self.lease = self._make_lease(lease, os.environ if environ is None else environ)
        self._nvml_failing = False
        self._dropped_seen: set[tuple[str, str]] = set()
        # GPU UUID (index when NVML gave none) -> health last put in an Event: indices shift
        # when a GPU is gone after a re-init, UUIDs do not
        self._reported_healthy: dict[str | int, bool] = {}
        self._tick_lock = threading.Lock()
        self._stopping = threading.Event()
        self._signals_installed = False
        self._scheduler: Any = None
        #: called once per tick with the reading and its health, as soon as they are cached and
        #: before any API request (the device plugin listens here; an outage must not delay it)
        self.on_tick: list[Callable[[TickResult], None]] = []

    # -- one tick --------------------------------------------------------------------------

    def evaluate(self, with_telemetry: bool = True) -> tuple[NodeSnapshot, NodeHealth, Desired]:
        """Read, assess and render, with no API request (``with_telemetry``: see ``render``)."""
        snapshot = self.reader.read()
        self.ledger.record(snapshot.xid_events)
        health = assess(snapshot, self.ledger.recent(snapshot.clock_s), self.policy)
        previous = self.cache.last.desired.labels if self.cache.last is not None else None
        desired = render(
            snapshot, health, self.settings, previous, with_telemetry=with_telemetry
        )
        for key, value in desired.dropped:
            if (key, value) not in self._dropped_seen:  # once per bad pair, not every tick
                self._dropped_seen.add((key, value))
                logger.warning("dropped invalid label {}={!r}", key, value)
        self._log_nvml(snapshot)
        return snapshot, health, desired

    def _log_nvml(self, snapshot: NodeSnapshot) -> None:
        if snapshot.error is not None and not self._nvml_failing:
            logger.error("NVML cannot be read ({}): gpu.health=Unknown, retrying", snapshot.error)
        elif snapshot.error is None and self._nvml_failing:
            logger.info("NVML readable again: {} GPUs", len(snapshot.gpus))
        self._nvml_failing = snapshot.error is not None

    def _current(self) -> NodeMeta:
        if self._meta is None:
            if self.node is None:
                self._meta = NodeMeta(name=self.settings.node_name or "")
            else:
                self._meta = self.node.get_node()
        return self._meta

    def _make_lease(self, lease: LeaseClient | None | str, environ: Mapping[str, str]) -> LeaseClient | None:
        if lease != "auto":
            return lease  # type: ignore[return-value]
        if self.node is None or self.dry_run:
            return None
        namespace = lease_namespace(environ)
        if namespace is None:
            logger.debug("no namespace of its own (outside a cluster): heartbeat on the Node")
            return None
        node = self.settings.node_name or self.node.node_name
        return LeaseClient(
            self.node.session,
            namespace=namespace,
            name=lease_name(node),
            holder=(environ.get("POD_NAME") or "").strip() or node,
            duration_s=self.refresh_s,
        )

    def _heartbeat_due(self, now_s: float) -> bool:
        """Whether the Node's telemetry annotation is due for its heartbeat rewrite: never while
        a Lease carries liveness."""
        if self.lease is not None:
            return False
        return (
            self._telemetry_at_s is None
            or now_s - self._telemetry_at_s >= self.settings.heartbeat_s
        )

    def _points_elsewhere(self, current: NodeMeta) -> bool:
        """In Lease mode, the Node's telemetry does not name our Lease (written by an older
        version, or before a fallback): rewrite it once, so that readers know where to look."""
        value = current.annotations.get(self.telemetry_key)
        return (
            self.lease is not None
            and value is not None
            and f'"lease":"{self.lease.ref}"' not in value
        )

    def _lease_due(self, now_s: float) -> bool:
        return self.lease is not None and (
            self._lease_at_s is None or now_s - self._lease_at_s >= self.settings.heartbeat_s
        )

    def _renew_lease(self, now_s: float) -> None:
        """Renew the Lease. A 403 (RBAC without Leases: an older chart) turns the Lease off for
        good and the heartbeat back onto the Node annotation, said once; any other failure is
        logged once per streak and tried again next tick, never stopping the Node's patch."""
        assert self.lease is not None
        try:
            self.lease.renew()
        except KubeForbidden as exc:
            if exc.status != 403:  # 401: the credentials, not RBAC; the Node will say so too
                self._lease_failed(exc)
                return
            self.cache.lease_fallbacks += 1
            logger.warning(
                "no permission on Lease {} ({}): liveness goes on the Node's telemetry annotation "
                "every {:.3g}s instead (an older chart? it needs get/create/update on leases in "
                "the agent's namespace)", self.lease.ref, exc, self.settings.heartbeat_s,
            )
            self.lease = None
            self._telemetry_at_s = None  # the annotation's heartbeat is due now
            return
        except KubeError as exc:
            self._lease_failed(exc)
            return
        if self._lease_failing:
            logger.info("Lease {} renewed again", self.lease.ref)
        self._lease_failing = False
        self._lease_at_s = now_s
        self.cache.lease_renewals += 1
        self._meta = None  # re-read the Node at each heartbeat: re-created or edited behind us

    def _lease_failed(self, exc: KubeError) -> None:
        assert self.lease is not None
        self.cache.lease_failures += 1
        if not self._lease_failing:
            logger.error("could not renew Lease {}: {}; retrying each tick", self.lease.ref, exc)
        self._lease_failing = True

    def _with_telemetry(
        self, desired: Desired, snapshot: NodeSnapshot, health: NodeHealth, current: NodeMeta,
        now_s: float,
    ) -> Desired:
        """``desired`` with the telemetry annotation: built afresh only when a patch will carry
        it (a label changes, the heartbeat is due, or the Node lacks it), else the Node's own
        value, so that a quiet tick costs no JSON encoding."""
        key, prefix = self.telemetry_key, self.settings.prefix
        if (
            self._heartbeat_due(now_s)
            or self._points_elsewhere(current)
            or key not in current.annotations
            or diff_section(desired.labels, current.labels, prefix)
        ):
            annotations, bad = telemetry_annotation(
                snapshot,
                health,
                prefix,
                refresh_s=None if self.lease is not None else self.refresh_s,
                lease=self.lease.ref if self.lease is not None else None,
            )
            for k, v in bad:
                logger.warning("dropped invalid annotation {}={!r}", k, v)
        else:
            annotations = {key: current.annotations[key]}
        return replace(desired, annotations=annotations)

    def _diff(self, desired: Desired, current: NodeMeta, now_s: float) -> MergePatch | None:
        refresh = self._heartbeat_due(now_s) or self._points_elsewhere(current)
        return diff(
            desired.labels,
            desired.annotations,
            current,
            self.settings.prefix,
            volatile=(self.telemetry_key,),
            refresh=refresh,
        )

    def _send(self, patch: MergePatch, now_s: float) -> None:
        assert self.node is not None
        before = self._meta
        self._meta = self.node.patch_node(patch)
        self.cache.patches_sent += 1
        self.cache.labels_changed += len(patch["metadata"].get("labels", {}))
        self.cache.last_patch_wall_s = time.time()
        self._last_patch_s = now_s
        if self.telemetry_key in patch["metadata"].get("annotations", {}):
            self._telemetry_at_s = now_s
        if before is not None and before.uid and self._meta.uid != before.uid:
            logger.warning("Node {} was re-created (uid changed): relabelling", self._meta.name)

    def tick(self) -> TickResult:
        """One pass: read -> cache -> assess -> render -> diff -> patch.

        Returns what was done. Raises ``KubeError`` when the API server cannot be reached or
        refuses (after the edge's retries); the reading is cached before that. Raises
        ``AgentStopping`` after ``stop()``: a tick must never put back what the cleanup removed.
        """
        with self._tick_lock:
            if self._stopping.is_set():
                raise AgentStopping("the agent is stopping: no more ticks")
            started = time.perf_counter()
            now_s = self.clock()
            snapshot, health, desired = self.evaluate(with_telemetry=False)
            result = TickResult(snapshot, health, desired, None, False)
            self.cache.store(result, now_s)
            self._notify(result)  # health is known before any API request: tell listeners now
            if now_s < self._api_paused_until_s:  # RBAC refused us: do not hammer
                self.cache.ticks += 1
                return result
            try:
                if self._lease_due(now_s) and not self.dry_run:
                    self._renew_lease(now_s)
                current = self._current()
                desired = self._with_telemetry(desired, snapshot, health, current, now_s)
                patch = self._diff(desired, current, now_s)
                sent = False
                if patch is not None and self._hold(patch, desired, current, now_s):
                    self.cache.patches_held += 1
                elif patch is not None and not self.dry_run and self.node is not None:
                    self._send(patch, now_s)
                    sent = True
                    again = self._diff(desired, self._meta, now_s)  # type: ignore[arg-type]
                    if again is not None:  # re-created or edited behind our back
                        self._send(again, now_s)
                elif patch is not None and self.node is None:
                    self._meta = apply_patch(current, patch)
                self._api_ok(now_s)
                if self.node is not None and not self.dry_run:
                    self._post_health_events(health, snapshot)
            except NodeNotFound as exc:
                self._meta = None
                self._api_failed(exc, now_s)
                raise
            except KubeError as exc:
                self._api_failed(exc, now_s)
                raise
            finally:
                self.cache.ticks += 1
                self.cache.tick_seconds.observe(time.perf_counter() - started)
            result = TickResult(snapshot, health, desired, patch, sent)
            self.cache.store(result, now_s)
            return result

    def _hold(self, patch: MergePatch, desired: Desired, current: NodeMeta, now_s: float) -> bool:
        """The write budget: hold back a patch that makes the Node no less attractive while the
        last patch is under ``min_patch_interval_s`` old (never a heartbeat, never the first)."""
        interval_s = self.settings.min_patch_interval_s
        if interval_s <= 0 or self._heartbeat_due(now_s) or "labels" not in patch["metadata"]:
            return False
        mine = self.settings.prefix + "/"
        before = {k: v for k, v in current.labels.items() if k.startswith(mine)}
        held = hold_back(now_s, self._last_patch_s, interval_s, urgent(before, desired.labels))
        if held:
            logger.debug("write budget: holding back {} label changes", len(patch["metadata"]["labels"]))
        return held

    def _notify(self, result: TickResult) -> None:
        for listener in self.on_tick:
            try:
                listener(result)
            except Exception:  # noqa: BLE001 - a listener must not stop the agent
                logger.exception("on_tick listener failed")

    def _api_ok(self, now_s: float) -> None:
        self.cache.last_api_ok_s = now_s
        self._forbidden = 0
        if self._api_failing_since is not None:
            logger.info(
                "Kubernetes API reachable again after {:.1f}s", now_s - self._api_failing_since
            )
            self._api_failing_since = None

    def _api_failed(self, exc: KubeError, now_s: float) -> None:
        if isinstance(exc, KubeForbidden):
            # a refusal will not fix itself within seconds: back off, doubling, up to 5 min
            self._forbidden += 1
            pause_s = min(300.0, self.period_s * 2 ** (self._forbidden - 1))
            self._api_paused_until_s = now_s + pause_s
        if self._api_failing_since is None:
            self._api_failing_since = now_s
            hint = " (check RBAC)" if isinstance(exc, KubeForbidden) else ""
            logger.error("Kubernetes API request failed{}: {}; will retry each tick", hint, exc)
        else:
            logger.debug("Kubernetes API still failing: {}", exc)

    def _post_health_events(self, after: NodeHealth, snapshot: NodeSnapshot) -> None:
        """An Event for each GPU whose health differs from the last one reported (by UUID); a
        GPU whose Event could not be posted (API down) is compared again next tick, so no change
        is lost. A GPU starts as healthy: one unhealthy at the first reading gets its Event too."""
        uuids = {g.index: g.uuid for g in snapshot.gpus}
        for index, gpu in after.gpus.items():
            key: str | int = uuids.get(index) or index
            if self._reported_healthy.get(key, True) == gpu.healthy:
                continue
            reason = "GpuRecovered" if gpu.healthy else "GpuUnhealthy"
            detail = "healthy again" if gpu.healthy else "unhealthy: " + ",".join(gpu.reasons)
            try:
                self.node.create_node_event(  # type: ignore[union-attr]
                    node_uid=self._meta.uid if self._meta else "",
                    reason=reason,
                    message=f"GPU {index} {detail}",
                    warning=not gpu.healthy,
                )
            except KubeError as exc:
                logger.warning("could not post Event {} for GPU {}: {}", reason, index, exc)
                continue
            self.events_posted[reason] += 1
            self._reported_healthy[key] = gpu.healthy

    def safe_tick(self) -> None:
        """``tick()`` for the scheduler: every failure is logged (once per outage) and counted,
        never raised, so the schedule goes on."""
        if self._stopping.is_set():
            self.stop()  # a signal that came before the scheduler ran: stop it now
            return
        started = self.clock()
        try:
            self.tick()
        except AgentStopping:
            return
        except KubeError:
            pass  # logged once per outage in _api_failed
        except Exception:  # noqa: BLE001 - the daemon must survive any bug in one tick
            self.cache.tick_errors += 1
            logger.exception("tick failed")
        took_s = self.clock() - started
        if took_s > self.period_s / 2 and started - self._slow_warned_s > 300:
            self._slow_warned_s = started
            logger.warning(
                "a tick took {:.2f}s, more than half the {:.3g}s interval; later ticks may be "
                "skipped (warned at most every 5 min)", took_s, self.period_s
            )

    # -- cleanup -----------------------------------------------------------------------------

    def cleanup(self, *, keep_static: bool) -> MergePatch | None:
        """Remove our keys from the Node: the dynamic ones (``keep_static``) or all of them.

        Reads the Node first (the cache may be stale after an outage). Returns the patch sent,
        or ``None`` when there was nothing to remove. Raises ``KubeError``."""
        if self.node is None:
            return None
        current = self.node.get_node()
        prefix = self.settings.prefix
        keep = [k for k in current.labels if keep_static and is_static(k, prefix)]
        patch = removal_patch(current, prefix, keep=keep)
        if patch is not None and not self.dry_run:
            self._meta = self.node.patch_node(patch)
        return patch

    # -- the daemon ---------------------------------------------------------------------------

    def run(self) -> None:
        """Tick on the schedule until SIGTERM/SIGINT, then clean up (see module docstring)."""
        from apscheduler.schedulers.blocking import BlockingScheduler

        schedule = self.settings.schedule
        period_s = self.period_s
        scheduler = BlockingScheduler(
            timezone=timezone.utc,
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        scheduler.add_job(
            self.safe_tick,
            schedule.trigger(jitter_s=self.settings.jitter_s),
            id="tick",
            name="omaticaya tick",
            # fleet start-up (a DaemonSet rolled out on every node at once): the first tick,
            # too, at a random point within the jitter, not all in the same second
            next_run_time=datetime.now(timezone.utc)
            + timedelta(seconds=random.uniform(0, self.settings.jitter_s)),
        )
        self._scheduler = scheduler
        self.install_signal_handlers()
        logger.info(
            "agent started: node={} schedule={!r} (~{:.3g}s) reader={} prefix={}",
            self.settings.node_name,
            schedule.text,
            period_s,
            type(self.reader).__name__,
            self.settings.prefix,
        )
        if not self._stopping.is_set():  # a signal before this point: straight to the exit
            scheduler.start()  # returns once stop() shut it down
        self.shutdown()

    def install_signal_handlers(self) -> None:
        """Make SIGTERM and SIGINT call ``stop()`` (main thread only). ``omaticaya run`` calls
        this before it starts any server, so that no signal finds the default action (which
        would kill the process with every label in place); ``run()`` calls it too."""
        if self._signals_installed:
            return

        def stop(signum: int, _frame: Any) -> None:
            logger.info("{} received: finishing the tick in flight", signal.Signals(signum).name)
            self.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self._signals_installed = True

    @property
    def stopping(self) -> bool:
        """True once ``stop()`` was called."""
        return self._stopping.is_set()

    def stop(self) -> None:
        """Ask ``run()`` to return after the tick in flight; safe from a signal handler.

        Starts the shutdown deadline (``settings.shutdown_timeout_s`` from now): from here on
        the Kubernetes edge retries nothing and cuts each request to the time left, so that
        the tick in flight and the cleanup end before the kubelet's SIGKILL."""
        if not self._stopping.is_set():
            self._stopping.set()
            if self.node is not None:
                self.node.begin_shutdown(time.monotonic() + self.settings.shutdown_timeout_s)
        if self._scheduler is not None and self._scheduler.running:
            self._scheduler.shutdown(wait=False)

    @property
    def running(self) -> bool:
        """True while the scheduler runs (the ``/healthz`` probe)."""
        return bool(self._scheduler is not None and self._scheduler.running)

    def shutdown(self) -> None:
        """After ``stop()``: wait for the tick in flight, remove the dynamic labels (unless
        ``cleanup_on_exit`` is off or ``dry_run``), close the reader and the API client. The
        tick lock is held throughout, so no tick can run during or after the cleanup."""
        self.stop()
        with self._tick_lock:
            self._cleanup_on_exit()
        self.reader.close()
        if self.node is not None:
            self.node.close()
        logger.info("agent stopped")

    def _cleanup_on_exit(self) -> None:
        if self.lease is not None and not self.dry_run and self._lease_at_s is not None:
            try:
                self.lease.release()
                logger.info("released Lease {}", self.lease.ref)
            except KubeError as exc:
                logger.warning("could not release Lease {}: {}", self.lease.ref, exc)
        if self.settings.cleanup_on_exit and not self.dry_run:
            try:
                patch = self.cleanup(keep_static=True)
                removed = len((patch or {}).get("metadata", {}).get("labels", {}))
                logger.info("removed {} dynamic labels from Node {}", removed, self.node_name)
            except KubeError as exc:
                logger.error("could not remove dynamic labels on exit: {}", exc)

    @property
    def node_name(self) -> str:
        return self.settings.node_name or ""


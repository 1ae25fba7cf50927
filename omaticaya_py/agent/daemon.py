"""The agent's lifecycle: ``Daemon`` runs one ``Agent`` on its schedule until SIGTERM/SIGINT.

``Daemon.run()`` ticks on the agent's cron schedule from an APScheduler 3.x
``BlockingScheduler`` (one tick at a time, misfires coalesced, the first one at a random point
within the jitter so that a fleet started at once does not tick in the same second; kept on its
period across wall-clock steps by ``agent.watchdog``); each tick's API work goes to the writer
thread (``agent.api_thread``). On SIGTERM/SIGINT it finishes the write in flight, releases the
Lease, removes the dynamic labels, closes the agent's edges, then stops what was started beside
it (the device plugin, the metrics server: ``serve``), last started first. The ``Agent`` only
ticks; this module is the only one that starts or stops anything.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from loguru import logger

from ..kube import KubeError
from .agent import Agent
from .api_thread import ApiWriter
from .watchdog import JOB_ID, SteadyTrigger, Watchdog

__all__ = ["Daemon"]


class Daemon:
    """Runs ``agent`` on its schedule: the scheduler, the API writer thread, the watchdog, the
    signal handlers, what runs beside it (``serve``) and the cleanup on exit. One per agent;
    ``agent.daemon`` points back at it (the probes read ``running`` and ``watchdog``)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        #: the APScheduler scheduler once ``schedule_ticks`` ran
        self.scheduler: Any = None
        #: the thread that does the API work of scheduled ticks, and the watchdog
        self.api_writer: ApiWriter | None = None
        self.watchdog: Watchdog | None = None
        self.signals_installed = False
        self._stops: list[Callable[[], object]] = []
        agent.daemon = self

    @property
    def running(self) -> bool:
        """True while the scheduler runs (the ``/healthz`` probe)."""
        return bool(self.scheduler is not None and self.scheduler.running)

    def serve(self, start: Callable[[], object] | None, stop: Callable[[], object]) -> None:
        """Run ``start`` now (``None``: already started) unless the agent is stopping, and
        ``stop`` once the agent stopped and cleaned up (the device plugin, the metrics server;
        the last one given stops first)."""
        if start is not None:
            if self.agent.stopping:
                return
            start()
        self._stops.append(stop)

    def run(self) -> None:
        """Tick on the schedule until ``stop()`` (SIGTERM/SIGINT), then ``shutdown()`` and stop
        what ``serve`` started."""
        from apscheduler.schedulers.blocking import BlockingScheduler

        agent, settings = self.agent, self.agent.settings
        try:
            scheduler = BlockingScheduler(timezone=timezone.utc)
            watchdog = self.schedule_ticks(scheduler)
            self.install_signal_handlers()
            logger.info(
                "agent started: node={} schedule={!r} (~{:.3g}s) reader={} prefix={}",
                settings.node_name,
                settings.schedule.text,
                agent.period_s,
                type(agent.reader).__name__,
                settings.prefix,
            )
            try:
                if not agent.stopping:  # a signal before this point: straight to the exit
                    scheduler.start()  # returns once stop() shut it down
            finally:
                watchdog.stop()
            self.shutdown()
        finally:
            for stop in reversed(self._stops):
                stop()

    def schedule_ticks(self, scheduler: Any, **clocks: Any) -> Watchdog:
        """Add the agent's tick to an APScheduler 3 ``scheduler`` (not started yet; one tick at
        a time, misfires coalesced, the first one at a random point within the jitter so that a
        fleet started at once does not tick in the same second), start the API writer thread
        and the watchdog (``clocks``: its ``wall``/``monotonic``, for tests). Returns the
        watchdog."""
        agent, settings = self.agent, self.agent.settings
        trigger = SteadyTrigger(settings.schedule.trigger(), agent.period_s, settings.jitter_s)
        scheduler.add_job(
            self.scheduled_tick,
            trigger,
            id=JOB_ID,
            name="omaticaya tick",
            coalesce=True,
            max_instances=1,
            misfire_grace_time=None,
            # fleet start-up (a DaemonSet rolled out on every node at once): the first tick,
            # too, at a random point within the jitter, not all in the same second
            next_run_time=datetime.now(timezone.utc)
            + timedelta(seconds=random.uniform(0, settings.jitter_s)),
        )
        self.scheduler = scheduler
        agent.cache.started_s = agent.clock()
        self.api_writer = ApiWriter(agent.write, agent.cache).start()
        self.watchdog = Watchdog(agent, scheduler, **clocks).start()
        return self.watchdog

    def scheduled_tick(self) -> None:
        """The scheduler's job: the agent's read path, then its API work handed to
        ``api_writer`` (the latest reading wins), so that ticks keep the schedule whatever the
        API server does. Never raises (``Agent.guarded``)."""
        agent = self.agent
        if agent.stopping:
            self.stop()  # a signal that came before the scheduler ran: stop it now
            return

        def tick() -> None:
            if self.api_writer is None:
                agent.tick()
                return
            with agent.tick_lock:
                result, now_s = agent.read_path()
            self.api_writer.submit(result, now_s)

        agent.guarded(tick)

    def stop(self) -> None:
        """Ask ``run()`` to return after the tick in flight (``Agent.stop``: no more ticks or
        writes, the shutdown deadline starts); safe from a signal handler."""
        self.agent.stop()
        if self.scheduler is not None and self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        if self.api_writer is not None:
            self.api_writer.stop()

    def install_signal_handlers(self) -> None:
        """Make SIGTERM and SIGINT call ``stop()`` (main thread only; once). ``omaticaya run``
        calls this before it starts any server, so that no signal finds the default action
        (which would kill the process with every label in place); ``run()`` calls it too."""
        if self.signals_installed:
            return

        def stop(signum: int, _frame: Any) -> None:
            logger.info("{} received: finishing the tick in flight", signal.Signals(signum).name)
            self.stop()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.signals_installed = True

    def shutdown(self) -> None:
        """``stop()``, then wait for the API write in flight (within the shutdown deadline),
        remove the dynamic labels (``cleanup_on_exit``) and close the reader and the API client.

        The write lock is held throughout the cleanup, so no write can run during or after it.
        A tick stuck in its read (a hung NVML call) does not hold the cleanup back; its reader
        is then left open (closing NVML under a call in flight is not safe), which is said in
        the log."""
        agent = self.agent
        self.stop()
        deadline_s = time.monotonic() + agent.settings.shutdown_timeout_s

        def left_s() -> float:
            return max(1.0, deadline_s - time.monotonic())

        if self.api_writer is not None:
            self.api_writer.join(left_s())
        if agent.write_lock.acquire(timeout=left_s()):
            try:
                self.cleanup_on_exit()
            finally:
                agent.write_lock.release()
        else:
            logger.error("an API write is still in flight: dynamic labels left in place")
        edges: list[Any] = [agent.attribution, agent.node]  # each None or with close()
        if agent.tick_lock.acquire(timeout=left_s()):
            edges.insert(0, agent.reader)
            agent.tick_lock.release()
        else:
            logger.error("a tick is stuck in '{}': its reader is left open", agent.cache.tick_stage)
        for edge in edges:
            if edge is not None:
                edge.close()
        logger.info("agent stopped")

    def cleanup_on_exit(self) -> None:
        """Release the Lease, delete the DRA ResourceSlice (``OMATICAYA_DRA``) and remove the
        dynamic labels (unless ``cleanup_on_exit`` is off or ``dry_run``); a failure is logged,
        never raised."""
        agent = self.agent
        if agent.dry_run:
            return
        # cleanup_on_exit: the Lease goes too (a rolling update's new pod creates it again)
        agent.heartbeat.release(delete=agent.settings.cleanup_on_exit)
        if not agent.settings.cleanup_on_exit:
            return
        if agent.resourceslice_writer is not None:  # its devices leave the scheduler's view now
            agent.resourceslice_writer.delete()
        try:
            patch = agent.cleanup(keep_static=True)
            removed = len((patch or {}).get("metadata", {}).get("labels", {}))
            logger.info("removed {} dynamic labels from Node {}", removed, agent.node_name)
        except KubeError as exc:
            logger.error("could not remove dynamic labels on exit: {}", exc)

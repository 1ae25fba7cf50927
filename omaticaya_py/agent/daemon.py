"""The daemon around the tick: APScheduler 3.x, SIGTERM/SIGINT, and the cleanup on exit.

``run(agent)`` ticks on the agent's cron schedule from a ``BlockingScheduler`` (one tick at a
time, misfires coalesced, the first one at a random point within the jitter so that a fleet
started at once does not tick in the same second; kept on its period across wall-clock steps by
``agent.watchdog``) until SIGTERM/SIGINT; each tick's API work goes to the writer thread
(``agent.apiwriter``). The agent then finishes the write in flight, releases its Lease and
removes its dynamic labels.
"""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from loguru import logger

from ..kube import KubeError
from .apiwriter import ApiWriter
from .watchdog import JOB_ID, SteadyTrigger, Watchdog

if TYPE_CHECKING:
    from .agent import Agent

__all__ = [
    "cleanup_on_exit", "guarded", "install_signal_handlers", "run", "schedule_ticks", "shutdown",
]


def run(agent: Agent) -> None:
    """Tick on the schedule until ``agent.stop()`` (SIGTERM/SIGINT), then ``agent.shutdown()``."""
    from apscheduler.schedulers.blocking import BlockingScheduler

    settings = agent.settings
    scheduler = BlockingScheduler(timezone=timezone.utc)
    watchdog = schedule_ticks(agent, scheduler)
    install_signal_handlers(agent)
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
    agent.shutdown()


def schedule_ticks(agent: Agent, scheduler: Any, **clocks: Any) -> Watchdog:
    """Add the agent's tick to an APScheduler 3 ``scheduler`` (not started yet; one tick at a
    time, misfires coalesced, the first one at a random point within the jitter so that a fleet
    started at once does not tick in the same second), start the API writer thread and the
    watchdog (``clocks``: its ``wall``/``monotonic``, for tests). Returns the watchdog."""
    settings = agent.settings
    trigger = SteadyTrigger(settings.schedule.trigger(), agent.period_s, settings.jitter_s)
    scheduler.add_job(
        agent.scheduled_tick,
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
    agent.scheduler = scheduler
    agent.cache.started_s = agent.clock()
    agent.api_writer = ApiWriter(agent).start()
    agent.watchdog = Watchdog(agent, **clocks).start()
    return agent.watchdog


def guarded(agent: Agent, tick: Callable[[], object]) -> None:
    """Run ``tick`` for the scheduler: every failure is logged (an API outage once, in
    ``ApiOutage``) and counted, never raised, so the schedule goes on; a tick that took more
    than half the period is warned about at most every 5 min."""
    from .agent import AgentStopping

    if agent.stopping:
        agent.stop()  # a signal that came before the scheduler ran: stop it now
        return
    started = agent.clock()
    try:
        tick()
    except AgentStopping:
        return
    except KubeError:
        pass  # logged once per outage in ApiOutage.failed
    except Exception:  # noqa: BLE001 - the daemon must survive any bug in one tick
        agent.cache.tick_errors += 1
        logger.exception("tick failed")
    took_s = agent.clock() - started
    if took_s > agent.period_s / 2 and started - agent.slow_warned_s > 300:
        agent.slow_warned_s = started
        logger.warning(
            "a tick took {:.2f}s, more than half the {:.3g}s interval; later ticks may be "
            "skipped (warned at most every 5 min)", took_s, agent.period_s
        )


def shutdown(agent: Agent) -> None:
    """``agent.stop()``, then wait for the API write in flight (within the shutdown deadline),
    remove the dynamic labels (``cleanup_on_exit``) and close the reader and the API client.

    The write lock is held throughout the cleanup, so no write can run during or after it. A
    tick stuck in its read (a hung NVML call) does not hold the cleanup back; its reader is then
    left open (closing NVML under a call in flight is not safe), which is said in the log."""
    agent.stop()
    deadline_s = time.monotonic() + agent.settings.shutdown_timeout_s

    def left_s() -> float:
        return max(1.0, deadline_s - time.monotonic())

    if agent.api_writer is not None:
        agent.api_writer.join(left_s())
    if agent.write_lock.acquire(timeout=left_s()):
        try:
            cleanup_on_exit(agent)
        finally:
            agent.write_lock.release()
    else:
        logger.error("an API write is still in flight: dynamic labels left in place")
    edges = [agent.attribution, agent.node]
    if agent.tick_lock.acquire(timeout=left_s()):
        edges.insert(0, agent.reader)
        agent.tick_lock.release()
    else:
        logger.error("a tick is stuck in '{}': its reader is left open", agent.cache.tick_stage)
    for edge in edges:
        if edge is not None:
            edge.close()
    logger.info("agent stopped")


def install_signal_handlers(agent: Agent) -> None:
    """Make SIGTERM and SIGINT call ``agent.stop()`` (main thread only; once)."""
    if agent.signals_installed:
        return

    def stop(signum: int, _frame: Any) -> None:
        logger.info("{} received: finishing the tick in flight", signal.Signals(signum).name)
        agent.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.signals_installed = True


def cleanup_on_exit(agent: Agent) -> None:
    """Release the Lease and remove the dynamic labels (unless ``cleanup_on_exit`` is off or
    ``dry_run``); a failure is logged, never raised."""
    if agent.dry_run:
        return
    # cleanup_on_exit: the Lease goes too (a rolling update's new pod creates it again)
    agent.liveness.release(delete=agent.settings.cleanup_on_exit)
    if not agent.settings.cleanup_on_exit:
        return
    try:
        patch = agent.cleanup(keep_static=True)
        removed = len((patch or {}).get("metadata", {}).get("labels", {}))
        logger.info("removed {} dynamic labels from Node {}", removed, agent.node_name)
    except KubeError as exc:
        logger.error("could not remove dynamic labels on exit: {}", exc)

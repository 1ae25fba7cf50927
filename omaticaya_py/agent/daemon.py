"""The daemon around the tick: APScheduler 3.x, SIGTERM/SIGINT, and the cleanup on exit.

``run(agent)`` ticks on the agent's cron schedule from a ``BlockingScheduler`` (one tick at a
time, misfires coalesced, the first one at a random point within the jitter so that a fleet
started at once does not tick in the same second) until SIGTERM/SIGINT; the agent then
finishes the tick in flight, releases its Lease and removes its dynamic labels.
"""

from __future__ import annotations

import random
import signal
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from loguru import logger

from ..kube import KubeError

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["cleanup_on_exit", "install_signal_handlers", "run"]


def run(agent: Agent) -> None:
    """Tick on the schedule until ``agent.stop()`` (SIGTERM/SIGINT), then ``agent.shutdown()``."""
    from apscheduler.schedulers.blocking import BlockingScheduler

    settings = agent.settings
    scheduler = BlockingScheduler(
        timezone=timezone.utc,
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
    )
    scheduler.add_job(
        agent.safe_tick,
        settings.schedule.trigger(jitter_s=settings.jitter_s),
        id="tick",
        name="omaticaya tick",
        # fleet start-up (a DaemonSet rolled out on every node at once): the first tick,
        # too, at a random point within the jitter, not all in the same second
        next_run_time=datetime.now(timezone.utc)
        + timedelta(seconds=random.uniform(0, settings.jitter_s)),
    )
    agent.scheduler = scheduler
    install_signal_handlers(agent)
    logger.info(
        "agent started: node={} schedule={!r} (~{:.3g}s) reader={} prefix={}",
        settings.node_name,
        settings.schedule.text,
        agent.period_s,
        type(agent.reader).__name__,
        settings.prefix,
    )
    if not agent.stopping:  # a signal before this point: straight to the exit
        scheduler.start()  # returns once stop() shut it down
    agent.shutdown()


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
    agent.liveness.release()
    if not agent.settings.cleanup_on_exit:
        return
    try:
        patch = agent.cleanup(keep_static=True)
        removed = len((patch or {}).get("metadata", {}).get("labels", {}))
        logger.info("removed {} dynamic labels from Node {}", removed, agent.node_name)
    except KubeError as exc:
        logger.error("could not remove dynamic labels on exit: {}", exc)

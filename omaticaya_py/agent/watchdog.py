"""The agent's watchdog: ticks that keep their period when the wall clock steps, and a stuck
tick said once.

APScheduler 3 plans each run on the wall clock and sleeps until it. Stepped back an hour, it
sleeps an hour ("the scheduler relies on the system time being correct": agronholm/apscheduler
#351); stepped forward years, it lists every missed fire time before coalescing them, which
hangs the process (#35, #526, #1066). ``SteadyTrigger`` wraps the schedule's trigger and skips a
long run of missed fire times at once; ``Watchdog`` looks at the wall clock against the
monotonic clock every second (every period, if shorter) and, when it stepped, moves the planned
run so that the tick keeps its period in elapsed time (``core.config.schedule.run_after_step``; a cron
schedule, which is wall-clock by nature, gets its next fire time on the new clock).

A tick that never returns (a hung NVML or kubelet call) fails ``/healthz`` once no tick
finished for ``stuck_tick_periods`` periods (``SnapshotCache.tick_overdue``); the watchdog logs
one line when that starts (the stage and since when) and one when a tick finishes again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from apscheduler.triggers.base import BaseTrigger
from loguru import logger

from ..core.config.schedule import clock_step, run_after_step
from ..core.model.sayonce import SayOnce

if TYPE_CHECKING:
    from .agent import Agent

__all__ = ["JOB_ID", "SteadyTrigger", "Watchdog"]

STUCK = "stuck"  # the key of a stuck tick
#: the id of the tick's job in the agent's scheduler
JOB_ID = "tick"


class SteadyTrigger(BaseTrigger):
    """An APScheduler 3 trigger (``inner``: the schedule's ``IntervalTrigger`` or
    ``CronTrigger``) whose fire times never lag ``now`` by more than two periods
    (``period_s``): when they would (the wall clock stepped forward, or the process was
    stopped), the next fire time is ``now``, so that the scheduler's catch-up loop ends at once
    instead of listing every missed run (coalesced into one run anyway).

    It also applies the jitter (``jitter_s``: each run a random 0..jitter_s seconds late) to
    the planned times rather than letting ``inner`` plan from the jittered run before: an
    APScheduler 3 ``IntervalTrigger`` with ``jitter`` plans each run from the previous
    *jittered* one, so a 10 s schedule with 5 s of jitter ran every 12.5 s on average. ``inner``
    is built without jitter."""

    __slots__ = ("inner", "period_s", "jitter_s", "_last")

    def __init__(self, inner: Any, period_s: float, jitter_s: float = 0) -> None:
        self.inner = inner
        self.period_s = period_s
        self.jitter_s = jitter_s
        #: (planned, jittered) of the last fire time given: the scheduler passes the jittered
        #: one back as ``previous_fire_time``
        self._last: tuple[datetime, datetime] | None = None

    def get_next_fire_time(self, previous_fire_time: Any, now: datetime) -> Any:
        planned_before = previous_fire_time
        if self._last is not None and previous_fire_time == self._last[1]:
            planned_before = self._last[0]
        nxt = self.inner.get_next_fire_time(planned_before, now)
        if nxt is None:
            return None
        if previous_fire_time is not None and (now - nxt).total_seconds() > 2 * self.period_s:
            nxt = now
        fire = self._apply_jitter(nxt, self.jitter_s or None, now)
        self._last = (nxt, fire)
        return fire

    def __str__(self) -> str:
        return str(self.inner)

    def __repr__(self) -> str:
        return f"<SteadyTrigger ({self.inner!r})>"


class Watchdog:
    """One thread (``watchdog``) over one agent's cache and the APScheduler ``scheduler`` that
    ticks it (``None``: steps are counted, no job is moved); ``check()`` is one look.

    ``wall`` and ``monotonic`` are the clocks compared for steps (Unix and monotonic seconds;
    injectable for tests, as is the agent's own clock for the stuck-tick rule). ``steps``
    counts the wall-clock steps seen (``omaticaya_clock_steps_total``)."""

    def __init__(
        self,
        agent: Agent,
        scheduler: Any = None,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        check_s: float | None = None,
    ) -> None:
        self.agent, self.scheduler = agent, scheduler
        self.wall, self.monotonic = wall, monotonic
        self.check_s = check_s if check_s is not None else min(1.0, agent.period_s)
        self.steps = 0
        self._offset_s = wall() - monotonic()
        self._said: SayOnce[str, bool] = SayOnce()  # the stuck line went out, not the recovery
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watchdog:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.check_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watchdog must outlive a bug in one look
                logger.exception("watchdog check failed")

    def check(self) -> None:
        """One look: reschedule the tick after a wall-clock step; log a stuck tick once."""
        self.check_clock()
        self.check_stuck()

    # -- wall-clock steps -----------------------------------------------------------------------

    def check_clock(self) -> float:
        """Compare the wall clock with the monotonic one; after a step, move the tick's next run
        (see the module docstring). Returns the step seen (seconds, 0.0: none)."""
        offset_s = self.wall() - self.monotonic()
        step_s = clock_step(self._offset_s, offset_s)
        self._offset_s = offset_s
        if step_s:
            self.steps += 1
        scheduler = self.scheduler
        if scheduler is None or not scheduler.running:
            return step_s
        job = scheduler.get_job(JOB_ID)
        if job is None or job.next_run_time is None:
            return step_s
        now_s = self.wall()
        now = datetime.fromtimestamp(now_s, timezone.utc)
        schedule = self.agent.settings.schedule
        planned = job.next_run_time
        if schedule.interval_s is not None:
            when_s = run_after_step(
                planned.timestamp(), now_s, step_s, schedule.interval_s, self.agent.settings.jitter_s
            )
            next_run = datetime.fromtimestamp(when_s, timezone.utc)
        elif step_s:
            next_run = job.trigger.get_next_fire_time(None, now)
        else:
            return step_s
        if next_run is None or abs((next_run - planned).total_seconds()) < 1e-3:
            return step_s
        if step_s:
            logger.warning(
                "the wall clock stepped {:+.1f}s: next tick moved from {} to {} (in {:.3g}s)",
                step_s, _iso(planned), _iso(next_run), (next_run - now).total_seconds(),
            )
        scheduler.modify_job(JOB_ID, next_run_time=next_run)
        return step_s

    # -- stuck ticks ----------------------------------------------------------------------------

    def check_stuck(self) -> bool:
        """Log one line when no tick finished for ``cache.stuck_after_s`` (which stage, since
        when) and one when a tick finished again. Returns whether the tick is stuck now."""
        cache = self.agent.cache
        now_s = cache.clock()
        if cache.tick_overdue(now_s):
            if self._said.start(STUCK, True):
                age_s = cache.tick_age_s(now_s)
                if cache.tick_stage is not None and cache.tick_started_wall_s is not None:
                    where = (
                        f"stuck in stage '{cache.tick_stage}' since "
                        f"{_iso(datetime.fromtimestamp(cache.tick_started_wall_s, timezone.utc))}"
                    )
                else:
                    where = "none is running (the scheduler starts no tick)"
                logger.error(
                    "tick stuck: no tick finished for {:.0f}s (over {:.3g} periods of {:.3g}s), "
                    "{}; /healthz fails until one does",
                    age_s, self.agent.settings.stuck_tick_periods, self.agent.period_s, where,
                )
            return True
        if self._said.end(STUCK) is not None:
            logger.info("tick no longer stuck: one finished {:.1f}s ago", cache.tick_age_s(now_s))
        return False


def _iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")

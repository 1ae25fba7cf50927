"""Ticks keep their period when the wall clock steps, back or forward (issue 23, item 3).

APScheduler 3 plans runs on the wall clock: stepped back an hour, the plain scheduler sleeps an
hour; stepped forward years, it lists every missed fire time. The pure rules
(``core.config.schedule.clock_step``, ``run_after_step``, ``SteadyTrigger``) are tested as tables; then
a real ``BackgroundScheduler`` wired as the daemon wires it (``agent.daemon.Daemon.schedule_ticks``)
runs while its wall clock steps: APScheduler's own ``datetime.now`` and the watchdog's wall
clock are moved together by a hand-set offset (no LD_PRELOAD, no faketime)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from apscheduler.schedulers import base as apscheduler_base
from apscheduler.schedulers.background import BackgroundScheduler

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.agent.daemon import Daemon
from omaticaya_py.agent.watchdog import SteadyTrigger
from omaticaya_py.core.config.schedule import (
    STEP_TOLERANCE_S,
    clock_step,
    parse_schedule,
    run_after_step,
)
from omaticaya_py.sources.replay import TraceReader
from tests.helpers import H100_TRACE, Clock, settings
from tests.waiting import wait_for

# not in `scripts/test --quick`: a real APScheduler ticking across clock steps (seconds of wall time)
pytestmark = pytest.mark.slow

T = 1_800_000_000.0  # a wall-clock time (Unix seconds)
HOUR = 3600.0
YEARS_10 = 10 * 365 * 86400.0


@pytest.mark.parametrize(
    ("before", "now", "step"),
    [
        (100.0, 100.0, 0.0),
        (100.0, 100.0 + STEP_TOLERANCE_S, 0.0),  # NTP slewing, or a tiny step: none
        (100.0, 100.0 - HOUR, -HOUR),
        (100.0, 100.0 + YEARS_10, YEARS_10),
    ],
)
def test_clock_step(before: float, now: float, step: float) -> None:
    assert clock_step(before, now) == step


@pytest.mark.parametrize(
    ("case", "planned", "now", "step", "expected"),
    [
        # planned 0.6 s ahead on the old clock, seen 0.1 s later: 0.5 s to go either way
        ("back an hour", T + 0.6, T - HOUR + 0.1, -HOUR, T - HOUR + 0.6),
        ("forward an hour", T + 0.6, T + HOUR + 0.1, HOUR, T + HOUR + 0.6),
        ("forward, re-planned already", T + HOUR + 0.7, T + HOUR + 0.1, HOUR, T + HOUR + 0.7),
        ("forward years", T + 0.6, T + YEARS_10 + 0.1, YEARS_10, T + YEARS_10 + 0.6),
        ("no step, on plan", T + 0.6, T + 0.1, 0.0, T + 0.6),
        ("no step, due now", T + 0.1, T + 0.1, 0.0, T + 0.1),
        ("no step, planned too far (step missed)", T + HOUR, T, 0.0, T + 1.0 + 0.25),
        ("back, planned run already past", T - 5.0, T - HOUR, -HOUR, T - HOUR),
    ],
)
def test_run_after_step(case: str, planned: float, now: float, step: float, expected: float) -> None:
    assert run_after_step(planned, now, step, interval_s=1.0, slack_s=0.25) == pytest.approx(expected, abs=1e-3), case


@pytest.mark.parametrize("schedule", ["@every 1s", "* * * * * ?"])
def test_steady_trigger_skips_a_long_run_of_missed_fire_times_at_once(schedule: str) -> None:
    """After a forward step of ten years, the next fire time after the planned one is now:
    the scheduler's catch-up loop ends at once instead of listing 315 million runs."""
    trigger = SteadyTrigger(parse_schedule(schedule).trigger(), period_s=1.0)
    planned = datetime.fromtimestamp(T, timezone.utc)
    now = planned + timedelta(seconds=YEARS_10)
    assert trigger.get_next_fire_time(planned, now) == now
    # on plan: the inner trigger's answer
    assert trigger.get_next_fire_time(planned, planned) == planned + timedelta(seconds=1)
    assert trigger.get_next_fire_time(now, now) == now + timedelta(seconds=1)


@pytest.mark.parametrize("schedule", ["@every 10s", "*/10 * * * * ?"])
def test_jitter_delays_each_run_from_its_plan_and_never_accumulates(schedule: str) -> None:
    """Fire times as APScheduler asks for them (each from the one before, which it passes back
    jittered): run k fires within [plan_k, plan_k + jitter], plan_k = first plan + k periods.
    An IntervalTrigger with ``jitter`` plans from the jittered run, so its runs drift later by
    jitter/2 a run on average (a 10 s schedule with 5 s of jitter: every 12.5 s)."""
    trigger = SteadyTrigger(parse_schedule(schedule).trigger(), period_s=10.0, jitter_s=5.0)
    start = datetime.fromtimestamp(T - T % 10, timezone.utc)
    fire = trigger.get_next_fire_time(None, start)
    plan0 = trigger._last[0]
    offsets = []
    for k in range(1, 2001):
        fire = trigger.get_next_fire_time(fire, fire)
        offsets.append((fire - (plan0 + timedelta(seconds=10 * k))).total_seconds())
    assert 0 <= min(offsets) and max(offsets) <= 5.0
    assert 2.0 < sum(offsets) / len(offsets) < 3.0  # uniform over [0, 5]


class SteppedWallClock:
    """The wall clock the scheduler and the watchdog see: the real one plus ``offset_s``."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def time(self) -> float:
        import time

        return time.time() + self.offset_s

    def datetime_class(self) -> type[datetime]:
        wall = self

        class SteppedDatetime(datetime):
            @classmethod
            def now(cls, tz=None):  # type: ignore[override]
                return datetime.fromtimestamp(wall.time(), tz)

        return SteppedDatetime


@pytest.mark.parametrize("schedule", ["@every 0.5s", "* * * * * ?"])
def test_real_scheduler_keeps_ticking_across_steps_back_and_forward(schedule, monkeypatch) -> None:
    wall = SteppedWallClock()
    monkeypatch.setattr(apscheduler_base, "datetime", wall.datetime_class())
    agent = Agent(
        settings(node_name="n1", schedule=schedule), TraceReader(H100_TRACE),
        NodeApi(None, dry_run=True),
    )
    scheduler = BackgroundScheduler(timezone=timezone.utc)
    daemon = Daemon(agent)
    watchdog = daemon.schedule_ticks(scheduler, wall=wall.time)
    scheduler.start()
    try:
        wait_for("two ticks", lambda: agent.cache.ticks >= 2, 20)
        for step_s in (-HOUR, YEARS_10, -YEARS_10 - HOUR):
            wall.offset_s += step_s
            before = agent.cache.ticks
            # the plain scheduler: none for an hour back; forward it lists every missed run
            wait_for(
                f"three ticks after a {step_s:+.0f}s step",
                lambda before=before: agent.cache.ticks >= before + 3,
                20,
            )
        assert watchdog.steps == 3
    finally:
        watchdog.stop()
        scheduler.shutdown(wait=False)
        daemon.stop()


@pytest.mark.parametrize(
    ("schedule", "planned_in_s", "step_s", "expected_in_s"),
    [
        ("@every 10s", 4.0, -HOUR, 4.0),  # the same 4 s to go, on the new clock
        ("@every 10s", 4.0, +HOUR, 4.0),
        ("@every 10s", 4.0, 0.2, 4.0),  # within the tolerance: left alone
        ("*/10 * * * * ?", 4.0, -HOUR - 3.0, 3.0),  # cron: its next fire time on the new clock (:00)
    ],
)
def test_the_watchdog_moves_the_planned_run_on_a_hand_driven_clock(
    schedule, planned_in_s, step_s, expected_in_s
) -> None:
    """A real scheduler, started paused (so that only the watchdog moves the job), and the
    watchdog's wall and monotonic clocks driven by hand."""
    wall, mono = Clock(T), Clock(50.0)
    agent = Agent(
        settings(node_name="n1", schedule=schedule), TraceReader(H100_TRACE),
        NodeApi(None, dry_run=True),
    )
    scheduler = BackgroundScheduler(timezone=timezone.utc)
    daemon = Daemon(agent)
    watchdog = daemon.schedule_ticks(scheduler, wall=wall, monotonic=mono)
    watchdog.stop()  # its thread ends: this test makes each look itself
    scheduler.start(paused=True)
    try:
        scheduler.modify_job("tick", next_run_time=datetime.fromtimestamp(T + planned_in_s, timezone.utc))
        assert watchdog.check_clock() == 0.0
        wall.t += step_s
        assert watchdog.check_clock() == (step_s if abs(step_s) > STEP_TOLERANCE_S else 0.0)
        planned = scheduler.get_job("tick").next_run_time.timestamp()
        expected = T + expected_in_s + (step_s if abs(step_s) > STEP_TOLERANCE_S else 0.0)
        assert planned == pytest.approx(expected, abs=1e-3)
    finally:
        scheduler.shutdown(wait=False)
        daemon.stop()

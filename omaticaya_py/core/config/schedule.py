"""When the agent ticks: crontab, 6-field cron (seconds first), ``@every <duration>`` and the
``@hourly``-style macros, parsed into an APScheduler trigger's arguments (``Schedule``); and
the pure rules that keep the ticks on their period when the wall clock steps (APScheduler 3
plans on the wall clock: ``clock_step``, ``run_after_step``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

__all__ = [
    "DAY_S",
    "MAX_INTERVAL_S",
    "SCHEDULE_FORM",
    "STEP_TOLERANCE_S",
    "Schedule",
    "clock_step",
    "parse_schedule",
    "run_after_step",
]


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_DURATION_UNITS_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_CRON_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

DAY_S = 86400.0
#: the longest ``@every`` interval: beyond it APScheduler's trigger arithmetic overflows, and no
#: schedule that rare is a live reading
MAX_INTERVAL_S = 366 * DAY_S

#: a change of (wall clock - monotonic clock) larger than this is a step of the wall clock
#: (NTP slewing moves it by at most 0.5 ms per second)
STEP_TOLERANCE_S = 0.5

SCHEDULE_FORM = (
    "a 5-field crontab ('*/5 * * * *'), 6 fields with seconds first ('*/5 * * * * ?'), "
    "'@every 30s' (h, m, s, ms) or @hourly/@daily"
)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A parsed polling schedule.

    ``interval_s`` is set for ``@every``; ``cron`` holds APScheduler ``CronTrigger`` keyword
    fields (second, minute, hour, day, month, day_of_week) otherwise. ``text`` is what the user
    wrote.
    """

    text: str
    interval_s: float | None = None
    cron: tuple[tuple[str, str], ...] | None = None

    def trigger(self, timezone: Any = "UTC", jitter_s: float = 0) -> Any:
        """An APScheduler 3.x trigger (``IntervalTrigger`` or ``CronTrigger``) for this schedule;
        ``jitter_s`` delays each run by a random 0..jitter_s seconds (the trigger's ``jitter``)."""
        from apscheduler.triggers.cron import CronTrigger
        from apscheduler.triggers.interval import IntervalTrigger

        jitter = jitter_s or None
        if self.interval_s is not None:
            return IntervalTrigger(seconds=self.interval_s, timezone=timezone, jitter=jitter)
        return CronTrigger(timezone=timezone, jitter=jitter, **dict(self.cron or ()))

    def period_s(self) -> float:
        """Seconds between two runs (for cron: between the next two fire times from now)."""
        if self.interval_s is not None:
            return self.interval_s
        from datetime import datetime, timezone

        trigger = self.trigger()
        now = datetime.now(timezone.utc)
        first: datetime = trigger.get_next_fire_time(None, now)  # APScheduler 3 is untyped
        second: datetime = trigger.get_next_fire_time(first, first + timedelta(microseconds=1))
        return (second - first).total_seconds()


def clock_step(offset_before_s: float, offset_now_s: float) -> float:
    """How far the wall clock stepped between two looks, each ``offset = wall - monotonic``
    (seconds; positive: forward). 0.0 when the change is within ``STEP_TOLERANCE_S``."""
    step_s = offset_now_s - offset_before_s
    return step_s if abs(step_s) > STEP_TOLERANCE_S else 0.0


def run_after_step(
    next_run_s: float, now_s: float, step_s: float, interval_s: float, slack_s: float = 0.0
) -> float:
    """When an ``@every interval_s`` job should next run (Unix seconds) after the wall clock
    stepped by ``step_s`` (``clock_step``), so that it keeps its period in elapsed time.

    ``next_run_s`` is the run the scheduler planned (on the wall clock before the step, or
    already re-planned after it: the scheduler may have woken in between); ``now_s`` is the wall
    clock now; ``slack_s`` the trigger's jitter. The run shifted by the step is kept when it
    falls within the next period, else the planned run when that does (already re-planned),
    else the shifted run clamped into ``[now_s, now_s + interval_s + slack_s]``. With no step
    (``step_s`` 0), a run planned further ahead than one period (a step missed before the first
    look) is brought back to the end of the period."""
    horizon_s = now_s + interval_s + slack_s
    shifted_s = next_run_s + step_s
    if step_s and now_s - STEP_TOLERANCE_S <= shifted_s <= horizon_s:
        return max(shifted_s, now_s)
    if now_s - STEP_TOLERANCE_S <= next_run_s <= horizon_s + STEP_TOLERANCE_S:
        return next_run_s
    return min(max(shifted_s, now_s), horizon_s)


def _cron_weekdays(field: str) -> str:
    """Translate a crontab weekday field (0 or 7 = Sunday; names; ranges; steps) into the
    explicit list of APScheduler 3.x day names it means.

    APScheduler 3.x counts 0 as Monday (its docs call it a historical mistake) and ignores
    steps on name ranges, so the field is expanded to the set of days first. Raises
    ``ValueError`` for a day out of range or a reversed range.
    """
    if field == "*":
        return "*"

    def day(token: str) -> int:
        token = token.lower()
        if token.isdigit():
            if int(token) > 7:
                raise ValueError(f"weekday out of range 0-7: {token!r}")
            return int(token)
        if token[:3] in _CRON_WEEKDAYS[:7]:
            return _CRON_WEEKDAYS.index(token[:3])
        raise ValueError(f"bad weekday {token!r}")

    days: set[int] = set()
    for part in field.split(","):
        base, _, step_text = part.partition("/")
        if step_text and not step_text.isdigit() or step_text == "0":
            raise ValueError(f"bad weekday step in {part!r}")
        step = int(step_text) if step_text else 1
        if base == "*":
            lo, hi = 0, 6
        elif "-" in base:
            first, _, last = base.partition("-")
            lo, hi = day(first), day(last)
        else:
            lo = day(base)
            hi = 6 if step_text else lo
        if lo > hi:
            raise ValueError(f"reversed weekday range {part!r}")
        days.update(d % 7 for d in range(lo, hi + 1, step))
    if len(days) == 7:
        return "*"
    return ",".join(_CRON_WEEKDAYS[d] for d in sorted(days))


def parse_schedule(text: str) -> Schedule:
    """Parse a schedule string.

    Accepts a 5-field crontab (minute hour day month weekday), 6 fields with seconds first as
    the Go Omaticaya wrote them (``*/5 * * * * ?``; ``?`` means ``*``), ``@every <duration>``
    (Go duration: ``30s``, ``1m30s``, ``500ms``) and the @hourly-style macros.

    Raises ``ValueError`` naming the expected form.
    """
    raw = text.strip()
    spec = _MACROS.get(raw.lower(), raw)
    if spec.lower().startswith("@every"):
        duration = spec[len("@every") :].strip()
        if not duration or _DURATION_PART.sub("", duration) != "":
            raise ValueError(f"expected {SCHEDULE_FORM}")
        seconds = sum(float(n) * _DURATION_UNITS_S[u] for n, u in _DURATION_PART.findall(duration))
        if seconds < 0.1:
            raise ValueError("@every needs at least 100ms")
        if seconds > MAX_INTERVAL_S:
            raise ValueError("@every takes at most 366 days")
        return Schedule(text=raw, interval_s=seconds)
    fields = spec.replace("?", "*").split()
    if len(fields) == 5:
        fields = ["0", *fields]
    if len(fields) != 6:
        raise ValueError(f"expected {SCHEDULE_FORM}")
    names = ("second", "minute", "hour", "day", "month", "day_of_week")
    cron = dict(zip(names, fields, strict=True))
    try:
        cron["day_of_week"] = _cron_weekdays(cron["day_of_week"])
        from apscheduler.triggers.cron import CronTrigger

        CronTrigger(timezone="UTC", **cron)
    except ValueError as exc:
        raise ValueError(f"{exc}; expected {SCHEDULE_FORM}") from None
    return Schedule(text=raw, cron=tuple(cron.items()))

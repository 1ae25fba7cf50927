"""Kubernetes API outages as the agent sees them: logged once, and a refusal paced.

A failure is logged once per outage (the recovery once too); a refusal (401/403: RBAC, or
credentials) will not fix itself within seconds, so the agent pauses its API requests, the
pause doubling from one tick period up to 5 minutes (tenacity's exponential wait), while it
keeps reading the GPUs.
"""

from __future__ import annotations

import tenacity
from loguru import logger

from ..core.model.sayonce import SayOnce
from ..kube import KubeError, KubeForbidden
from .state import SnapshotCache

__all__ = ["ApiOutage", "Refusals"]

MAX_PAUSE_S = 300.0
OUTAGE = "api"  # the one key of ApiOutage's SayOnce


class _Refused(Exception):
    """One refusal, as the attempt's outcome in ``Refusals``' retry loop."""


class Refusals:
    """Consecutive refusals, paced by tenacity's own retry loop: a ``Retrying`` with ``wait``
    is driven one failed attempt per refusal, and the pause it would sleep before the next
    attempt is returned instead of slept (the agent keeps ticking and reading the GPUs)."""

    def __init__(self, wait: tenacity.wait.wait_base) -> None:
        self._retrying = tenacity.Retrying(
            wait=wait, retry=tenacity.retry_if_exception_type(_Refused),
            stop=tenacity.stop_never, sleep=self._pause,
        )  # fmt: skip
        self._pause_s = 0.0
        self.reset()

    def _pause(self, seconds: float) -> None:
        self._pause_s = seconds

    def reset(self) -> None:
        """An API round went through: the next refusal is the first again."""
        self._attempts = iter(self._retrying)
        self._attempt = next(self._attempts)

    def refused(self) -> float:
        """One more refusal: the seconds to pause before the next API request."""
        with self._attempt:  # the attempt failed (tenacity records the outcome)
            raise _Refused
        self._attempt = next(self._attempts)  # tenacity waits (``_pause``), then the next one
        return self._pause_s


class ApiOutage:
    """Outage bookkeeping for one agent; times are the agent's monotonic seconds."""

    def __init__(self, period_s: float, cache: SnapshotCache) -> None:
        self.cache = cache
        self._refusals = Refusals(
            tenacity.wait_exponential(multiplier=period_s, min=0, max=MAX_PAUSE_S)
        )
        self._said: SayOnce[str, bool] = SayOnce()
        self._paused_until_s = float("-inf")

    def paused(self, now_s: float) -> bool:
        """True while a refusal's pause lasts: send no API request."""
        return now_s < self._paused_until_s

    def ok(self, now_s: float) -> None:
        """An API round went through."""
        self.cache.last_api_ok_s = now_s
        self._refusals.reset()
        over = self._said.end(OUTAGE)
        if over is not None and over.since_s is not None:
            logger.info("Kubernetes API reachable again after {:.1f}s", now_s - over.since_s)

    def failed(self, exc: KubeError, now_s: float) -> None:
        """An API request failed (after the edge's retries)."""
        if isinstance(exc, KubeForbidden):
            self._paused_until_s = now_s + self._refusals.refused()
        if self._said.start(OUTAGE, True, now_s):
            hint = " (check RBAC)" if isinstance(exc, KubeForbidden) else ""
            logger.error("Kubernetes API request failed{}: {}; will retry each tick", hint, exc)
        else:
            logger.debug("Kubernetes API still failing: {}", exc)

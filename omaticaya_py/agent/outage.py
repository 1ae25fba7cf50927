"""Kubernetes API outages as the agent sees them: logged once, and a refusal paced.

A failure is logged once per outage (the recovery once too); a refusal (401/403: RBAC, or
credentials) will not fix itself within seconds, so the agent pauses its API requests, the
pause doubling from one tick period up to 5 minutes (tenacity's exponential wait), while it
keeps reading the GPUs.
"""

from __future__ import annotations

import tenacity
from loguru import logger

from ..kube import KubeError, KubeForbidden
from .state import SnapshotCache

__all__ = ["ApiOutage"]

MAX_PAUSE_S = 300.0


class ApiOutage:
    """Outage bookkeeping for one agent; times are the agent's monotonic seconds."""

    def __init__(self, period_s: float, cache: SnapshotCache) -> None:
        self.cache = cache
        self._pause = tenacity.wait_exponential(multiplier=period_s, min=0, max=MAX_PAUSE_S)
        self._refusals = tenacity.RetryCallState(None, None, (), {})
        self._refusals.attempt_number = 0  # consecutive 401/403 answers
        self._failing_since: float | None = None
        self._paused_until_s = float("-inf")

    def paused(self, now_s: float) -> bool:
        """True while a refusal's pause lasts: send no API request."""
        return now_s < self._paused_until_s

    def ok(self, now_s: float) -> None:
        """An API round went through."""
        self.cache.last_api_ok_s = now_s
        self._refusals.attempt_number = 0
        if self._failing_since is not None:
            logger.info(
                "Kubernetes API reachable again after {:.1f}s", now_s - self._failing_since
            )
            self._failing_since = None

    def failed(self, exc: KubeError, now_s: float) -> None:
        """An API request failed (after the edge's retries)."""
        if isinstance(exc, KubeForbidden):
            self._refusals.attempt_number += 1
            self._paused_until_s = now_s + self._pause(self._refusals)
        if self._failing_since is None:
            self._failing_since = now_s
            hint = " (check RBAC)" if isinstance(exc, KubeForbidden) else ""
            logger.error("Kubernetes API request failed{}: {}; will retry each tick", hint, exc)
        else:
            logger.debug("Kubernetes API still failing: {}", exc)

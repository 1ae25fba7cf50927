"""Every filter and prioritize decision, logged and counted by a small, fixed set of reasons.

``omaticaya_extender_decisions_total{verb,result,reason}``: ``verb`` filter or prioritize;
``result`` passed / failed (filter, per node) or scored / zero (prioritize, per node); ``reason``
one of ``REASONS`` (bounded: the reason's text, which names pods and sizes, is only logged).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from operator import countOf, itemgetter
from typing import Any

from loguru import logger as log

_score = itemgetter("Score")

#: (reason, text the filter's message starts with or contains), first match wins
_KINDS: tuple[tuple[str, str], ...] = (
    ("in-flight", "room taken by in-flight pods"),
    ("other-node", "another was chosen"),
    ("no-room", "had no room"),
    ("stale", "stale GPU telemetry"),
    ("unhealthy", "GPU health"),
    ("no-telemetry", "no GPU telemetry"),
    ("unusable-telemetry", "unusable GPU telemetry"),
    ("not-in-cache", "not yet in the omaticaya extender's cache"),
    ("not-synced", "cache is not synced yet"),
    ("bad-pod", "pod annotation"),
    ("bad-pod", "pod container"),
    ("judging-failed", "could not be judged by the omaticaya extender"),
)
REASONS: tuple[str, ...] = ("", *(k for k, _ in _KINDS), "other")


def reason_kind(text: str) -> str:
    """The bounded reason of a filter message ("" for a node that passed)."""
    if not text:
        return ""
    for kind, mark in _KINDS:
        if mark in text:
            return kind
    return "other"


class Decisions:
    """Counts by (verb, result, reason); each request logged once at DEBUG with its tally."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()

    def filtered(self, pod: str, passed: Sequence[str], failed: Mapping[str, str]) -> None:
        kinds: Counter[str] = Counter()
        for text, n in Counter(failed.values()).items():  # few distinct texts: classify those
            kinds[reason_kind(text)] += n
        with self._lock:
            if passed:
                self.counts[("filter", "passed", "")] += len(passed)
            for kind, n in kinds.items():
                self.counts[("filter", "failed", kind)] += n
        log.debug("filter {}: {} passed, failed {}", pod, len(passed), dict(kinds) or "none")

    def prioritized(self, pod: str, scores: Sequence[Mapping[str, Any]]) -> None:
        scored = len(scores) - countOf(map(_score, scores), 0)
        with self._lock:
            if scored:
                self.counts[("prioritize", "scored", "")] += scored
            if len(scores) - scored:
                self.counts[("prioritize", "zero", "")] += len(scores) - scored
        log.debug("prioritize {}: {} scored, {} zero", pod, scored, len(scores) - scored)

"""Logging setup: loguru to stderr, human-readable by default, JSON lines on request."""

from __future__ import annotations

import sys

from loguru import logger

__all__ = ["setup_logging"]

_TEXT = "{time:YYYY-MM-DDTHH:mm:ss.SSSZ} {level: <7} {message}"


def setup_logging(level: str = "INFO", json_lines: bool = False) -> None:
    """Send logs to stderr at ``level``; ``json_lines`` writes one JSON object per line
    (loguru's ``serialize``: ``{"text", "record": {"level", "time", "message", ...}}``)."""
    logger.remove()
    if json_lines:
        logger.add(sys.stderr, level=level, serialize=True)
    else:
        logger.add(sys.stderr, level=level, format=_TEXT, colorize=False)

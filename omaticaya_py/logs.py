"""Logging setup: loguru to stderr, human-readable by default, JSON lines on request."""

from __future__ import annotations

import inspect
import logging
import sys

from loguru import logger

__all__ = ["setup_logging"]

_TEXT = "{time:YYYY-MM-DDTHH:mm:ss.SSSZ} {level: <7} {message}"


class _ToLoguru(logging.Handler):
    """Routes the standard ``logging`` records of libraries (APScheduler, urllib3) to loguru,
    so that they share its format (the recipe from loguru's documentation)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level: str | int = logger.level(record.levelname).name
        except ValueError:
            level = record.levelno
        frame, depth = inspect.currentframe(), 0
        while frame is not None and (depth == 0 or frame.f_code.co_filename == logging.__file__):
            frame, depth = frame.f_back, depth + 1
        logger.opt(depth=depth, exception=record.exc_info).log(level, record.getMessage())


def setup_logging(level: str = "INFO", json_lines: bool = False) -> None:
    """Send logs to stderr at ``level``; ``json_lines`` writes one JSON object per line
    (loguru's ``serialize``: ``{"text", "record": {"level", "time", "message", ...}}``).

    APScheduler's own records are kept at WARNING and above except its "skipped: maximum number
    of running instances" notes, which the agent replaces with one warning about slow ticks."""
    logging.basicConfig(handlers=[_ToLoguru()], level=0, force=True)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    logging.getLogger("urllib3").setLevel(logging.ERROR)
    logger.remove()
    if json_lines:
        logger.add(sys.stderr, level=level, serialize=True)
    else:
        logger.add(sys.stderr, level=level, format=_TEXT, colorize=False)

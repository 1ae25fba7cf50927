"""``wait_for``: a bounded wait on an observable condition, for tests that would otherwise sleep
a fixed time (and flake on a busy 2-core CI, or waste time on a fast one). Its own tests are in
``tests/project/test_waiting.py``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["wait_for"]


def wait_for(what: str, check: Callable[[], T], timeout_s: float = 20, every_s: float = 0.05) -> T:
    """Call ``check`` every ``every_s`` seconds until it returns a truthy value, and return that
    value. Raises ``AssertionError`` naming ``what`` (and the last falsy value, or the last
    exception ``check`` raised) once ``timeout_s`` seconds have passed. ``timeout_s`` is a bound,
    never a duration the test waits when the condition holds sooner."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = check()
        except AssertionError:
            raise
        except Exception as exc:  # noqa: BLE001 - not ready yet (connection refused, 404, ...)
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what} (last: {last!r})")
        time.sleep(every_s)

"""``wait_for``: a bounded wait on an observable condition, for tests that would otherwise sleep
a fixed time (and flake on a busy 2-core CI, or waste time on a fast one)."""

from __future__ import annotations

import itertools

import pytest

from tests.waiting import wait_for


def test_wait_for_returns_the_first_truthy_value():
    counter = itertools.count()
    assert wait_for("the third call", lambda: next(counter) >= 2 and "done", timeout_s=5) == "done"


def test_wait_for_names_what_it_waited_for_and_the_last_value():
    def broken() -> int:
        raise ConnectionRefusedError("no server")

    with pytest.raises(AssertionError, match=r"waiting for the server .*ConnectionRefusedError"):
        wait_for("the server", broken, timeout_s=0.2)
    with pytest.raises(AssertionError, match="waiting for zero.*last: 0"):
        wait_for("zero", lambda: 0, timeout_s=0.1)

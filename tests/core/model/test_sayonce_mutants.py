"""``core.model.sayonce`` cases that mutation testing (``scripts/mutation``) found no test
pinned: when what holds started (``since_s``), kept while the same goes on and renewed by
another; the live view's membership."""

from __future__ import annotations

from omaticaya_py.core.model.sayonce import SayOnce


def test_since_s_is_when_what_holds_started() -> None:
    said: SayOnce[str, str] = SayOnce()
    assert said.since_s("a") is None  # nothing holds
    said.start("a", "x", 1.0)
    said.start("a", "x", 5.0)  # the same goes on: its start is kept
    said.start("b", "y", 3.0)
    assert (said.since_s("a"), said.since_s("b")) == (1.0, 3.0)
    said.start("a", "z", 7.0)  # another problem: a new episode
    assert said.since_s("a") == 7.0
    said.end("a")
    assert said.since_s("a") is None


def test_the_live_view_holds_the_keys_that_hold_now() -> None:
    said: SayOnce[str, bool] = SayOnce()
    view = said.current
    said.start("a", True)
    assert "a" in view and "b" not in view
    assert len(view) == 1 and view["a"] is True
    said.end("a")
    assert "a" not in view and len(view) == 0

"""``core.allocation.shown``: the one "counts until a reading shows it" rule of the extender and the device
plugin, table-driven (``still_counting``), and the device plugin's ``still_pending`` through it."""

from __future__ import annotations

import pytest

from omaticaya_py.core.allocation.shown import Grant, look, rebase, still_counting, still_in_book
from omaticaya_py.deviceplugin.slices import Slice, still_pending

G = 1024  # MiB
BASE = 70 * G  # free MiB when the grants were made


def g(mib: int, baseline: int | None = BASE, *, read_after: bool = True, held: bool = False) -> Grant:
    return Grant(mib, baseline, read_after=read_after, held=held)


@pytest.mark.parametrize(
    ("grants", "free_now", "expected"),
    [
        pytest.param([], BASE, [], id="empty"),
        pytest.param([], None, [], id="empty-no-reading"),
        pytest.param([g(10 * G), g(20 * G)], None, [True, True], id="no-reading-every-grant-counts"),
        pytest.param([g(10 * G)], BASE, [True], id="no-drop-counts"),
        pytest.param([g(10 * G)], BASE - 10 * G, [False], id="a-drop-of-its-size-shows-it"),
        pytest.param([g(10 * G)], BASE - 10 * G + 1, [True], id="one-mib-short-counts"),
        pytest.param([g(10 * G)], BASE - 30 * G, [False], id="a-larger-drop-shows-it"),
        pytest.param([g(10 * G), g(20 * G)], BASE - 30 * G, [False, False], id="all-shown"),
        pytest.param([g(10 * G), g(20 * G), g(5 * G)], BASE - 10 * G, [False, True, True],
                     id="a-drop-that-covers-only-the-first"),
        pytest.param([g(10 * G), g(20 * G)], BASE - 20 * G, [False, True],
                     id="a-drop-the-size-of-the-second-is-taken-as-the-first"),
        pytest.param([g(10 * G), g(20 * G), g(5 * G)], BASE - 30 * G, [False, False, True],
                     id="the-third-must-show-every-earlier-grant-too"),
        pytest.param([g(10 * G), g(5 * G, held=True), g(20 * G)], BASE - 35 * G,
                     [False, False, False], id="held-in-the-middle-its-memory-in-the-drop"),
        pytest.param([g(10 * G), g(5 * G, held=True), g(20 * G)], BASE - 30 * G,
                     [False, False, True], id="held-in-the-middle-the-last-short-by-its-memory"),
        pytest.param([g(10 * G, None), g(5 * G, held=True), g(20 * G)], BASE - 35 * G,
                     [True, False, True], id="held-shown-even-after-one-not-shown"),
        pytest.param([g(10 * G, None)], BASE - 30 * G, [True], id="baseline-unknown-never-shown"),
        pytest.param([g(10 * G, None), g(10 * G)], BASE - 20 * G, [True, True],
                     id="none-shown-after-one-with-baseline-unknown"),
        pytest.param([g(10 * G, read_after=False)], BASE - 10 * G, [True],
                     id="read-before-it-could-run-counts"),
        pytest.param([g(10 * G, read_after=False), g(10 * G)], BASE - 20 * G, [True, True],
                     id="none-shown-after-one-read-before"),
        pytest.param([g(10 * G), g(10 * G, read_after=False)], BASE - 20 * G, [False, True],
                     id="read-after-false-last-counts-the-first-shown"),
        pytest.param([g(10 * G), g(10 * G, BASE - 10 * G)], BASE - 20 * G, [False, True],
                     id="a-later-baseline-must-show-the-earlier-grants-too"),
        pytest.param([g(10 * G), g(10 * G, BASE + 20 * G)], BASE - 0, [True, True],
                     id="freed-memory-hides-a-drop"),
    ],
)
def test_still_counting(grants: list[Grant], free_now: int | None, expected: list[bool]) -> None:
    assert still_counting(grants, free_now) == expected


def _old_still_pending(slices: list[Slice], free_now: int | None, now_s: float, settle_s: float
                       ) -> tuple[Slice, ...]:  # fmt: skip
    """The device plugin's rule before ``core.allocation.shown`` (its own book), kept to compare with."""
    live = [s for s in slices if now_s - s.at_s < settle_s]
    if free_now is None:
        return tuple(live)
    out: list[Slice] = []
    ahead = 0
    for s in live:
        ahead += s.mib
        if not (s.baseline_free_mib is not None and s.baseline_free_mib - free_now >= ahead):
            out.append(s)
    return tuple(out)


def sl(mib: int, at_s: float, baseline: int | None = BASE) -> Slice:
    return Slice(frozenset({f"GPU-0::{at_s}"}), "GPU-0", mib, at_s, baseline)


@pytest.mark.parametrize(
    ("slices", "free_now", "now_s"),
    [
        pytest.param([], BASE, 10, id="none"),
        pytest.param([sl(30 * G, 0)], BASE, 10, id="not-in-use-yet"),
        pytest.param([sl(30 * G, 0)], BASE - 30 * G, 10, id="in-use"),
        pytest.param([sl(30 * G, 0)], BASE - 20 * G, 10, id="part-shown"),
        pytest.param([sl(30 * G, 0)], BASE, 60, id="settled-by-age"),
        pytest.param([sl(30 * G, 0), sl(10 * G, 70)], BASE, 80, id="the-old-one-settled"),
        pytest.param([sl(30 * G, 0)], None, 10, id="free-unknown"),
        pytest.param([sl(10 * G, 0), sl(10 * G, 1)], BASE - 10 * G, 10, id="first-of-two"),
        pytest.param([sl(10 * G, 0), sl(10 * G, 1)], BASE - 20 * G, 10, id="both"),
        pytest.param([sl(10 * G, 0), sl(20 * G, 1)], BASE - 20 * G, 10, id="second-size-drop"),
        pytest.param([sl(10 * G, 0, None)], BASE - 20 * G, 10, id="no-baseline"),
    ],
)
def test_still_pending_equals_the_old_device_plugin_rule(
    slices: list[Slice], free_now: int | None, now_s: float
) -> None:
    kept = still_pending(slices, free_now, now_s, 60)
    assert [x.units for x in kept] == [x.units for x in _old_still_pending(slices, free_now, now_s, 60)]


def test_still_pending_differs_from_the_old_rule_only_after_a_slice_not_shown() -> None:
    """The one case the old book judged otherwise: a later slice whose baseline's drop covers
    it and an earlier one not shown (no baseline). The rule keeps both (memory that cannot be
    told apart waits), as the extender does; the old book forgot the later one."""
    slices = [sl(10 * G, 0, None), sl(10 * G, 1)]
    assert still_pending(slices, BASE - 20 * G, 10, 60) == tuple(slices)
    assert _old_still_pending(slices, BASE - 20 * G, 10, 60) == (slices[0],)


def test_still_pending_maps_each_slice_to_a_grant_read_after() -> None:
    """A slice is handed out before the readings it is judged on: ``read_after`` is True, so a
    drop shows it (a grant read before would count)."""
    slices = [sl(10 * G, 0)]
    assert still_pending(slices, BASE - 10 * G, 10, 60) == ()
    assert still_counting([g(10 * G, read_after=False)], BASE - 10 * G) == [True]


# ------------------------------------------------------------- a book looked at again ----


def test_a_book_keeps_what_a_drop_has_not_shown_at_every_later_look() -> None:
    """Two slices of 10 GiB handed out at the same baseline, one in use (the free memory 10 GiB
    lower): the first shows and leaves the book; the second, rebased, still counts at the next
    look, and the next (without the rebase it showed at the second look: both let go, 10 GiB
    promised twice)."""
    slices = [sl(10 * G, 0), sl(10 * G, 1)]
    kept = still_pending(slices, BASE - 10 * G, 10, 60)
    assert [x.at_s for x in kept] == [1] and kept[0].baseline_free_mib == BASE - 10 * G
    for _ in range(3):
        kept = still_pending(kept, BASE - 10 * G, 10, 60)
        assert [x.at_s for x in kept] == [1]
    assert still_pending(kept, BASE - 20 * G, 10, 60) == ()  # now it is in use too


def test_look_and_rebase() -> None:
    flags, shown = look([g(10 * G), g(10 * G)], BASE - 10 * G)
    assert (flags, shown) == ([False, True], 10 * G)
    assert rebase(g(10 * G), shown).baseline_free_mib == BASE - 10 * G
    assert rebase(g(10 * G, None), shown).baseline_free_mib is None
    # a held grant shows by the books: it stays ahead, and nothing is shown by a drop for it
    assert look([g(10 * G, held=True)], BASE) == ([False], 0)


def test_rebase_keeps_all_but_the_baseline() -> None:
    kept = g(10 * G, read_after=False, held=True)
    assert rebase(kept, 4 * G) == Grant(10 * G, BASE - 4 * G, read_after=False, held=True)
    assert rebase(g(10 * G), 0) == g(10 * G)


def test_still_pending_keeps_a_slice_of_unknown_baseline_as_it_is_after_another_shows() -> None:
    """The first slice shows (10 GiB in use) and leaves; the second, of unknown baseline, still
    counts and keeps no baseline (nothing to rebase)."""
    slices = [sl(10 * G, 0), sl(10 * G, 1, None)]
    assert still_pending(slices, BASE - 10 * G, 10, 60) == (slices[1],)


@pytest.mark.parametrize(
    ("grants", "free_now", "expected"),
    [
        # the first was in use when the second was made (the free memory at the second's
        # baseline shows it): the plugin's book had dropped it then; the second's own drop shows it
        pytest.param([g(1 * G), g(20 * G, BASE - 1 * G)], BASE - 21 * G, [False, False],
                     id="shown-before-the-next-was-made"),
        # both made at one baseline, one in use: the other still counts
        pytest.param([g(10 * G), g(10 * G)], BASE - 10 * G, [False, True], id="same-baseline"),
        pytest.param([g(10 * G), g(10 * G)], BASE - 20 * G, [False, False], id="both-in-use"),
        # the first showed when the third was made, the second not: rebased, the second still
        # counts now that the free memory is no lower (without the rebase its old baseline's
        # drop would show it: the same 10 GiB let go twice)
        pytest.param([g(10 * G), g(10 * G), g(5 * G, BASE - 10 * G)], BASE - 10 * G,
                     [False, True, True], id="rebased-at-a-later-grant"),
        pytest.param([g(10 * G, None), g(10 * G)], BASE - 20 * G, [True, True],
                     id="an-unknown-baseline-holds-the-rest"),
    ],
)
def test_still_in_book_replays_the_plugins_book(grants: list[Grant], free_now: int,
                                                expected: list[bool]) -> None:  # fmt: skip
    """The extender keeps every grant; ``still_in_book`` gives what the device plugin's book,
    looked at when each grant was made and now, still counts."""
    assert still_in_book(grants, free_now) == expected
    # the plugin's own book, grant by grant, agrees
    book: list[Slice] = []
    for k, grant in enumerate(grants):
        if book and grant.baseline_free_mib is not None:
            book = list(still_pending(book, grant.baseline_free_mib, k, 60))
        book.append(sl(grant.mib, k, grant.baseline_free_mib))
    kept = {int(x.at_s) for x in still_pending(book, free_now, len(grants), 60)}
    assert [k in kept for k in range(len(grants))] == expected

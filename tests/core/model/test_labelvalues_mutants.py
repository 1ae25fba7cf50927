"""``core.model.labelvalues`` cases that mutation testing (``scripts/mutation``) found no test
pinned: rounding is rounding below zero too (down is toward minus infinity, nearest is half up
in both of ``quantise_nearest``'s branches), and whole numbers of any size round exactly."""

from __future__ import annotations

import pytest

from omaticaya_py.core.model.labelvalues import quantise_down, quantise_nearest


@pytest.mark.parametrize(
    ("value", "step", "expected"),
    [(-1, 1024, -1024), (-1.5, 1, -2), (-1024, 1024, -1024), (2**60 + 5, 4, 2**60 + 4)],
)
def test_quantise_down_is_toward_minus_infinity_and_exact(value, step, expected) -> None:
    assert quantise_down(value, step) == expected


@pytest.mark.parametrize(
    ("value", "step", "expected"),
    [(-12.0, 10, -10), (-12, 10, -10), (-15.0, 10, -10), (-15, 10, -10), (-16.0, 10, -20)],
)
def test_quantise_nearest_below_zero_is_half_up_in_both_branches(value, step, expected) -> None:
    assert quantise_nearest(value, step) == expected

"""``core.publish.readings.ReadingAge`` cases that mutation testing (``scripts/mutation``) found no
test pinned: the first reading passed starts its clock whatever it is (``None`` too), the same
reading ages, another starts again."""

from __future__ import annotations

from omaticaya_py.core.publish.readings import ReadingAge


def test_a_reading_ages_from_when_it_was_first_passed() -> None:
    age, first, second = ReadingAge(), object(), object()
    assert age.age_s(first, 50.0) == 0.0
    assert age.age_s(first, 80.0) == 30.0
    assert age.age_s(second, 90.0) == 0.0  # another reading: its own clock
    assert age.age_s(second, 91.5) == 1.5
    assert age.age_s(first, 95.0) == 0.0  # the first again: seen anew


def test_the_first_reading_starts_its_clock_whatever_it_is() -> None:
    for reading in (None, "", 0):
        age = ReadingAge()
        assert age.age_s(reading, 50.0) == 0.0, reading
        assert age.age_s(reading, 80.0) == 30.0, reading

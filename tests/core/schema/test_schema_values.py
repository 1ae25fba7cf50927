"""The lenient readers of cluster values (``core.schema.values``) never raise."""

from __future__ import annotations

import pytest

from omaticaya_py.core.schema import json_int


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (" 5 ", 5),
        ("5\n", 5),
        ("0\x1f", 0),  # the information separators \x1c-\x1f: whitespace to re, not to int()
        ("\x1c7", 7),
        ("5\x85", 5),
        ("5\u2028", 5),
        ("\x1f", None),
        ("5\x00", None),
    ],
)
def test_json_int_reads_whole_numbers_in_any_whitespace_and_never_raises(text, expected) -> None:
    assert json_int(text) == expected

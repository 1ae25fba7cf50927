"""Lenient readers for values that come from the cluster: whole numbers, text, times.

Everything a Node carries can be written by any controller, so these never raise: a value of
the wrong type or form reads as ``None`` (or ``{}``), and the caller decides what that means.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

__all__ = [
    "MAX_EPOCH_S",
    "MIN_EPOCH_S",
    "epoch_text",
    "json_float",
    "json_int",
    "json_mapping",
    "json_str",
    "rfc3339_s",
]

#: the times read from the cluster: 1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z (epoch
#: seconds). Outside, ``datetime`` cannot turn them back into a date (year 0, year 10000), and
#: no reading, Lease or pod was ever written there.
MIN_EPOCH_S = 0.0
MAX_EPOCH_S = 253402300799.0

_INT_TEXT = re.compile(r"^\s*-?[0-9]{1,18}\s*$")


def json_int(value: Any) -> int | None:
    """A whole number from JSON or a label value, or ``None`` for anything else: booleans,
    NaN, infinities, floats or text beyond 18 digits (no GPU has 10^18 MiB), non-ASCII digits.
    A finite float is truncated toward zero."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < 10**18 else None
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and abs(value) < 1e18 else None
    if isinstance(value, str) and _INT_TEXT.match(value):
        # strip() first: the pattern's \s takes the separators \x1c-\x1f, which int() refuses
        return int(value.strip())
    return None


def json_float(value: Any) -> float | None:
    """A finite number from JSON, or ``None`` (booleans, NaN, infinities, text, a whole number
    too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # JSON's whole numbers have no bound: 10**400 is an int
        return None
    return number if math.isfinite(number) and abs(number) < 1e18 else None


def json_str(value: Any) -> str | None:
    """``value`` when it is a string, else ``None``."""
    return value if isinstance(value, str) else None


def json_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else ``{}``."""
    return value if isinstance(value, Mapping) else {}


def rfc3339_s(text: Any) -> float | None:
    """Epoch seconds of an RFC 3339 time with a zone (``2025-03-04T05:06:07Z``), or ``None``
    for anything else: no zone, not a string, over 64 characters, or a time outside
    ``MIN_EPOCH_S``..``MAX_EPOCH_S`` (``0001-01-01T00:00:00+23:59`` is a valid RFC 3339 time
    in year 0 once in UTC: no date can be made of it again). Never raises."""
    if not isinstance(text, str) or not text or len(text) > 64:
        return None
    try:
        stamp = datetime.fromisoformat(text)  # Python 3.11 reads a "Z" zone itself
        if stamp.tzinfo is None:
            return None
        epoch_s = stamp.timestamp()
    except (ValueError, OverflowError):
        return None
    return epoch_s if MIN_EPOCH_S <= epoch_s <= MAX_EPOCH_S else None


def epoch_text(epoch_s: float) -> str:
    """``2025-03-04T05:06:07Z`` for epoch seconds (UTC, whole seconds), for messages; a time no
    date can be made of (year 0, year 10000 and on, NaN) reads ``epoch <seconds>s``. Never
    raises."""
    try:
        return datetime.fromtimestamp(epoch_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        return f"epoch {epoch_s:g}s"

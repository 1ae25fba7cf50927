"""Lenient readers for values that come from the cluster: whole numbers, text, times.

Everything a Node carries can be written by any controller, so these never raise: a value of
the wrong type or form reads as ``None`` (or ``{}``), and the caller decides what that means.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

__all__ = ["json_float", "json_int", "json_mapping", "json_str", "rfc3339_s"]

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
        return int(value)
    return None


def json_float(value: Any) -> float | None:
    """A finite number from JSON, or ``None`` (booleans, NaN, infinities, text)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and abs(number) < 1e18 else None


def json_str(value: Any) -> str | None:
    """``value`` when it is a string, else ``None``."""
    return value if isinstance(value, str) else None


def json_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else ``{}``."""
    return value if isinstance(value, Mapping) else {}


def rfc3339_s(text: Any) -> float | None:
    """Epoch seconds of an RFC 3339 time with a zone (``2025-03-04T05:06:07Z``), or ``None``
    for anything else (no zone, not a string, over 64 characters)."""
    if not isinstance(text, str) or not text or len(text) > 64:
        return None
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        return None
    return stamp.timestamp()

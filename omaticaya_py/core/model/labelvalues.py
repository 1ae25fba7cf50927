"""Label values: the Kubernetes rules for label keys and values, and the rounding of numbers.

Pure functions. ``is_valid_key``/``is_valid_value`` are the API server's own checks (a value it
would reject is never sent); ``quantise_*`` and ``stable_*`` turn a reading into the integer a
label carries, with hysteresis so that noise around a step edge does not become API writes.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = [
    "MAX_ANNOTATIONS_BYTES",
    "is_valid_key",
    "is_valid_value",
    "quantise_down",
    "quantise_nearest",
    "sanitise_value",
    "stable_down",
    "stable_nearest",
]

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_BAD_CHARS = re.compile(r"[^-A-Za-z0-9_.]+")
MAX_ANNOTATIONS_BYTES = 256 * 1024


@lru_cache(maxsize=4096)  # a tick renders the same keys as the last one
def is_valid_key(key: str) -> bool:
    """True if ``key`` is a Kubernetes qualified name (``[prefix/]name``) usable as a label key."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_NAME.match(name))


@lru_cache(maxsize=4096)  # and mostly the same values (bench/tick.py)
def is_valid_value(value: str) -> bool:
    """True if ``value`` is a valid label value: at most 63 characters of ``[-A-Za-z0-9_.]``,
    starting and ending alphanumeric (or empty)."""
    return len(value) <= 63 and bool(_VALUE.match(value))


def sanitise_value(text: str) -> str:
    """Turn free text (an NVML product name) into a label value: runs of other characters
    become ``-``, the ends are trimmed to alphanumerics, at most 63 characters.

    ``"NVIDIA H100 80GB HBM3"`` -> ``"NVIDIA-H100-80GB-HBM3"``.
    """
    value = _BAD_CHARS.sub("-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def quantise_down(value: float, step: int) -> int:
    """``value`` rounded down to a multiple of ``step`` (memory: a label never promises more)."""
    return int(value // step) * step


def quantise_nearest(value: float, step: int) -> int:
    """``value`` rounded half up to the nearest multiple of ``step`` (utilisation)."""
    if isinstance(value, int):  # exact for any size
        return (2 * value + step) // (2 * step) * step
    return int((value + step / 2) // step) * step


def stable_down(raw: float, step: int, previous: int | None, margin: float) -> int:
    """``quantise_down`` with hysteresis: the value drops as soon as the reading does (a label
    never promises more free memory than there is) but rises only once the reading passes the
    next step edge by ``margin``."""
    value = quantise_down(raw, step)
    if previous is None or value <= previous:
        return value
    return max(previous, quantise_down(raw - margin, step))


def stable_nearest(raw: float, step: int, previous: int | None, margin: float) -> int:
    """``quantise_nearest`` with hysteresis: the previous value is kept while the reading stays
    within half a step plus ``margin`` of it."""
    value = quantise_nearest(raw, step)
    if previous is None or value == previous or abs(raw - previous) >= step / 2 + margin:
        return value
    return previous

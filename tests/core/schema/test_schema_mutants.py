"""``core.schema`` cases that mutation testing (``scripts/mutation``) found no test pinned: the
lenient readers (``values``) at their bounds, and a whole number too large for a float, which
once raised out of ``Telemetry.parse`` (an ``OverflowError``, though it never raises);
``epoch_text`` in UTC whatever the machine's zone; the label table's queries (``names``); a
shared GPU's room (``GpuInfo.room_mib``); the telemetry's problems, exact JSON and readers of
booleans, text lists and entry lists; ``Telemetry.names_lease``."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from omaticaya_py.core.schema.gpustate import GpuInfo
from omaticaya_py.core.schema.names import (
    GPU_MEMORY_FREE,
    GPU_TEMPERATURE,
    HEALTH,
    MIG_COUNT,
    MIG_HEALTHY_COUNT,
    MIG_IDLE_COUNT,
    MIG_MEMORY_FREE,
    by_worse,
    mig_key,
)
from omaticaya_py.core.schema.telemetry import (
    MAX_TELEMETRY_BYTES,
    GpuTelemetry,
    PodTelemetry,
    Telemetry,
)
from omaticaya_py.core.schema.values import (
    MAX_EPOCH_S,
    epoch_text,
    json_float,
    json_int,
    rfc3339_s,
)

# ------------------------------------------------------------------------------ values ----

JSON_INTS = [
    (10**18 - 1, 10**18 - 1),
    (10**18, None),  # beyond 18 digits: no GPU has 10^18 MiB
    (-(10**18), None),
    (-(10**18) + 1, -(10**18) + 1),
    (2.7, 2),  # a finite float is truncated toward zero
    (-2.7, -2),
    (9.9e17, 990000000000000000),
    (1e18, None),
    (-1e18, None),
    (float("inf"), None),
    (float("-inf"), None),
    (float("nan"), None),
    (True, None),
    ("12", 12),
    ("1" * 19, None),
    (None, None),
]


@pytest.mark.parametrize(("value", "expected"), JSON_INTS, ids=[repr(v)[:24] for v, _ in JSON_INTS])
def test_json_int_at_its_bounds(value: Any, expected: int | None) -> None:
    assert json_int(value) == expected


JSON_FLOATS = [
    (1.5, 1.5),
    (3, 3.0),
    (-2.5, -2.5),
    (9.9e17, 9.9e17),
    (1e18, None),
    (-1e18, None),
    (10**18, None),
    (10**400, None),  # an int JSON allows, no float can hold
    (-(10**400), None),
    (float("inf"), None),
    (float("nan"), None),
    (True, None),
    (False, None),
    ("1.5", None),
    (None, None),
]


@pytest.mark.parametrize(
    ("value", "expected"), JSON_FLOATS, ids=[repr(v)[:24] for v, _ in JSON_FLOATS]
)
def test_json_float_at_its_bounds(value: Any, expected: float | None) -> None:
    result = json_float(value)
    assert result == expected and type(result) is type(expected)


def _stamp(length: int) -> str:
    """A valid RFC 3339 time of ``length`` characters (fractional seconds fill it)."""
    head, zone = "2025-03-04T05:06:07.", "+00:00"
    return head + "1" * (length - len(head) - len(zone)) + zone


RFC3339 = [
    ("2025-03-04T05:06:07Z", 1741064767.0),
    ("2025-03-04T05:06:07+01:00", 1741061167.0),
    ("1970-01-01T00:00:00Z", 0.0),  # the bounds, both kept
    ("9999-12-31T23:59:59Z", MAX_EPOCH_S),
    ("1969-12-31T23:59:59Z", None),
    ("2025-03-04T05:06:07", None),  # no zone
    ("", None),
    (_stamp(64), 1741064767.111111),  # at most 64 characters
    (_stamp(65), None),
    (1741064767, None),
    (None, None),
]


@pytest.mark.parametrize(("text", "expected"), RFC3339, ids=[repr(t)[:30] for t, _ in RFC3339])
def test_rfc3339_s(text: Any, expected: float | None) -> None:
    assert rfc3339_s(text) == expected


@pytest.fixture
def tokyo_time(monkeypatch: pytest.MonkeyPatch):
    """The process's local time zone nine hours east of UTC (no tz database needed)."""
    monkeypatch.setenv("TZ", "JST-9")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_epoch_text_is_utc_whatever_the_local_zone(tokyo_time) -> None:
    assert epoch_text(1741064767.9) == "2025-03-04T05:06:07Z"
    assert epoch_text(float("nan")) == "epoch nans"


# ------------------------------------------------------------------------------- names ----


def test_by_worse_is_the_rows_of_one_direction_and_scope() -> None:
    assert by_worse("less", "mig") == {
        MIG_COUNT,
        MIG_HEALTHY_COUNT,
        MIG_IDLE_COUNT,
        MIG_MEMORY_FREE,
    }
    assert by_worse("neutral", "gpu") == {GPU_TEMPERATURE}
    assert by_worse("health", "node") == {HEALTH}
    assert GPU_MEMORY_FREE in by_worse("less", "gpu")
    assert by_worse("neutral", "node") == frozenset()


def test_mig_key_spells_a_plus_as_a_dash() -> None:
    assert mig_key("1g.10gb+me", MIG_COUNT) == "mig-1g.10gb-me.count"
    assert mig_key("1g.10gb", MIG_COUNT) == "mig-1g.10gb.count"


# ---------------------------------------------------------------------------- gpustate ----

ROOMS = [
    # (id, free MiB, units left, units cap, expected room MiB at 1024 MiB a unit)
    ("no unit count: the live free memory", 5000, None, None, 5000),
    ("no unit count, below 0: none", -5, None, None, 0),
    ("units left, no cap", 10240, 4, None, 4096),
    ("a cap below the units left", 10240, 4, 2, 2048),
    ("a cap above the units left", 10240, 4, 9, 4096),
    ("the live memory below both", 3000, 4, 3, 3000),
]


@pytest.mark.parametrize(
    ("free", "left", "cap", "expected"), [r[1:] for r in ROOMS], ids=[r[0] for r in ROOMS]
)
def test_room_mib(free: int, left: int | None, cap: int | None, expected: int) -> None:
    gpu = GpuInfo(0, free, True, units_left=left, units_cap=cap)
    assert gpu.room_mib(1024) == expected


# --------------------------------------------------------------------------- telemetry ----


def test_telemetry_problems_are_named() -> None:
    assert Telemetry.parse(5) == (None, "unreadable telemetry annotation (not a string)")
    assert Telemetry.parse("[1]") == (None, "unreadable telemetry annotation")
    assert Telemetry.parse("{") == (None, "unreadable telemetry annotation")
    over = f"unreadable telemetry annotation (over {MAX_TELEMETRY_BYTES} bytes)"
    assert Telemetry.parse(" " * (MAX_TELEMETRY_BYTES + 1)) == (None, over)


def test_telemetry_of_the_largest_size_is_read() -> None:
    head = '{"read_at":"2026-01-01T00:00:00Z","agent":"'
    raw = head + "a" * (MAX_TELEMETRY_BYTES - len(head) - 2) + '"}'
    assert len(raw) == MAX_TELEMETRY_BYTES
    doc, problem = Telemetry.parse(raw)
    assert problem is None and doc is not None and doc.read_at == "2026-01-01T00:00:00Z"


def test_a_number_too_large_for_a_float_reads_as_none() -> None:
    """Issue: ``json_float`` raised ``OverflowError`` on a whole number no float can hold, out
    of ``Telemetry.parse`` (which never raises) and so out of ``parse_node``."""
    huge = "1" + "0" * 400
    raw = (
        f'{{"read_at":"2026-01-01T00:00:00Z","refresh_s":{huge},'
        f'"gpus":[{{"index":0,"utilization_pct":{huge},"power_w":-{huge}}}]}}'
    )
    doc, problem = Telemetry.parse(raw)
    assert problem is None and doc is not None
    assert doc.refresh_s is None
    assert [(g.index, g.utilization_pct, g.power_w) for g in doc.gpus] == [(0, None, None)]


def test_to_json_is_compact_with_sorted_keys_and_the_schema_by_its_name() -> None:
    doc = Telemetry.model_validate(
        {"schema": 2, "read_at": "2026-01-01T00:00:00Z", "agent": "a", "gpus": []}
    )
    assert doc.to_json() == (
        '{"agent":"a","cuda":null,"driver":null,"gpus":[],"health":null,'
        '"read_at":"2026-01-01T00:00:00Z","schema":2,"source":null}'
    )


def test_gpu_booleans_and_reasons_read_leniently() -> None:
    g = GpuTelemetry.model_validate(
        {"index": 0, "remapped_rows_pending": True, "remapped_rows_failure": "yes",
         "reasons": ["xid-79", 5, None, "hot"]}
    )  # fmt: skip
    assert (g.remapped_rows_pending, g.remapped_rows_failure) == (True, None)
    assert g.reasons == ("xid-79", "hot")
    assert GpuTelemetry.model_validate({"index": 0, "reasons": "xid-79"}).reasons == ()
    assert GpuTelemetry.model_validate({"index": 0, "reasons": ("a", "b")}).reasons == ("a", "b")


def test_entries_skip_the_unreadable_and_keep_the_rest() -> None:
    """A GPU's or pod's entry that is not an object, or has no whole ``index``, is skipped;
    the entries after it are kept; a list that is absent stays absent (``pods`` is ``None``:
    no attribution), and one that is not a list reads as empty."""
    doc, _ = Telemetry.parse(json.dumps({
        "read_at": "2026-01-01T00:00:00Z",
        "gpus": [
            "gpu0", {"index": "x"},
            {"index": 1, "pods": [5, {"namespace": "ns", "pod": "p"}, {"namespace": "ns", "pod": "q"}]},
            {"index": 2},
            {"index": 3, "pods": "none"},
        ],
    }))  # fmt: skip
    assert doc is not None
    assert [g.index for g in doc.gpus] == [1, 2, 3]
    assert [(p.namespace, p.pod) for p in doc.gpus[0].pods or ()] == [("ns", "p"), ("ns", "q")]
    assert doc.gpus[1].pods is None
    assert doc.gpus[2].pods == ()
    assert Telemetry.model_validate({"gpus": "all"}).gpus == ()
    # entries already read are kept as they are
    pod = PodTelemetry(namespace="ns", pod="p")
    gpu = GpuTelemetry.model_validate({"index": 4, "pods": (pod,)})
    assert gpu.pods == (pod,)
    assert Telemetry.model_validate({"gpus": (gpu,)}).gpus == (gpu,)


@pytest.mark.parametrize(
    ("raw", "lease", "named"),
    [
        ('{"lease":"ns/agent-n1","read_at":"x"}', "ns/agent-n1", True),
        ('{"lease":"ns/agent-n2","read_at":"x"}', "ns/agent-n1", False),
        ('{"read_at":"x"}', "ns/agent-n1", False),
        (None, "ns/agent-n1", False),
    ],
)
def test_names_lease(raw: str | None, lease: str, named: bool) -> None:
    assert Telemetry.names_lease(raw, lease) is named

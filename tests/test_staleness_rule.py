"""The one liveness rule (``core.liveness``), as tables: the extender and ``omaticaya top`` both
judge an agent by it. Times an agent publishes are untrusted: its clock may be off, anyone who
can write the Node or the Lease can write them. What counts is when the reader saw the value
change, on its own monotonic clock, with the publisher's times as a bound."""

from __future__ import annotations

import json

import pytest

from omaticaya_py.core.liveness import (
    AHEAD,
    FRESH,
    READ_AT_AHEAD,
    RENEW_TIME_AHEAD,
    STALE,
    LeaseState,
    Seen,
    judge_liveness,
    lease_from_object,
    node_liveness,
    observe,
)
from omaticaya_py.core.schema import parse_node, rfc3339_s
from omaticaya_py.core.schema.values import epoch_text

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z, the reader's wall clock
MONO = 50_000.0  # the reader's monotonic clock at NOW
DAY = 86_400.0

# (id, published - NOW, valid_s, seen, kind, age_s, observed); grace 60, skew 300
RULE = [
    ("never watched, fresh", -100, 330, None, FRESH, 100, False),
    ("never watched, at the edge", -390, 330, None, FRESH, 390, False),
    ("never watched, stale", -391, 330, None, STALE, 391, False),
    ("within the skew ahead", 299, 330, None, FRESH, -299, False),
    ("just past the skew ahead", 301, 330, None, AHEAD, 0, False),
    ("a year ahead, never watched", 365 * DAY, 330, None, AHEAD, 0, False),
    ("a year ahead, changing", 365 * DAY, 330, Seen(MONO - 1, True), AHEAD, 0, False),
    # an agent whose clock is 10 min behind: fresh while its values keep changing
    ("10 min behind, changed 5 s ago", -605, 330, Seen(MONO - 5, True), FRESH, 5, True),
    ("10 min behind, changed 391 s ago", -605, 330, Seen(MONO - 391, True), STALE, 391, True),
    # before a change is seen (the reader just started): the publisher's clock bounds it
    ("10 min behind, first sighting", -605, 330, Seen(MONO - 5, False), STALE, 605, False),
    # a dead agent: its value stops changing; its own times cannot keep it fresh
    ("dead, 200 s ahead, changed 400 s ago", 200, 330, Seen(MONO - 400, True), STALE, 400, True),
    ("dead, 200 s ahead, seen 400 s unchanged", 200, 330, Seen(MONO - 400, False), STALE, 400, True),
    ("dead, seen unchanged since start", -100, 330, Seen(MONO - 500, False), STALE, 500, True),
    ("synced, changed 10 s ago", -10, 40, Seen(MONO - 10, True), FRESH, 10, True),
    ("seen in the future (a clock that stepped)", -10, 40, Seen(MONO + 5, True), FRESH, 0, True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("offset", "valid_s", "seen", "kind", "age_s", "observed"),
    [r[1:] for r in RULE],
    ids=[r[0] for r in RULE],
)
def test_the_rule(offset, valid_s, seen, kind, age_s, observed):
    got = judge_liveness(
        NOW + offset, valid_s, seen, now_s=NOW, now_mono_s=MONO, grace_s=60, max_skew_s=300
    )
    assert (got.kind, got.age_s, got.observed) == (kind, age_s, observed)
    assert got.limit_s == valid_s + 60 and got.ahead_s == offset


def test_without_a_monotonic_clock_only_the_publisher_counts():
    got = judge_liveness(NOW - 605, 330, Seen(MONO, True), now_s=NOW, now_mono_s=None, grace_s=60)
    assert (got.kind, got.age_s, got.observed) == (STALE, 605, False)


# (id, value before, its Seen, value now, expected Seen) at monotonic 10
OBSERVE = [
    ("first value", None, None, 5.0, Seen(10, False)),
    ("unchanged keeps its sighting", 5.0, Seen(3, False), 5.0, Seen(3, False)),
    ("unchanged after a change", 5.0, Seen(3, True), 5.0, Seen(3, True)),
    ("changed", 5.0, Seen(3, False), 6.0, Seen(10, True)),
    ("changed backwards is a change", 5.0, Seen(3, True), 4.0, Seen(10, True)),
    ("gone", 5.0, Seen(3, True), None, None),
    ("back after gone", None, None, 6.0, Seen(10, False)),
]


@pytest.mark.parametrize(
    ("before", "before_seen", "value", "expected"),
    [r[1:] for r in OBSERVE],
    ids=[r[0] for r in OBSERVE],
)
def test_observe(before, before_seen, value, expected):
    assert observe(before, before_seen, value, 10.0) == expected


def test_a_lease_watch_sees_renewals():
    spec = {"holderIdentity": "a", "renewTime": "2026-01-01T00:00:00Z", "leaseDurationSeconds": 40}
    first = lease_from_object({"spec": spec}, None, 100.0)
    assert first.seen == Seen(100.0, False)
    same = lease_from_object({"spec": spec}, first, 130.0)
    assert same.seen == Seen(100.0, False)
    renewed = lease_from_object(
        {"spec": {**spec, "renewTime": "2026-01-01T00:00:10Z"}}, same, 140.0
    )
    assert renewed.seen == Seen(140.0, True)
    assert lease_from_object({"spec": spec}).seen is None  # not watched


# ------------------------------------------------------------------- node_liveness ----

P = "omaticaya.io/"
REF = "omaticaya/omaticaya-node-n"


def stamp(offset: float) -> str:
    return epoch_text(NOW + offset)


def node(read_at: float, expires_in: float | None = None, lease: str | None = None):
    doc = {"read_at": stamp(read_at), "health": "Healthy",
           "gpus": [{"index": 0, "memory_free_mib": 40960, "health": "Healthy"}]}  # fmt: skip
    if expires_in is not None:
        doc["expires_at"] = stamp(read_at + expires_in)
    if lease is not None:
        doc["lease"] = lease
    return parse_node("n", {P + "gpu.health": "Healthy"}, {P + "telemetry": json.dumps(doc)})


def held(renewed: float, seen: Seen | None = None, holder: str = "agent") -> LeaseState:
    return LeaseState(holder, NOW + renewed, 40.0, seen)


# (id, state, seen of read_at, leases (None: no Lease watch), kind, text in why, problem)
NODES = [
    ("expires_at ahead", node(-100, 330), None, None, FRESH, "", None),
    ("past expires_at", node(-400, 330), None, None, STALE,
     f"{P}telemetry expired at {stamp(-70)}, grace 60s", None),
    ("no expires_at: ttl", node(-361), None, None, STALE, f"{P}telemetry read_at older than 360s", None),
    ("no expires_at, within ttl", node(-359), None, None, FRESH, "", None),
    ("read_at a year ahead", node(365 * DAY, 330), None, None, AHEAD,
     f"{P}telemetry read_at {stamp(365 * DAY)} is 31536000s ahead of this clock (allowed skew 300s)",
     READ_AT_AHEAD),
    ("10 min behind, changing", node(-605, 330), Seen(MONO - 5, True), None, FRESH, "", None),
    ("stopped changing", node(-10, 330), Seen(MONO - 400, True), None, STALE,
     f"{P}telemetry read_at unchanged for 400s (limit 390s)", None),
    ("Lease renewed", node(-DAY, lease=REF), None, {REF: held(-10)}, FRESH, "", None),
    ("Lease renewed, its holder 10 min behind", node(-DAY, lease=REF), None,
     {REF: held(-610, Seen(MONO - 5, True))}, FRESH, "", None),
    ("Lease expired", node(-DAY, lease=REF), None, {REF: held(-101)}, STALE,
     f"Lease {REF} expired at {stamp(-61)}, grace 60s", None),
    ("Lease stopped changing", node(-DAY, lease=REF), None, {REF: held(0, Seen(MONO - 101, True))},
     STALE, f"Lease {REF} renewTime unchanged for 101s (limit 100s)", None),
    ("Lease a year ahead", node(-DAY, lease=REF), None, {REF: held(365 * DAY)}, AHEAD,
     f"Lease {REF} renewTime {stamp(365 * DAY)} is 31536000s ahead", RENEW_TIME_AHEAD),
    ("Lease in year 9999", node(-DAY, lease=REF), None, {REF: held(rfc3339_s("9999-12-31T23:59:59Z") - NOW)},
     AHEAD, f"Lease {REF} renewTime 9999-12-31T23:59:59Z", RENEW_TIME_AHEAD),
    ("Lease released", node(-DAY, lease=REF), None, {REF: held(-1, holder="")}, STALE,
     f"Lease {REF} released (no holder)", None),
    ("Lease missing", node(-DAY, lease=REF), None, {}, STALE, f"Lease {REF} not found", None),
    ("read_at ahead beats a good Lease", node(365 * DAY, lease=REF), None, {REF: held(-1)}, AHEAD,
     "read_at", READ_AT_AHEAD),
    ("no Lease watch: read_at", node(-DAY, lease=REF), None, None, STALE, "older than 360s", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("state", "seen", "leases", "kind", "why", "problem"),
    [r[1:] for r in NODES],
    ids=[r[0] for r in NODES],
)
def test_node_liveness(state, seen, leases, kind, why, problem):
    got = node_liveness(
        state, seen=seen, leases=leases.get if leases is not None else None, now_s=NOW,
        now_mono_s=MONO, ttl_s=300, grace_s=60, max_skew_s=300,
    )  # fmt: skip
    assert (got.kind, got.problem) == (kind, problem)
    assert why in got.why and (kind != FRESH or got.why == "")


@pytest.mark.parametrize(
    "text",
    ["0001-01-01T00:00:00+23:59", "0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z",
     "9999-12-31T23:59:59-23:59", "0000-01-01T00:00:00Z"],
)  # fmt: skip
def test_times_no_date_can_be_made_of_are_not_read(text):
    assert rfc3339_s(text) is None


@pytest.mark.parametrize("epoch_s", [-62135683140.0, 1e300, float("nan"), float("inf"), -1e300])
def test_a_time_is_always_printable(epoch_s):
    assert epoch_text(epoch_s).startswith("epoch ")

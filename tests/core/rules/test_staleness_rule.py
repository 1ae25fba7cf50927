"""The one liveness rule (``core.rules.liveness``), as tables: the extender and ``omaticaya top`` both
judge an agent by it. Times an agent publishes are untrusted: its clock may be off, anyone who
can write the Node or the Lease can write them. What counts is when the reader saw the value
change, on its own monotonic clock, with the publisher's times as a bound.

Then staleness that matches the publisher: the agent publishes how long its telemetry stays
current (``refresh_s`` and ``expires_at``: the heartbeat plus one schedule period plus the
jitter), and the extender uses it, falling back to its own TTL for agents that do not say."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from omaticaya_py.agent import Agent, NodeApi
from omaticaya_py.core.rules.liveness import (
    AHEAD,
    FRESH,
    READ_AT_AHEAD,
    RENEW_TIME_AHEAD,
    STALE,
    LeaseState,
    LivenessClock,
    Seen,
    judge_liveness,
    lease_from_object,
    node_liveness,
    observe,
)
from omaticaya_py.core.schema import parse_node, rfc3339_s
from omaticaya_py.core.schema.values import epoch_text
from omaticaya_py.kube import NodeClient
from omaticaya_py.scheduler import ExtenderSettings
from omaticaya_py.scheduler.protocol import handle_filter
from omaticaya_py.sources.replay import TraceReader
from tests.conftest import node_metadata
from tests.helpers import H100_TRACE, settings

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
    got = judge_liveness(NOW + offset, valid_s, seen, LivenessClock(NOW, 60, MONO, 300))
    assert (got.kind, got.age_s, got.observed) == (kind, age_s, observed)
    assert got.limit_s == valid_s + 60 and got.ahead_s == offset


def test_without_a_monotonic_clock_only_the_publisher_counts():
    got = judge_liveness(NOW - 605, 330, Seen(MONO, True), LivenessClock(NOW, 60, None))
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
        state, LivenessClock(NOW, 60, MONO, 300), ttl_s=300, seen=seen,
        leases=leases.get if leases is not None else None,
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


# ------------------------------------- the publisher's expiry, as the extender reads it ----

EXT = ExtenderSettings(_env_file=None)  # type: ignore[call-arg]  (TTL 300 + grace 60)


def pod(mib: int = 1024) -> dict:
    return {"metadata": {"annotations": {P + "gpu-memory-mib": str(mib)}}}


def verdict(name: str, labels: dict, annotations: dict, now: float) -> tuple[bool, str]:
    state = parse_node(name, labels, annotations)
    result = handle_filter({"Pod": pod(), "NodeNames": [name]}, EXT, {name: state}.get, now=now)
    return name in result["NodeNames"], result["FailedNodes"].get(name, "")


@pytest.mark.cluster
def test_an_hourly_agent_is_not_stale_between_its_writes(dev_cluster, admin_api, make_node):
    """``@hourly`` with a 2-hour heartbeat: the telemetry is rewritten up to ~3 h apart. The
    extender's fixed 300 + 60 s window called such a node stale after six minutes."""
    node = make_node()
    s = settings(node_name=node, trace=H100_TRACE, schedule="@hourly", heartbeat_s=7200, jitter_s=30)
    client = NodeClient(node, kubeconfig=str(dev_cluster.kubeconfig))
    agent = Agent(s, TraceReader(H100_TRACE), NodeApi(client))
    agent.tick()
    labels, annotations = node_metadata(admin_api, node)
    doc = json.loads(annotations[P + "telemetry"])
    read_at = datetime.fromisoformat(doc["read_at"].replace("Z", "+00:00")).timestamp()
    assert doc["refresh_s"] == 7200 + 3600 + 30
    expires = datetime.fromisoformat(doc["expires_at"].replace("Z", "+00:00")).timestamp()
    assert expires == read_at + 7200 + 3600 + 30

    assert verdict(node, labels, annotations, now=read_at + 3600) == (True, "")
    assert verdict(node, labels, annotations, now=expires + EXT.grace_s - 1)[0]
    ok, reason = verdict(node, labels, annotations, now=expires + EXT.grace_s + 1)
    assert not ok and "stale GPU telemetry" in reason and "expired" in reason


def test_an_old_agent_without_expiry_gets_the_extenders_ttl():
    doc = {"read_at": "2026-01-01T00:00:00Z", "health": "Healthy",
           "gpus": [{"index": 0, "memory_free_mib": 40960, "health": "Healthy"}]}  # fmt: skip
    at = datetime.fromisoformat("2026-01-01T00:00:00+00:00").timestamp()
    ann = {P + "telemetry": json.dumps(doc)}
    assert verdict("old", {P + "gpu.health": "Healthy"}, ann, now=at + 359)[0]
    ok, reason = verdict("old", {P + "gpu.health": "Healthy"}, ann, now=at + 361)
    assert not ok and "read_at older than 360s" in reason


@pytest.mark.parametrize(
    "expires_at",
    ["2025-12-31T23:00:00Z", "soon", 12, None, "9999-12-31T23:59:59Z"],
    ids=["before-read_at", "not-a-time", "a-number", "null", "year-9999"],
)
def test_a_bad_expiry_is_not_trusted(expires_at):
    """An ``expires_at`` before ``read_at``, unreadable, or more than 8 days after it (no working
    agent promises that: someone else wrote it) falls back to the TTL."""
    doc = {"read_at": "2026-01-01T00:00:00Z", "expires_at": expires_at, "health": "Healthy",
           "gpus": [{"index": 0, "memory_free_mib": 40960, "health": "Healthy"}]}  # fmt: skip
    at = datetime.fromisoformat("2026-01-01T00:00:00+00:00").timestamp()
    state = parse_node("n", {P + "gpu.health": "Healthy"}, {P + "telemetry": json.dumps(doc)})
    assert state.expires_at is None
    assert not verdict("n", {P + "gpu.health": "Healthy"}, {P + "telemetry": json.dumps(doc)}, now=at + 400)[0]

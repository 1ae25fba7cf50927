"""``core.rules.liveness`` cases that mutation testing (``scripts/mutation``) found no test
pinned: the edges of the skew and of the limit (both allowed), a value seen unchanged exactly as
long as the publisher says (observed), the published time in every verdict, a first sighting
when only one of the two things held before is known, a node without ``read_at``, and the
exact words of a Lease that cannot be judged."""

from __future__ import annotations

import pytest

from omaticaya_py.core.rules.liveness import (
    AHEAD,
    FRESH,
    MAX_LEASE_DURATION_S,
    STALE,
    LivenessClock,
    LivenessVerdict,
    NodeLiveness,
    Seen,
    judge_liveness,
    lease_from_object,
    node_liveness,
    observe,
)
from omaticaya_py.core.schema import NodeGpuState

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z, the reader's wall clock
MONO = 50_000.0  # the reader's monotonic clock at NOW
CLOCK = LivenessClock(NOW, 60, MONO, 300)  # grace 60 s, skew 300 s


# --- the rule -----------------------------------------------------------------------------------


def test_a_time_exactly_the_skew_ahead_is_allowed() -> None:
    assert judge_liveness(NOW + 300, 330, None, CLOCK) == LivenessVerdict(
        FRESH, -300, 390, False, 300, NOW + 300
    )
    assert judge_liveness(NOW + 300.5, 330, None, CLOCK).kind == AHEAD


def test_every_verdict_carries_the_published_time() -> None:
    for offset, seen in ((-10.0, None), (-1000.0, None), (-10.0, Seen(MONO - 5, True))):
        assert judge_liveness(NOW + offset, 330, seen, CLOCK).published_s == NOW + offset


def test_seen_unchanged_as_long_as_the_publisher_says_is_observed() -> None:
    """A tie of the two ages goes to this process's own clock."""
    got = judge_liveness(NOW - 100, 330, Seen(MONO - 100, False), CLOCK)
    assert (got.kind, got.age_s, got.observed) == (FRESH, 100, True)


@pytest.mark.parametrize(
    ("previous", "previous_seen", "value", "expected"),
    [
        (5.0, None, 5.0, Seen(10.0, False)),  # a value held but never seen: a first sighting
        (5.0, None, 6.0, Seen(10.0, False)),
        (None, Seen(3.0, True), 6.0, Seen(10.0, False)),  # a sighting of no value
    ],
)
def test_a_first_sighting_when_half_of_the_past_is_unknown(
    previous, previous_seen, value, expected
) -> None:
    assert observe(previous, previous_seen, value, 10.0) == expected


# --- nodes --------------------------------------------------------------------------------------


def test_a_node_read_exactly_the_skew_ahead_is_judged_not_refused() -> None:
    state = NodeGpuState("n", known=True, read_at=NOW + 300, expires_at=NOW + 630)
    assert node_liveness(state, CLOCK, ttl_s=300) == NodeLiveness(FRESH)


def test_a_node_exactly_at_its_limit_is_fresh() -> None:
    state = NodeGpuState("n", known=True, read_at=NOW - 390, expires_at=NOW - 60)  # 330 s + 60
    assert node_liveness(state, CLOCK, ttl_s=300) == NodeLiveness(FRESH)
    state = NodeGpuState("n", known=True, read_at=NOW - 391, expires_at=NOW - 61)
    assert node_liveness(state, CLOCK, ttl_s=300).kind == STALE


def test_a_node_without_read_at_is_read_now() -> None:
    state = NodeGpuState("n", known=True)
    assert node_liveness(state, CLOCK, ttl_s=300) == NodeLiveness(FRESH)


# --- leases -------------------------------------------------------------------------------------

RENEWED = "2026-01-01T00:00:00Z"


@pytest.mark.parametrize("duration", [1, int(MAX_LEASE_DURATION_S)])
def test_a_lease_duration_at_either_end_of_the_range_is_read(duration) -> None:
    spec = {"holderIdentity": "a", "renewTime": RENEWED, "leaseDurationSeconds": duration}
    assert lease_from_object({"spec": spec}).duration_s == float(duration)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"holderIdentity": 7, "renewTime": RENEWED, "leaseDurationSeconds": 40},
         "holderIdentity is not a string"),
        ({"holderIdentity": "a", "leaseDurationSeconds": 40}, "no valid renewTime"),
        ({"holderIdentity": "a", "renewTime": RENEWED, "leaseDurationSeconds": "40"},
         "leaseDurationSeconds is not a whole number"),
        ({"holderIdentity": "a", "renewTime": RENEWED, "leaseDurationSeconds": 0},
         "leaseDurationSeconds 0 out of range"),
        ({"holderIdentity": "a", "renewTime": RENEWED, "leaseDurationSeconds": int(MAX_LEASE_DURATION_S) + 1},
         f"leaseDurationSeconds {int(MAX_LEASE_DURATION_S) + 1} out of range"),
    ],
)  # fmt: skip
def test_a_lease_that_cannot_be_judged_by_says_which_field(spec, message) -> None:
    with pytest.raises(ValueError) as raised:
        lease_from_object({"spec": spec})
    assert str(raised.value) == message

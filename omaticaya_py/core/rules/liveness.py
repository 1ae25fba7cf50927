"""Is an agent alive? One rule for every reader of its telemetry (the scheduler extender,
``omaticaya top``): pure, over times already read.

An agent publishes a time that moves while it lives: its telemetry's ``read_at`` (current for
``expires_at - read_at`` seconds, the agent's promise; for an agent that promises nothing, the
reader's ``ttl_s``), or, when the telemetry names a Lease, that Lease's ``renewTime`` (current
for ``leaseDurationSeconds``). Those times come from the agent's clock, and anyone who can write
the Node or the Lease can write them, so they are judged as the node lifecycle controller
judges a kubelet's Lease: by when this process saw the value change, on its own monotonic clock
(``Seen``), with the publisher's times as a bound:

- a published time more than ``max_skew_s`` ahead of this clock is the node's problem
  (``AHEAD``): no agent whose clock is within the allowed skew writes it;
- once this process has seen the value change, the value's age is the time since that change
  on the monotonic clock, whatever the agent's clock says (an agent 10 min behind is fresh
  while its values keep changing; a value that stopped changing goes stale however far ahead
  it claims to be);
- before any change has been seen (the first value after this process started, or a reader
  without a watch), the age is the larger of the time this process has seen the value
  unchanged and the publisher's own ``now - published``: a value from a dead agent is never
  younger than the time it has been seen unchanged;
- the value is ``FRESH`` while its age is at most its validity plus ``grace_s``, else ``STALE``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple

from ..schema.nodestate import NodeGpuState
from ..schema.values import epoch_text, json_mapping, rfc3339_s

__all__ = [
    "AHEAD",
    "DEFAULT_MAX_CLOCK_SKEW_S",
    "FRESH",
    "MAX_LEASE_DURATION_S",
    "READ_AT_AHEAD",
    "RENEW_TIME_AHEAD",
    "STALE",
    "LeaseOf",
    "LeaseState",
    "LivenessClock",
    "LivenessVerdict",
    "NodeLiveness",
    "Seen",
    "judge_liveness",
    "lease_from_object",
    "lease_liveness",
    "node_liveness",
    "observe",
]

FRESH: Final = "fresh"
STALE: Final = "stale"
AHEAD: Final = "ahead"
Kind = Literal["fresh", "stale", "ahead"]

#: how far ahead of the reader's clock a published time may be (Kerberos' default tolerance)
DEFAULT_MAX_CLOCK_SKEW_S = 300.0
#: the longest ``leaseDurationSeconds`` trusted (as ``schema.MAX_REFRESH_S`` for ``expires_at``)
MAX_LEASE_DURATION_S = 8 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Seen:
    """When this process saw a published time take its current value: ``at_s`` on its own
    monotonic clock (``time.monotonic()``), and ``changed``: True when it saw the value change
    to this one, False when this is the first value it saw (it may be of any age)."""

    at_s: float
    changed: bool = False


def observe(
    previous: float | None, previous_seen: Seen | None, value: float | None, now_mono_s: float
) -> Seen | None:
    """The ``Seen`` of ``value`` (epoch seconds, the publisher's), given the value held before
    (``previous``, with its ``previous_seen``) and the monotonic time now. ``None`` when
    ``value`` is ``None``; the old ``Seen`` when the value did not change; a first sighting
    (``changed`` False) when there was no value before."""
    if value is None:
        return None
    if previous is None or previous_seen is None:
        return Seen(now_mono_s, changed=False)
    if previous == value:
        return previous_seen
    return Seen(now_mono_s, changed=True)


class LivenessVerdict(NamedTuple):
    """The verdict of ``judge_liveness``: ``kind`` (``FRESH``, ``STALE``, ``AHEAD``);
    ``age_s``, the age judged by; ``limit_s``, the validity plus the grace; ``observed``: the
    age is the time this process has seen the value unchanged, on its own clock (False: the
    publisher's ``now - published``); ``ahead_s``: how far the published time is ahead of the
    reader's wall clock (negative: behind); ``published_s``, the published time (epoch
    seconds). (A tuple: made for every node of every request.)"""

    kind: Kind
    age_s: float
    limit_s: float
    observed: bool
    ahead_s: float
    published_s: float

    @property
    def fresh(self) -> bool:
        return self.kind == FRESH


@dataclass(frozen=True, slots=True)
class LivenessClock:
    """How the reader judges a published time: ``now_s``, its wall clock (epoch seconds);
    ``grace_s``, seconds allowed past a value's validity (the agent's schedule, clock skew);
    ``now_mono_s``, its monotonic clock (``None``: no observation used); ``max_skew_s``, how
    far ahead of ``now_s`` a published time may be before it is ``AHEAD``."""

    now_s: float
    grace_s: float
    now_mono_s: float | None = None
    max_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S


def judge_liveness(published_s: float, valid_s: float, seen: Seen | None,
                   clock: LivenessClock) -> LivenessVerdict:  # fmt: skip
    """The rule in the module's docstring. ``published_s``: ``read_at`` or ``renewTime``
    (epoch seconds, the agent's clock); ``valid_s``: how long it stays current (``expires_at -
    read_at``, ``ttl_s``, ``leaseDurationSeconds``); ``seen``: when this process saw it take its
    value (``None``: never watched); ``clock``: the reader's clocks and allowances
    (``LivenessClock``). Pure; never raises on finite numbers."""
    ahead_s = published_s - clock.now_s
    limit_s = valid_s + clock.grace_s
    if ahead_s > clock.max_skew_s:
        return LivenessVerdict(AHEAD, 0.0, limit_s, False, ahead_s, published_s)
    age_s, observed = _age(published_s, seen, clock.now_s, clock.now_mono_s)
    kind: Kind = FRESH if age_s <= limit_s else STALE
    return LivenessVerdict(kind, age_s, limit_s, observed, ahead_s, published_s)


def _age(
    published_s: float, seen: Seen | None, now_s: float, now_mono_s: float | None
) -> tuple[float, bool]:
    """(age in seconds, observed) of a published time, by the rule (times not ahead)."""
    publisher_age_s = now_s - published_s
    if seen is None or now_mono_s is None:
        return publisher_age_s, False
    seen_age_s = max(0.0, now_mono_s - seen.at_s)
    if seen.changed:
        return seen_age_s, True
    if seen_age_s >= publisher_age_s:
        return seen_age_s, True
    return publisher_age_s, False


def ahead_text(what: str, verdict: LivenessVerdict, max_skew_s: float) -> str:
    """Why an ``AHEAD`` time is refused, for a message: ``<what> 3025-01-01T00:00:00Z is
    31536000000s ahead of this clock (allowed skew 300s)``."""
    return (
        f"{what} {epoch_text(verdict.published_s)} is {verdict.ahead_s:.0f}s ahead of this "
        f"clock (allowed skew {max_skew_s:g}s)"
    )


def unchanged_text(what: str, verdict: LivenessVerdict) -> str:
    """Why a value seen unchanged is stale: ``<what> unchanged for 400s (limit 390s)``."""
    return f"{what} unchanged for {verdict.age_s:.0f}s (limit {verdict.limit_s:g}s)"


# ----------------------------------------------------------------------------- leases ----


@dataclass(frozen=True, slots=True)
class LeaseState:
    """What a reader keeps of a ``coordination.k8s.io/v1`` Lease: ``holder``
    (``holderIdentity``, empty: released), ``renewed_at`` (``renewTime``, epoch seconds),
    ``duration_s`` (``leaseDurationSeconds``) and ``seen``: when the reader saw ``renewTime``
    take its value (``None``: not watched)."""

    holder: str
    renewed_at: float
    duration_s: float
    seen: Seen | None = None


def lease_from_object(
    lease: Any, previous: LeaseState | None = None, now_mono_s: float | None = None
) -> LeaseState:
    """A Lease document as ``LeaseState``; with ``previous`` (the state held for that Lease
    before) and ``now_mono_s``, its ``seen`` follows ``observe``. Raises ``ValueError`` (naming
    the field) on a Lease that cannot be judged by: no ``renewTime`` (or one outside 1970..9999),
    a ``leaseDurationSeconds`` that is not a whole number from 1 to ``MAX_LEASE_DURATION_S``, a
    ``holderIdentity`` that is not text."""
    spec = json_mapping(json_mapping(lease).get("spec"))
    holder = spec.get("holderIdentity")
    if holder is None:
        holder = ""
    if not isinstance(holder, str):
        raise ValueError("holderIdentity is not a string")
    renewed_at = rfc3339_s(spec.get("renewTime"))
    if renewed_at is None:
        raise ValueError("no valid renewTime")
    duration = spec.get("leaseDurationSeconds")
    if isinstance(duration, bool) or not isinstance(duration, int):
        raise ValueError("leaseDurationSeconds is not a whole number")
    if not 1 <= duration <= MAX_LEASE_DURATION_S:
        raise ValueError(f"leaseDurationSeconds {duration} out of range")
    seen = None
    if now_mono_s is not None:
        before = previous.renewed_at if previous is not None else None
        seen = observe(before, previous.seen if previous else None, renewed_at, now_mono_s)
    return LeaseState(holder=holder, renewed_at=renewed_at, duration_s=float(duration), seen=seen)


def lease_liveness(lease: LeaseState, clock: LivenessClock) -> LivenessVerdict:
    """``judge_liveness`` of a Lease's ``renewTime`` over its ``leaseDurationSeconds``."""
    return judge_liveness(lease.renewed_at, lease.duration_s, lease.seen, clock)


# ------------------------------------------------------------------------------- nodes ----

#: a Lease by ``"<namespace>/<name>"`` (``None``: no such Lease), from a synced Lease watch
LeaseOf = Callable[[str], "LeaseState | None"]


@dataclass(frozen=True, slots=True)
class NodeLiveness:
    """Whether a node's agent is alive (``node_liveness``): ``kind`` (``FRESH``, ``STALE``,
    ``AHEAD``), ``why`` (for a message, empty when fresh) and ``problem``, a short fixed name
    for counting (``None`` unless ``AHEAD``: the node's data is unusable, not old)."""

    kind: Kind
    why: str = ""
    problem: str | None = None


FRESH_NODE = NodeLiveness(FRESH)
#: the ``problem`` of a node whose published time is ahead of the reader's clock
READ_AT_AHEAD = "telemetry read_at ahead of the clock"
RENEW_TIME_AHEAD = "Lease renewTime ahead of the clock"


def node_liveness(
    state: NodeGpuState,
    clock: LivenessClock,
    *,
    ttl_s: float,
    seen: Seen | None = None,
    leases: LeaseOf | None = None,
    prefix: str = "omaticaya.io",
) -> NodeLiveness:
    """The liveness of the agent behind ``state`` (a node with usable telemetry: ``read_at``
    set), judged on ``clock`` (``LivenessClock``: epoch and monotonic seconds, the grace and
    the skew allowed). ``seen``: when the reader saw ``read_at`` take its value. With
    ``leases`` (a synced Lease watch), a node whose telemetry names a Lease is judged by that
    Lease: stale when it is missing or released, else by its ``renewTime`` over
    ``leaseDurationSeconds``; otherwise by ``read_at`` over ``expires_at - read_at`` (or
    ``ttl_s`` when the agent promised no expiry). A ``read_at`` (any mode) or ``renewTime``
    more than ``clock.max_skew_s`` ahead of ``clock.now_s`` is ``AHEAD``."""
    now_s = clock.now_s
    read_at = state.read_at if state.read_at is not None else now_s
    valid_s = state.expires_at - read_at if state.expires_at is not None else ttl_s
    if read_at - now_s > clock.max_skew_s:
        telemetry = judge_liveness(read_at, valid_s, seen, clock)
        why = ahead_text(f"{prefix}/telemetry read_at", telemetry, clock.max_skew_s)
        return NodeLiveness(AHEAD, why, READ_AT_AHEAD)
    if leases is not None and state.lease is not None:
        return _by_lease(state.lease, leases(state.lease), clock)
    # the common case first, no objects made: fresh by read_at
    if _age(read_at, seen, now_s, clock.now_mono_s)[0] <= valid_s + clock.grace_s:
        return FRESH_NODE
    telemetry = judge_liveness(read_at, valid_s, seen, clock)
    what = f"{prefix}/telemetry read_at"
    if telemetry.observed:
        return NodeLiveness(STALE, unchanged_text(what, telemetry))
    if state.expires_at is not None:
        stamp = epoch_text(state.expires_at)
        return NodeLiveness(STALE, f"{prefix}/telemetry expired at {stamp}, grace {clock.grace_s:g}s")
    return NodeLiveness(STALE, f"{what} older than {ttl_s + clock.grace_s:g}s")


def _by_lease(ref: str, lease: LeaseState | None, clock: LivenessClock) -> NodeLiveness:
    """A node's liveness by Lease ``ref`` (``"<namespace>/<name>"``), as the watch holds it
    (``lease``; ``None``: no such Lease): stale when missing or released, else by its
    ``renewTime`` over ``leaseDurationSeconds`` (``lease_liveness``)."""
    if lease is None:
        return NodeLiveness(STALE, f"Lease {ref} not found")
    if not lease.holder:
        return NodeLiveness(STALE, f"Lease {ref} released (no holder)")
    verdict = lease_liveness(lease, clock)
    if verdict.kind == AHEAD:
        why = ahead_text(f"Lease {ref} renewTime", verdict, clock.max_skew_s)
        return NodeLiveness(AHEAD, why, RENEW_TIME_AHEAD)
    if verdict.kind == STALE:
        if verdict.observed:
            return NodeLiveness(STALE, unchanged_text(f"Lease {ref} renewTime", verdict))
        stamp = epoch_text(lease.renewed_at + lease.duration_s)
        return NodeLiveness(STALE, f"Lease {ref} expired at {stamp}, grace {clock.grace_s:g}s")
    return FRESH_NODE

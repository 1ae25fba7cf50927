"""The staleness policy: what the filter does with a node whose GPU state is stale or unknown.

A node is ``stale`` when its telemetry is past the agent's own ``expires_at`` (``read_at`` +
``refresh_s``, published by the agent) plus the extender's ``grace_s``, or, from an agent that
publishes no ``expires_at``, when ``read_at`` is older than ``ttl_s + grace_s``. A node is
A node whose telemetry names a Lease (``"lease": "<namespace>/<name>"``: the agent's liveness is
there, and it rewrites the telemetry only when a label changes) is judged by that Lease instead,
when the extender watches Leases in its namespace (``OMATICAYA_EXTENDER_LEASE_NAMESPACE``) and
the watch has synced: fresh while the Lease has a holder and ``renewTime`` +
``leaseDurationSeconds`` + ``grace_s`` is ahead; stale otherwise, a missing Lease included
(``lease_stale``). Without a Lease watch, the rule above. A node is
``unknown`` when it has no Omaticaya labels, no usable telemetry, or is not in the cache yet.

Policies, one for each case (``OMATICAYA_EXTENDER_STALE_POLICY``,
``OMATICAYA_EXTENDER_UNKNOWN_POLICY``), overridable per Node by the annotation
``scheduler.<prefix>/stale-policy`` (both cases; outside the agent's ``<prefix>/``, whose keys
the agent owns and removes when it does not write them):

- ``reject`` (default): the node fails the filter, with the reason;
- ``allow``: fail open. A stale node is judged on its last reading as if it were fresh (health,
  room, in-flight pods) and scored; an unknown node has nothing to judge: it passes, scored 0;
- ``score-zero``: the node passes, and is ranked last (score 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any, Literal

from ..core.schema import NodeGpuState, json_mapping, rfc3339_s, state_from_object
from .signal import with_signal

Policy = Literal["reject", "allow", "score-zero"]
POLICIES: tuple[str, ...] = ("reject", "allow", "score-zero")

#: the Node annotation that overrides both policies for that node: ``scheduler.<prefix>/`` +
#: this (the agent owns ``<prefix>/`` and would remove it there)
POLICY_ANNOTATION = "stale-policy"


def policy_key(prefix: str) -> str:
    """``scheduler.omaticaya.io/stale-policy`` for the prefix ``omaticaya.io``."""
    return f"scheduler.{prefix}/{POLICY_ANNOTATION}"


@dataclass(frozen=True, slots=True)
class NodeView(NodeGpuState):
    """A node's GPU state plus its ``scheduler.<prefix>/stale-policy`` override (``None``: none, or a
    value that is not a policy: ignored)."""

    policy: str | None = None


def node_policy(annotations: Any, prefix: str) -> str | None:
    """The override from a Node's annotations, or ``None`` (absent or not a policy)."""
    value = json_mapping(annotations).get(policy_key(prefix))
    if isinstance(value, str) and value.strip().lower() in POLICIES:
        return value.strip().lower()
    return None


def with_policy(state: NodeGpuState, annotations: Any, prefix: str) -> NodeView:
    """``state`` as a ``NodeView`` carrying the Node's override."""
    values = {f.name: getattr(state, f.name) for f in fields(NodeGpuState)}
    return NodeView(**values, policy=node_policy(annotations, prefix))


def view_from_object(node: Mapping[str, Any], prefix: str, signal: str = "now") -> NodeView:
    """``state_from_object`` with the free-memory ``signal`` (``scheduler.signal``) and the
    override, for a whole v1.Node document."""
    meta = json_mapping(json_mapping(node).get("metadata"))
    state = with_signal(state_from_object(node, prefix), signal)
    return with_policy(state, meta.get("annotations"), prefix)


def effective(state: NodeGpuState | None, default: str) -> str:
    """The policy for ``state``'s node: its override, else ``default``."""
    override = getattr(state, "policy", None)
    return override if override in POLICIES else default


def legacy_default(policy: str | None, fail_open: bool) -> str:
    """The configured policy; ``fail_open`` (the older setting) means ``score-zero`` (what it
    always did: pass, score 0) when no policy is set."""
    if policy is not None:
        return policy
    return "score-zero" if fail_open else "reject"


# ----------------------------------------------------------------------------- leases ----


@dataclass(frozen=True, slots=True)
class LeaseState:
    """What the extender keeps of a ``coordination.k8s.io/v1`` Lease: ``holder``
    (``holderIdentity``, empty: released), ``renewed_at`` (``renewTime``, epoch seconds) and
    ``duration_s`` (``leaseDurationSeconds``)."""

    holder: str
    renewed_at: float
    duration_s: float


#: the longest ``leaseDurationSeconds`` trusted (as ``MAX_REFRESH_S`` for ``expires_at``)
MAX_LEASE_DURATION_S = 8 * 24 * 3600.0


def lease_from_object(lease: Any) -> LeaseState:
    """A Lease document as ``LeaseState``. Raises ``ValueError`` (naming the field) on a Lease
    the extender cannot judge by: no ``renewTime``, a ``leaseDurationSeconds`` that is not a
    whole number from 1 to ``MAX_LEASE_DURATION_S``, a ``holderIdentity`` that is not text."""
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
    return LeaseState(holder=holder, renewed_at=renewed_at, duration_s=float(duration))


def lease_stale(lease: LeaseState | None, ref: str, *, now: float, grace_s: float) -> str | None:
    """Why the node whose telemetry names Lease ``ref`` is stale, or ``None`` when it is fresh:
    fresh while ``lease`` is held (a non-empty holder) and ``renewed_at + duration_s +
    grace_s`` is still ahead; ``lease`` ``None``: no such Lease (the lease cache has synced)."""
    if lease is None:
        return f"Lease {ref} not found"
    if not lease.holder:
        return f"Lease {ref} released (no holder)"
    deadline = lease.renewed_at + lease.duration_s
    if now > deadline + grace_s:
        stamp = datetime.fromtimestamp(deadline, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"Lease {ref} expired at {stamp}, grace {grace_s:g}s"
    return None

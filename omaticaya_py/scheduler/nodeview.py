"""How the extender sees a Node: its GPU state with the free-memory signal, the staleness
policy override and when the watch saw it change (``NodeView``).

The staleness policy: what the filter does with a node whose GPU state is stale or unknown.

Whether a node is ``stale`` is the one liveness rule of ``core.rules.liveness`` (``node_liveness``),
which ``omaticaya top`` uses as well: the agent's published time (its telemetry's ``read_at``,
current until its ``expires_at``, or for ``ttl_s`` from an agent that publishes no
``expires_at``; or, for a node whose telemetry names a Lease, when the extender watches Leases
in its namespace (``OMATICAYA_EXTENDER_LEASE_NAMESPACE``) and the watch has synced, that Lease's
``renewTime``, current for ``leaseDurationSeconds``, a missing or released Lease being stale) is
judged by when the extender's watch saw it change, on the extender's monotonic clock, with the
publisher's times as a bound, plus ``grace_s``. A published time more than
``OMATICAYA_EXTENDER_MAX_CLOCK_SKEW_S`` ahead of the extender's clock makes the node's telemetry
unusable (the unknown policy). A node is ``unknown`` when it has no Omaticaya labels, no usable
telemetry, or is not in the cache yet.

Policies, one for each case (``OMATICAYA_EXTENDER_STALE_POLICY``,
``OMATICAYA_EXTENDER_UNKNOWN_POLICY``), overridable per Node by the annotation
``scheduler.<prefix>/stale-policy`` (both cases; outside the agent's ``<prefix>/``, whose keys
the agent owns and removes when it does not write them):

- ``reject`` (default): the node fails the filter, with the reason;
- ``allow``: fail open. A stale node is judged on its last reading as if it were fresh (health,
  room, in-flight pods) and scored; an unknown node has nothing to judge: it passes, scored 0;
- ``score-zero``: the node passes, and is ranked last (score 0).

The free-memory signal (``OMATICAYA_EXTENDER_SIGNAL``): ``now`` (the default) uses each GPU's free memory as last read. ``window-min`` uses
``min(now, the least free memory over the agent's peak window)``: a GPU whose free memory dips
every few minutes is judged by its dips (``core.model.window``; the agent publishes the minimum in the
telemetry as ``memory_free_min_mib``). A GPU without a published minimum (window off, not yet
half covered, an older agent) is judged by ``now``. Pure, applied once per Node change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, NamedTuple, TypeVar

from ..core.rules.liveness import MAX_LEASE_DURATION_S, LeaseState, Seen, lease_from_object
from ..core.schema import GpuInfo, NodeGpuState, json_mapping, state_from_object

__all__ = [
    "BAD_HEALTH",
    "MAX_LEASE_DURATION_S",
    "POLICIES",
    "SIGNALS",
    "LeaseState",
    "NodeView",
    "Facts",
    "Seen",
    "Signal",
    "effective",
    "facts_of",
    "lease_from_object",
    "legacy_default",
    "node_policy",
    "policy_key",
    "seen_of",
    "view_from_object",
    "with_policy",
    "with_signal",
]

POLICIES: tuple[str, ...] = ("reject", "allow", "score-zero")

#: the Node annotation that overrides both policies for that node: ``scheduler.<prefix>/`` +
#: this (the agent owns ``<prefix>/`` and would remove it there)
POLICY_ANNOTATION = "stale-policy"


def policy_key(prefix: str) -> str:
    """``scheduler.omaticaya.io/stale-policy`` for the prefix ``omaticaya.io``."""
    return f"scheduler.{prefix}/{POLICY_ANNOTATION}"


#: a node whose ``gpu.health`` is one of these is never judged by its room
BAD_HEALTH = frozenset({"Unhealthy", "Unknown"})
INF = float("inf")
#: ``Facts.free_desc`` has at least this many entries (a node of 8 GPUs: one each)
FREE_SLOTS = 8


class Facts(NamedTuple):
    """What the kept verdicts' bulk judging (``cache.Verdicts``) reads of a Node, made once when
    the Node cache stores it (``NodeView.facts``), from its parsed state alone (no setting):

    - ``name``: the state's node name;
    - ``published_s``: ``read_at`` (epoch s, the agent's clock); ``valid_s``: ``expires_at -
      read_at`` (how long the agent promised it current);
    - ``wall_base_s``, ``mono_base_s``: what the fresh window's ends are ``+ valid_s + grace_s``
      of (``records.window``): ``read_at`` and ``seen.at_s`` (monotonic), ``inf`` where that end
      is unbounded (``read_at`` once the watch saw it change; ``seen.at_s`` when not watched);
    - ``free_desc``: the free MiB of the healthy whole GPUs, most first, then ``-1`` up to
      ``FREE_SLOTS`` entries (the ``k``-th most free of any ``k <= FREE_SLOTS`` is entry
      ``k - 1``: ``-1`` when the node has fewer healthy GPUs); ``healthy``: how many;
      ``free_total_mib``: the state's; ``lease``: the Lease its telemetry names (or ``None``)."""

    name: str
    published_s: float
    valid_s: float
    wall_base_s: float
    mono_base_s: float
    free_desc: tuple[int, ...]
    healthy: int
    free_total_mib: int
    lease: str | None


def facts_of(state: NodeGpuState, seen: Seen | None) -> Facts | None:
    """``state``'s ``Facts`` with ``seen``; ``None`` when its telemetry cannot make it fresh
    (not known, no ``read_at``, a problem, bad or no health) or promises no ``expires_at`` (its
    window then depends on the extender's ``ttl_s``): such a node is judged one by one."""
    read_at, expires_at = state.read_at, state.expires_at
    if (not state.known or read_at is None or expires_at is None or state.problem
            or state.health is None or state.health in BAD_HEALTH):  # fmt: skip
        return None
    free = sorted((g.free_mib for g in state.gpus if g.healthy), reverse=True)
    healthy = len(free)
    free += [-1] * (FREE_SLOTS - healthy)
    return Facts(state.name, read_at, expires_at - read_at,
                 INF if seen is not None and seen.changed else read_at,
                 seen.at_s if seen is not None else INF, tuple(free), healthy,
                 state.free_total_mib, state.lease)  # fmt: skip


@dataclass(frozen=True, slots=True)
class NodeView(NodeGpuState):
    """A node's GPU state plus its ``scheduler.<prefix>/stale-policy`` override (``None``: none, or a
    value that is not a policy: ignored) and ``seen``: when the extender's watch saw ``read_at``
    take its value (``core.rules.liveness.Seen``, monotonic clock; ``None``: not watched).
    ``facts`` (``facts_of``) is made with the view, that is when the Node cache stores it: a
    request reads it instead of sorting GPUs (not compared, not a constructor argument)."""

    policy: str | None = None
    seen: Seen | None = None
    facts: Facts | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "facts", facts_of(self, self.seen))


def node_policy(annotations: Any, prefix: str) -> str | None:
    """The override from a Node's annotations, or ``None`` (absent or not a policy)."""
    value = json_mapping(annotations).get(policy_key(prefix))
    if isinstance(value, str) and value.strip().lower() in POLICIES:
        return value.strip().lower()
    return None


def with_policy(
    state: NodeGpuState, annotations: Any, prefix: str, seen: Seen | None = None
) -> NodeView:
    """``state`` as a ``NodeView`` carrying the Node's override and ``seen``."""
    values = {f.name: getattr(state, f.name) for f in fields(NodeGpuState)}
    return NodeView(**values, policy=node_policy(annotations, prefix), seen=seen)


def view_from_object(node: Mapping[str, Any], prefix: str, signal: str = "now") -> NodeView:
    """``state_from_object`` with the free-memory ``signal`` (``with_signal``) and the
    override, for a whole v1.Node document."""
    meta = json_mapping(json_mapping(node).get("metadata"))
    state = with_signal(state_from_object(node, prefix), signal)
    return with_policy(state, meta.get("annotations"), prefix)


def seen_of(state: NodeGpuState | None) -> Seen | None:
    """When the extender's watch saw ``state``'s ``read_at`` take its value (``None``: not a
    ``NodeView`` from the watch, or not seen)."""
    return state.seen if isinstance(state, NodeView) else None


def effective(state: NodeGpuState | None, default: str) -> str:
    """The policy for ``state``'s node: its override (a ``NodeView``'s), else ``default``."""
    override = state.policy if isinstance(state, NodeView) else None
    return override if override in POLICIES else default


def legacy_default(policy: str | None, fail_open: bool) -> str:
    """The configured policy; ``fail_open`` (the older setting) means ``score-zero`` (what it
    always did: pass, score 0) when no policy is set."""
    if policy is not None:
        return policy
    return "score-zero" if fail_open else "reject"


#: the free-memory signals (``OMATICAYA_EXTENDER_SIGNAL``)
Signal = Literal["now", "window-min"]
SIGNALS: tuple[str, ...] = ("now", "window-min")

State = TypeVar("State", bound=NodeGpuState)


def with_signal(state: State, signal: str) -> State:
    """``state`` with each GPU's ``free_mib``, whole and shared (and the node's
    ``free_total_mib``), taken from ``signal``; the same object when nothing changes."""
    if signal != "window-min" or not any(
        g.free_min_mib is not None for g in (*state.gpus, *state.shared)
    ):
        return state
    gpus, shared = _window_min(state.gpus), _window_min(state.shared)
    return replace(state, gpus=gpus, shared=shared,
                   free_total_mib=sum(g.free_mib for g in gpus if g.healthy))  # fmt: skip


def _window_min(gpus: tuple[GpuInfo, ...]) -> tuple[GpuInfo, ...]:
    return tuple(
        replace(g, free_mib=min(g.free_mib, g.free_min_mib)) if g.free_min_mib is not None else g
        for g in gpus
    )

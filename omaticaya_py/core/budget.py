"""The write budget: which label changes must reach the Node at once, and which may wait.

Every write to a Node goes to every client that watches Nodes (kube-scheduler, the controller
manager, a CNI agent per node), so the agent sends at most one Node patch per
``min_patch_interval_s``, except a change that makes the Node *less attractive* to a scheduler:
free memory (or the largest slice a shared GPU can take) down, utilisation up, fewer healthy or idle units, health worse, a GPU or a label
gone. Those go at once, so that a label is only ever stale on the safe side (it may undersell a
node, never oversell it); a change for the better goes once the reading has not got worse for
one interval. Pure functions, no I/O.

The telemetry annotation follows the same rule for what no label shows (``telemetry_change``):
a GPU's or MIG device's exact free memory down by more than ``OMATICAYA_TELEMETRY_FREE_DROP_MIB``
(labels move in 1,024 MiB steps, so a drop within a step changes none), or a pod that starts
holding it, is a change for the worse and rewrites the telemetry at once; the same rise, or a
holder leaving, waits like any change for the better.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .schema.names import Worse, by_worse

__all__ = [
    "BETTER",
    "HEALTH_RANK",
    "WORSE",
    "UnitMark",
    "hold_back",
    "name_of",
    "safe_part",
    "telemetry_change",
    "urgent",
    "worse",
]

#: node and per-GPU health, best first; a value not listed ranks as the worst
HEALTH_RANK = {"Healthy": 0, "Degraded": 1, "Unhealthy": 2, "Unknown": 3}

def _suffixes(worse: Worse) -> tuple[str, ...]:
    """``.<name>`` of the per-GPU and per-MIG-profile labels whose ``worse`` is ``worse``
    (``gpu-N.memory.free-mib`` and ``mig-<profile>.memory.free-mib`` end alike)."""
    names = by_worse(worse, "gpu") | by_worse(worse, "mig")
    return tuple(sorted("." + name for name in names))


# the direction tables, from the label table (``core.schema.names.LABELS``)
#: label names (or per-GPU / per-MIG-profile suffixes) where less is less attractive
_MORE_IS_BETTER_NODE = by_worse("less", "node")
_MORE_IS_BETTER_SUFFIX = _suffixes("less")
#: where more is less attractive
_LESS_IS_BETTER_NODE = by_worse("more", "node")
_LESS_IS_BETTER_SUFFIX = _suffixes("more")
#: not a scheduling input: never urgent (it changes with load; it waits for the next patch)
_NEUTRAL_NODE = by_worse("neutral", "node")
_NEUTRAL_SUFFIX = _suffixes("neutral")
#: ranked by ``HEALTH_RANK``
_HEALTH_NODE = by_worse("health", "node")
_HEALTH_SUFFIX = _suffixes("health")


def name_of(key: str) -> str:
    """The label name of a full key: ``omaticaya.io/gpu.health`` -> ``gpu.health`` (names hold
    no ``/``, so this works for any prefix)."""
    return key.rpartition("/")[2]


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    return int(text) if text.isdigit() else None


def worse(name: str, before: str | None, after: str | None) -> bool:
    """Whether ``name`` going from ``before`` to ``after`` (``None``: absent) makes the Node less
    attractive, or could (a value that cannot be ranked counts as worse)."""
    if before == after:
        return False
    if name in _NEUTRAL_NODE or name.endswith(_NEUTRAL_SUFFIX):
        return False
    if after is None:
        return True  # a key gone: `Gt`/`In` no longer match, a GPU may be gone
    if name in _HEALTH_NODE or name.endswith(_HEALTH_SUFFIX):
        if before is None:
            return HEALTH_RANK.get(after, 9) > 0  # a new GPU that is not healthy
        return HEALTH_RANK.get(after, 9) > HEALTH_RANK.get(before, 9)
    more_better = name in _MORE_IS_BETTER_NODE or name.endswith(_MORE_IS_BETTER_SUFFIX)
    less_better = name in _LESS_IS_BETTER_NODE or name.endswith(_LESS_IS_BETTER_SUFFIX)
    if more_better or less_better:
        if before is None:
            return False  # a number appears: more nodes match, never fewer
        b, a = _int(before), _int(after)
        if a is None or b is None:
            return True
        return a < b if more_better else a > b
    # anything else (product, family, driver, mig.strategy, gpu-N.mig.enabled): a key that
    # appears lets more selectors match (it may wait); one that changes is rare and a scheduler
    # may decide differently: never held back
    return before is not None


def urgent(before_labels: Mapping[str, str], after_labels: Mapping[str, str]) -> bool:
    """Whether the change from ``before_labels`` (on the Node) to ``after_labels`` (desired)
    must be sent now: any key that got worse (see ``worse``). Keys are full (``<prefix>/name``)
    or bare names; pass only the agent's own keys. No change is not urgent."""
    for key in before_labels.keys() | after_labels.keys():
        if worse(name_of(key), before_labels.get(key), after_labels.get(key)):
            return True
    return False


def hold_back(
    now_s: float,
    last_patch_s: float | None,
    interval_s: float,
    is_urgent: bool,
    calm_since_s: float | None = None,
) -> bool:
    """Whether a patch is held back: the budget is on (``interval_s`` > 0), the change is not
    urgent, and either the last Node patch was less than ``interval_s`` ago (``None``: never),
    or the reading got worse less than ``interval_s`` ago (``calm_since_s``: the last tick whose
    desired labels were worse than the tick's before; ``None``: never). So a rise is published
    only once it has held for an interval: free memory that dips and comes back every few
    seconds keeps its label at the dip (stale only on the safe side) and costs no write."""
    if interval_s <= 0 or is_urgent or last_patch_s is None:
        return False
    if calm_since_s is not None and now_s - calm_since_s < interval_s:
        return True
    return now_s - last_patch_s < interval_s


def safe_part(before_labels: Mapping[str, str], after_labels: Mapping[str, str]) -> dict[str, str]:
    """The labels to write while changes for the better are held: each key as in
    ``after_labels`` where it got worse (see ``worse``: free memory down, health worse, a key
    gone), as in ``before_labels`` (the Node's) where it got better or does not matter. A patch
    that must go at once thus carries only the safe-direction changes; the rest wait."""
    out: dict[str, str] = {}
    for key in before_labels.keys() | after_labels.keys():
        before, after = before_labels.get(key), after_labels.get(key)
        value = after if before == after or worse(name_of(key), before, after) else before
        if value is not None:
            out[key] = value
    return out


@dataclass(frozen=True, slots=True)
class UnitMark:
    """What the telemetry says of one GPU or MIG device that no label shows: its exact free
    memory (MiB; ``None``: not read), the containers holding it, as ``(namespace, pod,
    container)`` (the kubelet's PodResources; empty when nothing is attributed), and, on a
    shared GPU, those of them holding more than their slice (``over``) and its enforcement by
    CUDA MPS (``mps``: ``"up"`` or the reason it is not; ``None``: not shared, or enforcement
    off)."""

    free_mib: int | None
    holders: frozenset[tuple[str, str, str]] = frozenset()
    over: frozenset[tuple[str, str, str]] = frozenset()
    mps: str | None = None


#: ``telemetry_change`` answers: the telemetry must be rewritten at once / may wait
WORSE, BETTER = "worse", "better"


def telemetry_change(
    published: Mapping[Any, UnitMark], now: Mapping[Any, UnitMark], drop_mib: int  # any unit key
) -> str | None:
    """How the reading ``now`` differs from the telemetry ``published`` (both: unit key ->
    ``UnitMark``, the key naming a GPU or a MIG device the same way on both sides) in what no
    label shows.

    ``WORSE`` when any unit's free memory fell by more than ``drop_mib`` (or can no longer be
    read, or the unit is gone), or a container holds it that ``published`` does not name, or a
    container went over its slice of a shared GPU: the extender would decide on more room than
    there is, or preemption on the wrong pods; or a shared GPU's MPS enforcement is no longer
    said ``"up"`` (its daemon went down). ``BETTER`` when none did but a unit's free
    memory rose by more than ``drop_mib`` (or a new unit has some), or a holder left or is no
    longer over its slice, or its MPS enforcement changed otherwise (back up, another reason).
    ``None`` otherwise. ``drop_mib`` 0 turns the free-memory
    part off (holders still count)."""
    better = False
    for key in published.keys() | now.keys():
        before, after = published.get(key), now.get(key)
        b_free = before.free_mib if before is not None else None
        a_free = after.free_mib if after is not None else None
        b_holders = before.holders if before is not None else frozenset()
        a_holders = after.holders if after is not None else frozenset()
        b_over = before.over if before is not None else frozenset()
        a_over = after.over if after is not None else frozenset()
        b_mps = before.mps if before is not None else None
        a_mps = after.mps if after is not None else None
        if a_holders - b_holders or a_over - b_over or (b_mps == "up" and a_mps != "up"):
            return WORSE
        if drop_mib > 0 and b_free is not None and (a_free is None or b_free - a_free > drop_mib):
            return WORSE
        if b_holders - a_holders or b_over - a_over or b_mps != a_mps:
            better = True
        elif drop_mib > 0 and a_free is not None and (b_free is None or a_free - b_free > drop_mib):
            better = True
    return BETTER if better else None

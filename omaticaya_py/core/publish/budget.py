"""The write budget: which label changes must reach the Node at once, and which may wait.

Every write to a Node goes to every client that watches Nodes (kube-scheduler, the controller
manager, a CNI agent per node), so the agent sends at most one Node patch per
``min_patch_interval_s``, except a change that makes the Node *less attractive* to a scheduler:
free memory (or the largest slice a shared GPU can take) down, utilisation up, fewer healthy or idle units, health worse, a GPU or a label
gone. Those go at once, so that a label is only ever stale on the safe side (it may undersell a
node, never oversell it); a change for the better goes once the reading has not got worse for
one interval. Pure functions, no I/O.

The calm window is judged per key (issue 48): a label, a GPU's telemetry, each part (free
memory, taints) of a ResourceSlice device have their own calm clock (``Calm``, kept by
``note_changes``), so a neighbour GPU whose memory dips every few seconds holds back only its
own rises, never a recovered GPU's health or taint. A key that flaps (worse, better, worse again
within ``CALM_MAX_INTERVALS`` intervals) has its calm window doubled, up to that many intervals:
a key that keeps flapping more slowly than one interval still costs no writes once its window
has grown, as under the node-wide clock this replaced. A
change for the better of a calm key goes with the next write that goes anyway (a change for the
worse, the telemetry), or on its own once the last write is an interval old (``held_keys``). So
a recovered GPU's change for the better waits at most two intervals (plus a tick) after its own
last change for the worse, ``CALM_MAX_INTERVALS`` + 1 if it flapped; its neighbours' churn
never counts.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..schema.names import Worse, by_worse

__all__ = [
    "BETTER",
    "Calm",
    "HEALTH_RANK",
    "CALM_MAX_INTERVALS",
    "WORSE",
    "UnitMark",
    "held_keys",
    "hold_back",
    "label_changes",
    "name_of",
    "note_changes",
    "safe_part",
    "telemetry_change",
    "unit_changes",
    "urgent",
    "worse",
]

K = TypeVar("K", bound=Hashable)

#: the longest calm window of a key that keeps flapping, in write budget intervals: its change
#: for the better then waits at most this many intervals plus one (the last write's), plus a tick
CALM_MAX_INTERVALS = 8

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
    seconds keeps its label at the dip (stale only on the safe side) and costs no write.

    One clock for the whole Node: the rule of 7078aa3, which let a neighbour's churn hold a
    recovered GPU's labels and taint for good. The agent now judges each key on its own clock
    (``note_changes``, ``held_keys``); this stays for the benches' before columns."""
    if interval_s <= 0 or is_urgent or last_patch_s is None:
        return False
    if calm_since_s is not None and now_s - calm_since_s < interval_s:
        return True
    return now_s - last_patch_s < interval_s


def label_changes(
    before_labels: Mapping[str, str], after_labels: Mapping[str, str]
) -> tuple[set[str], set[str]]:
    """``(worse, better)`` for the calm clocks (``note_changes``): the keys (full or bare, as
    given) whose change from ``before_labels`` to ``after_labels`` makes the Node less
    attractive (``worse``; a key gone counts), and those whose change makes it more attractive.
    A key with no direction (temperature, ``neutral`` in the label table) that moved is in
    both: each move is a flap, so a label that keeps moving is held until it settles, as the
    node-wide clock held it. Both empty when nothing changed."""
    worse_set: set[str] = set()
    better: set[str] = set()
    for key in before_labels.keys() | after_labels.keys():
        before, after = before_labels.get(key), after_labels.get(key)
        if before == after:
            continue
        name = name_of(key)
        if name in _NEUTRAL_NODE or name.endswith(_NEUTRAL_SUFFIX):
            worse_set.add(key)
            better.add(key)
        else:
            (worse_set if worse(name, before, after) else better).add(key)
    return worse_set, better


@dataclass(frozen=True, slots=True)
class Calm:
    """One key's calm clock: the tick it last got worse (``worse_at_s``, the agent's monotonic
    seconds), how long it must then stay calm before a change for the better goes (``hold_s``:
    one write budget interval, doubled at each flap up to ``CALM_MAX_INTERVALS``), and whether
    it got better since (``rose``: the next change for the worse is a flap)."""

    worse_at_s: float
    hold_s: float
    rose: bool = False


def note_changes(
    clocks: Mapping[K, Calm],
    worse: Iterable[K],
    better: Iterable[K],
    now_s: float,
    interval_s: float,
) -> dict[K, Calm]:
    """The calm clocks after a tick in which the keys ``worse`` got worse and the keys
    ``better`` got better (than the tick before; label keys, device names, telemetry units).

    A key that got worse again after it rose (a flap) doubles its window, up to
    ``CALM_MAX_INTERVALS`` intervals; one that keeps falling (memory allocated over a few ticks)
    keeps it; one that did not get worse for ``CALM_MAX_INTERVALS`` intervals is forgotten (its
    next change for the worse starts again at one interval). So a key that flaps more often
    than that is held at its worse side and costs no writes (as the node-wide clock held every
    key of a churning node); the map holds only the keys that got worse lately."""
    forget_s = CALM_MAX_INTERVALS * interval_s
    out = {k: c for k, c in clocks.items() if now_s - c.worse_at_s < forget_s}
    for k in better:
        if k in out:
            out[k] = Calm(out[k].worse_at_s, out[k].hold_s, rose=True)
    for k in worse:
        c = out.get(k)
        if c is None:
            hold_s = interval_s
        elif c.rose:
            hold_s = min(2 * c.hold_s, CALM_MAX_INTERVALS * interval_s)
        else:
            hold_s = c.hold_s
        out[k] = Calm(now_s, hold_s)
    return out


def held_keys(
    pending: Iterable[K],
    now_s: float,
    last_write_s: float | None,
    interval_s: float,
    clocks: Mapping[K, Calm],
    going: bool,
) -> set[K]:
    """Which of the ``pending`` changes for the better (label keys, device names, telemetry
    units) the write budget holds back this tick; the one rule of the Node's labels, its
    telemetry and the ResourceSlice.

    None with the budget off (``interval_s`` <= 0) or before the first write
    (``last_write_s`` ``None``). Else a key is held while it got worse itself less than its
    calm window ago (``clocks``, from ``note_changes``; a neighbour's churn does not count),
    and every pending key is held while nothing else is written this tick (``going`` false:
    no change for the worse, no telemetry rewrite) and the last write is less than
    ``interval_s`` old. So a calm key rides on the next write that goes anyway, or goes alone
    an interval after the last write."""
    if interval_s <= 0 or last_write_s is None:
        return set()
    keys = set(pending)
    if not going and now_s - last_write_s < interval_s:
        return keys
    return {k for k in keys if k in clocks and now_s - clocks[k].worse_at_s < clocks[k].hold_s}


def safe_part(
    before_labels: Mapping[str, str],
    after_labels: Mapping[str, str],
    ready: Iterable[str] = (),
) -> dict[str, str]:
    """The labels to write while changes for the better are held: each key as in
    ``after_labels`` where it got worse (see ``worse``: free memory down, health worse, a key
    gone) or is ``ready`` (a change for the better the budget lets go, ``held_keys``), as in
    ``before_labels`` (the Node's) where it got better or does not matter. A patch that must go
    at once thus carries only the safe-direction changes and the ready ones; the rest wait."""
    ready = set(ready)
    out: dict[str, str] = {}
    for key in before_labels.keys() | after_labels.keys():
        before, after = before_labels.get(key), after_labels.get(key)
        go = before == after or key in ready or worse(name_of(key), before, after)
        value = after if go else before
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


def unit_changes(
    published: Mapping[K, UnitMark], now: Mapping[K, UnitMark], drop_mib: int
) -> tuple[set[K], set[K]]:
    """``(worse, better)``: the units (GPUs, MIG devices: the keys of both maps) whose
    telemetry alone changed for the worse from ``published`` to ``now`` (``telemetry_change``
    of that unit is ``WORSE``: free memory down by more than ``drop_mib``, a new holder, MPS
    down, the unit gone), and those whose changed only for the better (``BETTER``: what a
    rewrite for the better would publish, each waiting for its own calm, ``held_keys``)."""
    worse_set: set[K] = set()
    better: set[K] = set()
    for key in published.keys() | now.keys():
        before = {key: published[key]} if key in published else {}
        after = {key: now[key]} if key in now else {}
        change = telemetry_change(before, after, drop_mib)
        if change == WORSE:
            worse_set.add(key)
        elif change == BETTER:
            better.add(key)
    return worse_set, better

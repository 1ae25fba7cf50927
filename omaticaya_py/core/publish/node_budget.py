"""The Node's side of the write budget: its labels and its telemetry annotation, as the keys of
one ``core.publish.publisher.Publisher`` (label keys, and telemetry units: a GPU or a MIG
device, ``core.publish.render_telemetry.UnitKey``), one calm clock each and one last patch.

Labels change for the worse or the better by the label table (``core.publish.budget.worse``);
the telemetry by what no label shows (``core.publish.budget.unit_changes``: a unit's exact free
memory, its holders, its MPS enforcement). What goes, what waits: ``Publisher.plan``.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

from .budget import UnitMark, label_changes, name_of, safe_part, unit_changes, worse
from .publisher import Changes, Publisher
from .render_telemetry import UnitKey

__all__ = ["NodeKey", "calm_changes", "labels_within_budget", "pending_labels", "telemetry_behind"]

#: a key of the Node's publisher: a label key (``<prefix>/<name>``) or a telemetry unit
NodeKey = str | UnitKey


def calm_changes(
    last_labels: Mapping[str, str] | None,
    labels: Mapping[str, str],
    last_marks: Mapping[UnitKey, UnitMark] | None,
    marks: Mapping[UnitKey, UnitMark],
    drop_mib: int,
) -> Changes[NodeKey]:
    """What moves the Node's calm clocks at one tick: the label keys whose desired value got
    worse or better than the last tick's (``core.publish.budget.label_changes``; a label with no
    direction in both), and the telemetry units whose marks did (``unit_changes``, free memory
    by more than ``drop_mib``). ``None`` last: the first tick, nothing moved."""
    worse_keys: set[NodeKey] = set()
    better: set[NodeKey] = set()
    if last_labels is not None:
        w, b = label_changes(last_labels, labels)
        worse_keys |= w
        better |= b
    if last_marks is not None:
        w2, b2 = unit_changes(last_marks, marks, drop_mib)
        worse_keys |= w2
        better |= b2
    return Changes.of(worse_keys, better)


def pending_labels(on_node: Mapping[str, str], desired: Mapping[str, str]) -> Changes[NodeKey]:
    """The label keys that differ between the Node (``on_node``: only our keys) and
    ``desired``: those that got worse (``core.publish.budget.worse``: go at once) and the
    others (may wait)."""
    worse_keys: set[NodeKey] = set()
    better: set[NodeKey] = set()
    for key in on_node.keys() | desired.keys():
        old, new = on_node.get(key), desired.get(key)
        if old == new:
            continue
        (worse_keys if worse(name_of(key), old, new) else better).add(key)
    return Changes.of(worse_keys, better)


def labels_within_budget(
    on_node: Mapping[str, str],
    desired: Mapping[str, str],
    publisher: Publisher[NodeKey],
    now_s: float,
    *,
    going: bool = False,
    hold: bool = True,
) -> dict[str, str] | None:
    """The labels to write at ``now_s``: ``desired`` with the changes for the better that
    ``publisher`` holds kept as on the Node (``on_node``: our keys only;
    ``core.publish.budget.safe_part``), or ``None`` when nothing is held (write ``desired``).
    ``going``: something goes this tick anyway (the telemetry is rewritten); ``hold`` false (an
    annotation heartbeat: the whole state goes) holds nothing."""
    if not hold:
        return None
    plan = publisher.plan(pending_labels(on_node, desired), now_s, going=going)
    if not plan.held:
        return None
    return safe_part(on_node, desired, ready={k for k in plan.ready if isinstance(k, str)})


def telemetry_behind(
    published: Mapping[UnitKey, UnitMark],
    marks: Mapping[UnitKey, UnitMark],
    publisher: Publisher[NodeKey],
    now_s: float,
    drop_mib: int,
) -> bool:
    """Whether the telemetry on the Node (its marks, ``published``) must be rewritten though
    no label changed: at once for a change for the worse of any unit (free memory down by more
    than ``drop_mib``, a new holder, MPS down, a unit gone); for the better (the same rise, a
    holder gone) once ``publisher`` lets every unit that rose go."""
    worse_units, rose = unit_changes(published, marks, drop_mib)
    pending: Changes[NodeKey] = Changes.of(worse_units, rose)
    if pending.worse:
        return True
    return bool(pending.better) and not publisher.plan(pending, now_s).held

"""The ResourceSlice's side of the write budget: which changes of its devices must go at once,
and what is published while the others wait (``core.publish.publisher.Publisher`` decides
which wait).

Each device is judged in two parts, each on its own calm clock (issue 48): ``FREE`` (its free
memory, and everything else about it but its taints) and ``TAINTS``, so a GPU's memory churn
never holds back its taint's removal. A part changes for the worse (the Node less attractive to
a scheduler: it goes at once) when the device is gone, its free memory fell or can no longer be
read, a taint was added (or its value or effect changed), or anything else about it changed
(its UUID, its capacity: a scheduler may decide otherwise); for the better when its free memory
rose, a taint went, or the device is new.

Pure: no I/O; over typed devices (``SliceDevice``), never their JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .budget import BETTER, WORSE
from .publisher import Changes, Publisher
from .slice_device import DeviceTaint, SliceDevice

__all__ = [
    "FREE",
    "TAINTS",
    "Part",
    "device_changes",
    "held_devices",
    "within_budget",
    "worse_devices",
]

#: the parts of a device the budget judges on their own calm clocks
FREE, TAINTS = "free", "taints"
#: a key of the ResourceSlice's publisher: ``(device name, FREE or TAINTS)``
Part = tuple[str, str]


def _static(d: SliceDevice) -> SliceDevice:
    """``d`` without its free memory and taints: what a change of is worse whichever way."""
    return replace(d, free_memory_mib=None, taints=())


def _free_worse(before: int | None, after: int | None) -> bool:
    """Free memory fell, or can no longer be read."""
    return after is not None and (before is None or after < before) or (
        after is None and before is not None
    )


def _added(before: SliceDevice, after: SliceDevice) -> bool:
    """A taint of ``after`` that ``before`` does not have (by key, value and effect)."""
    return bool({t.what for t in after.taints} - {t.what for t in before.taints})


def _part_change(part: str, before: SliceDevice | None, after: SliceDevice | None) -> str | None:
    """``WORSE``, ``BETTER`` (``core.publish.budget``'s answers) or ``None`` (no change) for one
    ``part`` of one device (``None``: absent on that side)."""
    if before is None or after is None:
        if before is after:
            return None
        return WORSE if after is None else BETTER  # gone; new
    if part == FREE:
        if _static(before) == _static(after) and before.free_memory_mib == after.free_memory_mib:
            return None
        if _static(before) != _static(after):
            return WORSE
        return WORSE if _free_worse(before.free_memory_mib, after.free_memory_mib) else BETTER
    capacity_b = (before.memory_mib, before.unit_mib, before.shared)
    capacity_a = (after.memory_mib, after.unit_mib, after.shared)
    if capacity_b == capacity_a and before.taints == after.taints:
        return None
    return WORSE if capacity_b != capacity_a or _added(before, after) else BETTER


def device_changes(
    before: Sequence[SliceDevice] | None, after: Sequence[SliceDevice]
) -> Changes[Part]:
    """The parts ``(device name, FREE or TAINTS)`` that changed from ``before`` to ``after``,
    sorted into worse and better (see the module)."""
    old = {d.name: d for d in before or ()}
    new = {d.name: d for d in after}
    worse: set[Part] = set()
    better: set[Part] = set()
    for name in old.keys() | new.keys():
        for part in (FREE, TAINTS):
            change = _part_change(part, old.get(name), new.get(name))
            if change is not None:
                (worse if change == WORSE else better).add((name, part))
    return Changes.of(worse, better)


def worse_devices(before: Sequence[SliceDevice], after: Sequence[SliceDevice]) -> bool:
    """Whether going from the published ``before`` to ``after`` makes the Node less attractive
    and must go at once: a device gone, a device's free memory down, a taint added or changed,
    anything else about a device changed. More free memory, a taint removed or a new device
    may wait (``held_devices``)."""
    return bool(device_changes(before, after).worse)


def _hold(before: SliceDevice, after: SliceDevice, free: bool, taints: bool) -> SliceDevice:
    """``after`` with its changes for the better of the parts held kept as ``before``: free
    memory at the published value when it rose (``free``), the taints that went still there
    (``taints``)."""
    kept = after
    fb, fa = before.free_memory_mib, after.free_memory_mib
    if free and fb is not None and fa is not None and fa > fb:
        kept = replace(kept, free_memory_mib=fb)
    if taints:
        now = {t.what for t in after.taints}
        gone: tuple[DeviceTaint, ...] = tuple(t for t in before.taints if t.what not in now)
        if gone:
            kept = replace(kept, taints=(*after.taints, *gone))
    return kept


def held_devices(before: Sequence[SliceDevice], after: Sequence[SliceDevice]) -> list[SliceDevice]:
    """``after`` with every change for the better held back: a device's free memory stays at
    the published value when it rose, a taint that went stays, a new device waits. Changes for
    the worse are kept."""
    old = {d.name: d for d in before}
    return [_hold(old[d.name], d, True, True) for d in after if d.name in old]


def within_budget(
    before: Sequence[SliceDevice], desired: Sequence[SliceDevice], publisher: Publisher[Part],
    now_s: float,
) -> list[SliceDevice]:  # fmt: skip
    """The devices to publish at ``now_s``: ``desired`` with each change for the better (more
    free memory, a taint gone, a new device) held at ``before`` (the published devices) while
    ``publisher`` holds that part of that device (``Publisher.plan``: it got worse itself
    within its calm window, or nothing goes this time and the last write is under an interval
    old). Changes for the worse always go, and carry the calm parts' changes with them."""
    held = publisher.plan(device_changes(before, desired), now_s).held
    if not held:
        return list(desired)
    old = {d.name: d for d in before}
    out: list[SliceDevice] = []
    for d in desired:
        hold_free, hold_taints = (d.name, FREE) in held, (d.name, TAINTS) in held
        b = old.get(d.name)
        if b is None:
            if not (hold_free or hold_taints):
                out.append(d)  # a new device, let go
            continue
        out.append(_hold(b, d, hold_free, hold_taints))
    return out

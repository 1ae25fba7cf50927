"""Memory slices of shared GPUs (pure): where a pod's slices fit on one node.

A pod that asks for the shared resource (``need.parse_slices``: units per container) is given,
for each container, that many units of one shared GPU (the device plugin allocates per
container, every unit of one slice from one GPU). The extender passes a node only if each
slice fits on one healthy shared GPU by the live reading: the GPU's free memory (the least of
the telemetry's exact value and its labels, ``parse_node``) less what is reserved on it in the
ledger (``inflight.adjust``) and less the pod's own larger slices placed there first, at least
``units x share_unit_mib`` (the node's unit).

``place_slices`` puts the slices largest first, each on the GPU with the least room that takes
it (best fit: ``binpack``, as the device plugin's default preferred allocation) or the most
(``spread``). A node's *room* is the free memory of the GPU its largest slice goes to under
best fit: what prioritize ranks by, binpack-consistent (``binpack`` prefers the node whose GPU
is filled tightest; ``spread`` the node whose tightest fitting GPU has the most room).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.schema import GpuInfo, NodeGpuState
from .need import Need

__all__ = ["Placed", "place_slices", "slice_reasons", "slice_room", "slices_text"]

#: (GPU index per slice, largest slice first; the room of the GPU the largest went to, MiB)
Placed = tuple[tuple[int, ...], int]


def place_slices(gpus: Sequence[GpuInfo], mibs: Sequence[int], strategy: str = "binpack"
                 ) -> Placed | None:  # fmt: skip
    """Each slice of ``mibs`` (MiB, largest first) on one healthy GPU of ``gpus`` with that much
    free after the earlier ones: ``binpack`` the least room that fits, ``spread`` the most
    (ties: the lower index). ``None`` when a slice fits on none."""
    free = {g.index: g.free_mib for g in gpus if g.healthy}
    chosen: list[int] = []
    room = 0
    for i, mib in enumerate(mibs):
        fit = [(f, index) for index, f in free.items() if f >= mib]
        if not fit:
            return None
        f, index = min(fit) if strategy == "binpack" else min(fit, key=lambda t: (-t[0], t[1]))
        if i == 0:
            room = f
        free[index] = f - mib
        chosen.append(index)
    return tuple(chosen), room


def slice_room(state: NodeGpuState, need: Need) -> int | None:
    """The node's room for ``need``'s slices on ``state.shared`` (free after the reservations
    when ``state`` is a record's ``left``): the free MiB of the GPU the largest slice goes to
    under best fit; ``None`` when they do not all fit (or the node shares no GPU)."""
    if not state.shared or not state.share_unit_mib:
        return None
    placed = place_slices(state.shared, need.slice_mibs(state.share_unit_mib))
    return None if placed is None else placed[1]


def slices_text(need: Need) -> str:
    """How a reason names the slices: ``20 units of omaticaya.io/gpu-memory on one shared GPU``,
    or for several containers ``slices of 20 + 10 units of ... (each on one shared GPU)``."""
    units, resource = sorted(need.slices, reverse=True), need.resource
    if len(units) == 1:
        return f"{units[0]} units of {resource} on one shared GPU"
    return (f"slices of {' + '.join(str(u) for u in units)} units of {resource} (each on one "
            "shared GPU)")  # fmt: skip


def slice_reasons(need: Need, prefix: str) -> tuple[str, str]:
    """(no room, room taken by in-flight pods): the filter's reasons for ``need``'s slices, as
    the whole-GPU ones read (``decisions.reason_kind`` tells them by the same words)."""
    wanted = f"pod needs {slices_text(need)} with the slice free"
    return (f"node(s) had no room: {wanted} ({prefix})",
            f"node(s) had room taken by in-flight pods: {wanted}, and pods placed there are "
            f"not in its telemetry yet ({prefix})")  # fmt: skip

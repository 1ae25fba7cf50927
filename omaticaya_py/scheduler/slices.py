"""Memory slices of shared GPUs (pure): where a pod's slices fit on one node.

A pod that asks for the shared resource (``need.parse_slices``: units per container) is given,
for each container, that many units of one shared GPU (the device plugin allocates per
container, every unit of one slice from one GPU). The extender passes a node only if each
slice fits on one healthy shared GPU by both of its books, as the device plugin judges it
(``core.sharing.gpu_room_mib``): its live free memory (the least of the telemetry's exact value
and its labels, ``parse_node``) and its units no container holds (the telemetry's holders),
each less what is reserved on it in the ledger and not yet in that book (``inflight.adjust``)
and less the pod's own larger slices placed there first, at least ``units x share_unit_mib``
(the node's unit).

``place_slices`` puts the slices in container order (the order the kubelet asks the device plugin
for them), each on the GPU with the least room that takes it (best fit: ``binpack``, as the
device plugin's default preferred allocation) or the most (``spread``), so that the GPUs it
reserves are the ones the plugin will hand out. A node's *room* is the room of the GPU its
largest slice goes to under
best fit: what prioritize ranks by, binpack-consistent (``binpack`` prefers the node whose GPU
is filled tightest; ``spread`` the node whose tightest fitting GPU has the most room).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..core.schema import GpuInfo, NodeGpuState
from .need import Need

__all__ = ["Placed", "place_slices", "slice_reasons", "slice_room", "slices_text"]

#: (GPU index per slice, in the slices' order; the room of the GPU the largest went to, MiB)
Placed = tuple[tuple[int, ...], int]


def place_slices(gpus: Sequence[GpuInfo], mibs: Sequence[int], strategy: str = "binpack",
                 unit_mib: int = 1) -> Placed | None:  # fmt: skip
    """Each slice of ``mibs`` (MiB, whole units of ``unit_mib``, in container order) on one healthy
    GPU of ``gpus`` whose room (``GpuInfo.room_mib``: the least of its live free memory and its
    units left) takes it after the earlier ones: ``binpack`` the least room that fits,
    ``spread`` the most (ties: the lower index), as the device plugin's ``choose``. ``None``
    when a slice fits on none."""
    books = {g.index: g for g in gpus if g.healthy}
    chosen: list[int] = []
    room = 0
    largest = max(range(len(mibs)), key=lambda k: (mibs[k], -k), default=0)
    for i, mib in enumerate(mibs):
        fit = [(r, index) for index, g in books.items() if (r := g.room_mib(unit_mib)) >= mib]
        if not fit:
            return None
        f, index = min(fit) if strategy == "binpack" else min(fit, key=lambda t: (-t[0], t[1]))
        if i == largest:
            room = f
        g = books[index]
        left = None if g.units_left is None else g.units_left - mib // max(unit_mib, 1)
        books[index] = replace(g, free_mib=g.free_mib - mib, units_left=left)
        chosen.append(index)
    return tuple(chosen), room


def slice_room(state: NodeGpuState, need: Need) -> int | None:
    """The node's room for ``need``'s slices on ``state.shared`` (free after the reservations
    when ``state`` is a record's ``left``): the free MiB of the GPU the largest slice goes to
    under best fit; ``None`` when they do not all fit (or the node shares no GPU)."""
    if not state.shared or not state.share_unit_mib:
        return None
    placed = place_slices(state.shared, need.slice_mibs(state.share_unit_mib),
                          unit_mib=state.share_unit_mib)
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

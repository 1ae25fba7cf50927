"""A Node's GPU state as the extender and ``omaticaya top`` see it, once parsed.

``GpuInfo`` (one whole GPU, shared GPU or MIG device) and ``NodeGpuState`` (one node) are
what ``core.schema.nodestate.parse_node`` makes of a Node's labels and telemetry (untrusted
input, parsed there); the placement model, the fit rule and the views read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model.sharing import gpu_room_mib
from ..model.topology import NodeTopology

__all__ = ["GpuInfo", "NodeGpuState"]


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One whole GPU as the extender sees it: ``free_mib`` now, ``healthy``, and
    ``free_min_mib``, the least free memory over the agent's peak window (``None``: not
    published: window off, not yet half covered, or an older agent); ``total_mib``, its
    memory (the telemetry's ``memory_total_mib``; ``None``: not published), which tells a
    GPU too small for a pod whatever is evicted from it (``scheduler.victims``).

    ``assigned``: the kubelet has handed this whole GPU to a container (the telemetry's
    ``pods``, from PodResources): it has no room for another pod whatever NVML shows, and its
    ``free_mib`` is 0. A shared GPU is never ``assigned``: it has two books, its live
    ``free_mib`` and ``units_left``, the units no container holds (``None``: not published),
    and a slice's room is the least of them (``room_mib``, ``core.model.sharing.gpu_room_mib``)."""

    index: int
    free_mib: int
    healthy: bool
    free_min_mib: int | None = None
    total_mib: int | None = None
    assigned: bool = False
    #: an assigned GPU's free MiB by the live reading (capped as ``free_mib`` is); ``None``
    #: when not assigned: what evicting its holders would start from (``scheduler.preempt``)
    assigned_free_mib: int | None = None
    units_left: int | None = None
    #: a MIG device (``NodeGpuState.mig``): its profile (``1g.10gb``) and its index under its
    #: GPU (``index`` is the GPU's); ``None`` for a whole GPU
    profile: str | None = None
    mig_index: int | None = None
    #: the most units a slice here can take by the node's labels (``gpu.shared.memory.free-mib``
    #: over the unit): a bound on the room, kept apart from ``units_left`` (the kubelet's
    #: books) so that what is taken off the books is never taken off the bound as well
    units_cap: int | None = None

    def room_mib(self, unit_mib: int) -> int:
        """The largest slice this (shared) GPU can take at ``unit_mib`` MiB per unit: the least
        of its two books (``core.model.sharing.gpu_room_mib``), its units bounded by ``units_cap``;
        its ``free_mib`` when no unit count is known."""
        if self.units_left is None:
            return max(self.free_mib, 0)
        units = self.units_left if self.units_cap is None else min(self.units_left, self.units_cap)
        return gpu_room_mib(self.free_mib, units, unit_mib)


@dataclass(frozen=True, slots=True)
class NodeGpuState:
    """What the extender knows about one node's GPUs, parsed once per Node change.

    ``known`` is False when the node carries no Omaticaya data at all; ``health`` is the
    ``gpu.health`` label (or the telemetry's); ``read_at`` is epoch seconds (``None``: no
    telemetry annotation); ``expires_at`` is epoch seconds, the agent's own promise of its next
    rewrite (``None``: an agent that does not publish it, or a value not to be trusted);
    ``lease`` is the ``"<namespace>/<name>"`` of the Lease that holds the agent's liveness
    (``None``: none named, or not of that form): its renewals, not ``read_at``, say whether
    the telemetry is current; ``gpus`` per GPU; ``free_total_mib`` over healthy GPUs (an
    assigned one counts 0);
    ``holders``: the pods the kubelet has handed a GPU, MIG device or slice of this node
    (``"<namespace>/<name>"``, from the telemetry's ``pods``; empty when the agent attributes
    nothing): a pod there is in the reading (``scheduler.inflight.pending``)."""

    name: str
    known: bool = False
    health: str | None = None
    read_at: float | None = None
    expires_at: float | None = None
    gpus: tuple[GpuInfo, ...] = ()
    free_total_mib: int = 0
    problem: str | None = None
    lease: str | None = None
    shared: tuple[GpuInfo, ...] = ()
    share_unit_mib: int | None = None
    holders: frozenset[str] = frozenset()
    #: each slice a holder has on a shared GPU: ``("<namespace>/<name>", GPU index, units)``,
    #: in the telemetry's order (where the device plugin put it)
    slices_held: tuple[tuple[str, int, int], ...] = ()
    #: the telemetry publishes the holders of its shared GPUs (the agent's PodResources
    #: attribution is on): their units left are the kubelet's books
    units_attributed: bool = False
    #: free MiB over healthy whole GPUs by the live reading, assigned ones included (``None``:
    #: not parsed from a Node, then ``free_total_mib``): what the in-flight rule's memory drops
    #: are measured on (``live_free_total_mib``), since an assignment frees no memory
    free_live_total_mib: int | None = None
    #: the MIG devices of the GPUs with MIG on (the telemetry's ``mig_devices`` with a profile):
    #: ``index`` the GPU's, ``mig_index`` and ``profile`` set, ``assigned`` when the kubelet
    #: has handed it to a container (its ``pods``), then ``free_mib`` 0
    mig: tuple[GpuInfo, ...] = ()
    #: how the whole GPUs are wired (the telemetry's ``links`` and per-GPU topology): the
    #: placement model's choice of several GPUs follows it; ``None``: not published
    topology: NodeTopology | None = None

    @property
    def live_free_total_mib(self) -> int:
        """Free MiB over the healthy whole GPUs by the live reading, assigned GPUs included."""
        live = self.free_live_total_mib
        return self.free_total_mib if live is None else live

    @property
    def shared_free_total_mib(self) -> int:
        """Free MiB summed over the healthy shared GPUs."""
        return sum(g.free_mib for g in self.shared if g.healthy)

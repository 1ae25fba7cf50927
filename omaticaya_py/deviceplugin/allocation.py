"""Pure device-plugin rules: advertised device state, resource and socket names, the options
served, the preferred allocation of whole devices (``core.allocation.placement``'s order), the devices that
left the reading, and the devices a trace describes."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.allocation.placement import first_whole
from ..core.model.sharing import SharedGpus, unit_count, unit_ids
from ..core.model.snapshot import NodeSnapshot
from ..core.model.topology import NodeTopology
from ..core.schema import GpuInfo
from .v1beta1 import api_pb2

API_VERSION = "v1beta1"
#: The kubelet (v1.20) always serves its registration socket here, whatever ``--root-dir``.
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
#: the reason every device gets while the agent's reading is older than the stale bound
STALE_READING = "stale-reading"


@dataclass(frozen=True, slots=True)
class DeviceState:
    """One advertised device: ``id`` is the GPU UUID (``MIG-...`` for a MIG device, whose
    parent GPU is ``index``); ``reasons`` why it is unhealthy; ``free_mib`` the live free memory
    (``nvmlDeviceGetMemoryInfo`` on its handle)."""

    id: str
    index: int
    healthy: bool
    reasons: tuple[str, ...] = ()
    free_mib: int | None = None
    mig_index: int | None = None

    @property
    def health(self) -> str:
        """``Healthy`` or ``Unhealthy``, as the device plugin API spells it."""
        return HEALTHY if self.healthy else UNHEALTHY

    def info(self, units_left: int | None = None) -> GpuInfo:
        """This device as the placement model sees it (``core.schema.GpuInfo``): its index,
        live free MiB (-1 when unknown: it then fits nothing), health, MIG index, and
        ``units_left`` (a shared GPU's units in the kubelet's available list)."""
        free = self.free_mib if self.free_mib is not None else -1
        return GpuInfo(self.index, free, self.healthy, units_left=units_left,
                       mig_index=self.mig_index)  # fmt: skip


def plugin_options() -> Any:
    """The ``DevicePluginOptions`` this plugin serves and registers: PreStartContainer and
    GetPreferredAllocation both wanted."""
    return api_pb2.DevicePluginOptions(
        pre_start_required=True, get_preferred_allocation_available=True
    )


def mig_resource_name(gpu_resource: str, profile: str) -> str:
    """The resource of a MIG profile beside the whole-GPU resource, NVIDIA's ``mixed``
    naming: (``nvidia.com/gpu``, ``1g.10gb``) -> ``nvidia.com/mig-1g.10gb``."""
    domain, slash, _ = gpu_resource.rpartition("/")
    return f"{domain}{slash}mig-{profile}"


def socket_name_for(resource_name: str) -> str:
    """The plugin's socket file name for a resource: ``omaticaya-nvidia.com-gpu.sock``."""
    return "omaticaya-" + re.sub(r"[^A-Za-z0-9_.-]", "-", resource_name) + ".sock"


def preferred(
    states: dict[str, DeviceState],
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    topology: NodeTopology | None = None,
) -> list[str]:
    """The preferred ``size`` devices (IDs) out of ``available`` (the kubelet's list), given
    ``states`` (device ID -> ``DeviceState``): every must-include device first, then the
    placement model's rule of which whole devices a container gets
    (``core.allocation.placement.first_whole``, the rule the extender predicts by): healthy
    first, most free memory by the live reading first, and, for whole GPUs on a node whose
    wiring is known (``topology``: the agent's reading's, NVML's), the best connected set among
    the equally roomy; then the lowest index, then the ID. MIG devices are not placed by
    topology. Devices the plugin does not know come last, by ID."""
    chosen = list(dict.fromkeys(must_include))
    rest = sorted(d for d in dict.fromkeys(available) if d not in chosen)
    known = [d for d in rest if d in states]
    infos = {d: states[d].info() for d in [*known, *chosen] if d in states}
    links = None
    if topology is not None and topology.pairs and all(
        states[d].mig_index is None for d in infos
    ):
        def links(a: str, b: str) -> int:
            return topology.pair_score(states[a].index, states[b].index)
    picked = first_whole(known, size - len(chosen), infos.__getitem__,
                         chosen=[d for d in chosen if d in states], links=links)  # fmt: skip
    chosen += picked
    chosen += [d for d in rest if d not in states][: max(0, size - len(chosen))]
    return chosen


def departed(
    known: Mapping[str, int],
    parents: Mapping[str, str],
    present: Collection[str],
    snapshot: NodeSnapshot,
    mig: bool,
) -> set[str]:
    """The devices that left the reading: out of ``known`` (device UUID -> GPU index), those not
    ``present`` among this resource's units whose GPU was read and says they are gone.

    - A whole GPU (``mig`` False) leaves when its UUID is read without error with MIG on (it
      is served as MIG devices now); a GPU missing from the reading (lost, off the bus) stays,
      Unhealthy.
    - A MIG device (``mig`` True) leaves when its parent GPU (``parents[uuid]``, else the GPU
      at its index) is read without error and every one of its MIG devices was read with a
      UUID: the layout was re-created (MIG UUIDs change then) or MIG turned off. While the
      parent is missing or unreadable, or one of its MIG devices cannot be read, it stays.
    - Nothing leaves while the library itself cannot be read (``snapshot.error``).
    """
    if snapshot.error is not None:
        return set()
    by_uuid = {g.uuid: g for g in snapshot.gpus if g.uuid}
    by_index = {g.index: g for g in snapshot.gpus}
    gone: set[str] = set()
    for device, index in known.items():
        if device in present:
            continue
        if not mig:
            g = by_uuid.get(device)
            if g is not None and g.error is None and g.mig_enabled:
                gone.add(device)
            continue
        parent = parents.get(device)
        g = by_uuid.get(parent) if parent else by_index.get(index)
        if g is None or g.error is not None:
            continue
        if all(m.error is None and m.uuid for m in g.mig_devices):
            gone.add(device)
    return gone


def trace_units(path: Path | str) -> dict[str | None, list[tuple[int, str]]]:
    """The devices a trace describes, by resource: ``None`` -> whole GPUs, a MIG profile ->
    its MIG devices; each a sorted list of ``(GPU index, UUID)``."""
    from ..sources.replay import TraceReader

    reader = TraceReader(path)
    found: dict[str | None, dict[str, int]] = {}
    for frame in reader.frames:
        for gpu in frame.gpus:
            if gpu.mig_enabled:
                for mig in gpu.mig_devices:
                    if mig.uuid and mig.profile:
                        found.setdefault(mig.profile, {}).setdefault(mig.uuid, gpu.index)
            elif gpu.uuid:
                found.setdefault(None, {}).setdefault(gpu.uuid, gpu.index)
    return {
        profile: sorted(((i, u) for u, i in devices.items()), key=lambda t: t[0])
        for profile, devices in found.items()
    }


def trace_slices(path: Path | str, shared: SharedGpus, unit_mib: int) -> list[tuple[int, str]]:
    """``(GPU index, unit ID)`` of every unit of the shared GPUs a trace describes (MIG off in
    a frame that reads it, its index or UUID in ``shared``), ``unit_count(total, unit_mib)`` per GPU
    (``core.model.sharing``), in GPU index order, then unit order."""
    from ..sources.replay import TraceReader

    found: dict[str, tuple[int, int]] = {}
    for frame in TraceReader(path).frames:
        for gpu in frame.gpus:
            if gpu.uuid and gpu.memory_total_mib and gpu.uuid not in found:
                n = unit_count(gpu.memory_total_mib, unit_mib)
                if shared.shares(gpu.index, gpu.uuid) and not gpu.mig_enabled and n:
                    found[gpu.uuid] = (gpu.index, n)
    ordered = sorted(found.items(), key=lambda kv: (kv[1][0], kv[0]))
    return [(index, d) for uuid, (index, n) in ordered for d in unit_ids(uuid, n)]


def trace_devices(path: Path | str) -> list[tuple[int, str]]:
    """``(index, uuid)`` of the whole GPUs (MIG off) a trace describes."""
    return trace_units(path).get(None, [])

"""The devices of the Node's ResourceSlice, typed: each ``SliceDevice`` renders its own
attributes (``core.schema.attributes.ATTRIBUTES``, in the table's order), capacity and taints
as a ``resource.k8s.io/v1`` ``Device``; ``slice_devices`` builds them from the inventory
(``core.publish.dra.inventory``) and the reading. The write budget compares these, never the
JSON they render to (``core.publish.slice_budget``).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..model.labelvalues import sanitise_value
from ..model.snapshot import GpuReading, NodeSnapshot
from ..model.topology import GpuTopology
from ..schema.attributes import ATTRIBUTES
from .dra import TAINT_MPS, TAINT_UNHEALTHY, DraDevice

__all__ = ["DeviceTaint", "SliceDevice", "TaintRule", "render_devices", "slice_devices"]


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """One taint of a device: ``key`` (``TAINT_UNHEALTHY``, ``TAINT_MPS``), ``value`` (a label
    value: the reason), ``effect`` (``NoSchedule`` or ``NoExecute``), ``time_added`` (RFC 3339,
    when it was first published; ``None``: left to the API server)."""

    key: str
    value: str
    effect: str
    time_added: str | None = None

    @property
    def what(self) -> tuple[str, str, str]:
        """``(key, value, effect)``: the taint without its time (what a toleration matches)."""
        return self.key, self.value, self.effect

    def render(self) -> dict[str, str]:
        """The ``DeviceTaint`` as JSON."""
        out = {"key": self.key, "value": self.value, "effect": self.effect}
        if self.time_added:
            out["timeAdded"] = self.time_added
        return out


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of the Node's ResourceSlice, as published.

    The attribute fields (``core.schema.attributes.ATTRIBUTES``; ``None``: the attribute is left
    out): ``device_type`` (``gpu``/``mig``), ``shared``, ``gpu_index``, ``uuid``, ``product``,
    ``architecture`` (each at most 64 characters), ``compute_capability``, ``driver_version``,
    ``cuda_driver_version`` (``major.minor.patch``), ``free_memory_mib`` (the damped free
    memory, MiB), and for a MIG device ``mig_index``, ``profile``, ``parent_uuid``; the
    GPU's topology (``core.model.topology.GpuTopology``): ``pci_bus_id`` (whole GPUs),
    ``pcie_root``, ``numa_node`` (Kubernetes' standard attributes) and ``nvlink_island``.

    Capacity: ``memory_mib`` (``None``: no capacity), with a request policy of whole
    ``unit_mib`` when above 0 (a shared GPU; ``shared`` also gives
    ``allowMultipleAllocations``). ``taints``: in the order published.
    """

    name: str
    device_type: str
    shared: bool
    gpu_index: int
    uuid: str | None = None
    product: str | None = None
    architecture: str | None = None
    compute_capability: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    free_memory_mib: int | None = None
    mig_index: int | None = None
    profile: str | None = None
    parent_uuid: str | None = None
    pci_bus_id: str | None = None
    pcie_root: str | None = None
    numa_node: int | None = None
    nvlink_island: str | None = None
    memory_mib: int | None = None
    unit_mib: int = 0
    taints: tuple[DeviceTaint, ...] = field(default=())

    def render(self) -> dict[str, Any]:
        """The ``Device`` as JSON: ``name``, ``attributes`` (each ``{type: value}``),
        ``capacity`` (``memory``: ``<MiB>Mi``, its request policy), ``allowMultipleAllocations``,
        ``taints``; empty parts left out."""
        attrs: dict[str, dict[str, Any]] = {}
        for a in ATTRIBUTES:
            value = getattr(self, a.field)
            mig = self.mig_index is not None
            if value is not None and (mig or not a.mig_only) and not (mig and a.whole_only):
                attrs[a.name] = {a.type: value}
        device: dict[str, Any] = {"name": self.name, "attributes": attrs}
        if self.memory_mib is not None:
            memory: dict[str, Any] = {"value": f"{self.memory_mib}Mi"}
            if self.unit_mib > 0:
                unit = f"{self.unit_mib}Mi"
                memory["requestPolicy"] = {"default": unit, "validRange": {"min": unit, "step": unit}}
            device["capacity"] = {"memory": memory}
        if self.shared:
            device["allowMultipleAllocations"] = True
        if self.taints:
            device["taints"] = [t.render() for t in self.taints]
        return device


@dataclass(frozen=True, slots=True)
class TaintRule:
    """How devices are tainted: ``effect`` of ``TAINT_UNHEALTHY`` (``NoSchedule`` or
    ``NoExecute``, ``OMATICAYA_DRA_TAINT_EFFECT``), ``mps_down`` (shared GPU UUID -> why its MPS
    daemon is not up: ``TAINT_MPS``, always ``NoSchedule``), ``times`` (``(device name, taint
    key)`` -> the RFC 3339 time the taint was first published), ``now`` (RFC 3339: a new
    taint's ``timeAdded``; ``None``: none)."""

    effect: str = "NoSchedule"
    mps_down: Mapping[str, str] = field(default_factory=dict)
    times: Mapping[tuple[str, str], str] = field(default_factory=dict)
    now: str | None = None

    def taints(self, d: DraDevice) -> tuple[DeviceTaint, ...]:
        """The taints of ``d``: ``TAINT_UNHEALTHY`` with its first health reason when
        unhealthy, else ``TAINT_MPS`` when it is a shared GPU whose MPS daemon is down."""
        out: list[tuple[str, str, str]] = []
        if d.reasons:
            out.append((TAINT_UNHEALTHY, _taint_value(d.reasons[0]), self.effect))
        why = self.mps_down.get(d.gpu_uuid) if d.shared and d.gpu_uuid else None
        if why is not None and not d.reasons:
            out.append((TAINT_MPS, _taint_value(why), "NoSchedule"))
        return tuple(
            DeviceTaint(key, value, effect, self.times.get((d.name, key)) or self.now)
            for key, value, effect in out
        )


def _version(parts: Sequence[int | str]) -> str | None:
    """A semantic version (``major.minor.patch``) from 1 to 3 numeric parts, else ``None``."""
    nums = [str(int(p)) for p in parts if str(p).isdigit()]
    if not nums or len(nums) != len(parts) or len(nums) > 3:
        return None
    return ".".join((nums + ["0", "0"])[:3])


def _taint_value(reason: str) -> str:
    """A taint value (a label value: at most 63 characters of ``[A-Za-z0-9_.-]``)."""
    return sanitise_value(reason) or "unknown"


def _cut(text: str | None) -> str | None:
    return text[:64] if text else None


def _device(d: DraDevice, g: GpuReading | None, versions: tuple[str | None, str | None],
            rule: TaintRule, place: tuple[GpuTopology | None, str | None] = (None, None),
            ) -> SliceDevice:  # fmt: skip
    """One ``SliceDevice`` of inventory device ``d`` on GPU reading ``g`` (``None``: not in
    the reading), ``versions``: the driver's and CUDA's, ``place``: its GPU's topology and
    NVLink island (``None``: unknown)."""
    t, island = place
    cc = None
    if g is not None and g.compute_major is not None and g.compute_minor is not None:
        cc = _version((g.compute_major, g.compute_minor))
    mig = d.mig_index is not None
    return SliceDevice(
        name=d.name, device_type="mig" if mig else "gpu", shared=d.shared,
        gpu_index=d.gpu_index, uuid=d.uuid or None,
        product=_cut(g.product) if g is not None else None,
        architecture=_cut(g.architecture) if g is not None else None,
        compute_capability=cc, driver_version=versions[0], cuda_driver_version=versions[1],
        free_memory_mib=d.free_memory_mib, mig_index=d.mig_index,
        profile=_cut(d.profile) if mig else None,
        parent_uuid=(d.gpu_uuid or None) if mig else None,
        pci_bus_id=t.pci_bus_id if t else None, pcie_root=t.pcie_root if t else None,
        numa_node=t.numa_node if t and t.numa_node is not None and t.numa_node >= 0 else None,
        nvlink_island=island, memory_mib=d.memory_total_mib, unit_mib=d.unit_mib if d.shared else 0,
        taints=rule.taints(d),
    )  # fmt: skip


def slice_devices(
    devices: Sequence[DraDevice], snapshot: NodeSnapshot, rule: TaintRule | None = None
) -> list[SliceDevice]:
    """The devices of the Node's ResourceSlice, one per ``devices`` entry
    (``core.publish.dra.inventory``), in its order: the attributes of
    ``core.schema.attributes.ATTRIBUTES`` (an attribute NVML could not give is left out, so a
    selector on it does not match), capacity ``memory`` (a shared GPU's in whole sharing units,
    ``allowMultipleAllocations``), and the taints of ``rule`` (default: ``NoSchedule``, no MPS
    down, no times)."""
    rule = rule or TaintRule()
    by_index = {g.index: g for g in snapshot.gpus}
    driver = _version(snapshot.driver_version.split(".")) if snapshot.driver_version else None
    cuda = _version(snapshot.cuda_driver_version) if snapshot.cuda_driver_version else None
    topology = snapshot.topology
    islands = topology.islands() if topology is not None else {}

    def place(index: int) -> tuple[GpuTopology | None, str | None]:
        return (topology.gpu(index) if topology else None), islands.get(index)

    return [_device(d, by_index.get(d.gpu_index), (driver, cuda), rule, place(d.gpu_index))
            for d in devices]  # fmt: skip


def render_devices(
    devices: Sequence[DraDevice],
    snapshot: NodeSnapshot,
    *,
    taint_effect: str = "NoSchedule",
    mps_down: Mapping[str, str] | None = None,
    taint_times: Mapping[tuple[str, str], str] | None = None,
) -> list[dict[str, Any]]:
    """The ``spec.devices`` of the Node's ResourceSlice as JSON: ``slice_devices`` rendered
    (``SliceDevice.render``), tainted by ``TaintRule(taint_effect, mps_down, taint_times)``."""
    rule = TaintRule(taint_effect, mps_down or {}, taint_times or {})
    return [d.render() for d in slice_devices(devices, snapshot, rule)]

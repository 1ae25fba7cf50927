"""The DRA driver ``gpu.omaticaya.io``: which devices a Node has, as one rule for the
ResourceSlice the agent publishes and the claims the kubelet plugin prepares.

Dynamic Resource Allocation (``resource.k8s.io/v1``, Kubernetes 1.34+) lets kube-scheduler
pick a named device from the ResourceSlices a driver publishes and write its choice into the
ResourceClaim; the driver's kubelet plugin then prepares exactly that device. Both halves of our
driver work from ``inventory``: the publisher (``render_slice``) and the plugin
(``omaticaya_py.dra``), so the device a claim names is the device the plugin prepares.

One device per whole GPU (``gpu-<index>``) and, on a GPU with MIG on, one per MIG device
(``gpu-<index>-mig-<MIG index>``) instead of the GPU. A shared GPU (``OMATICAYA_SHARED_GPUS``)
is published with ``allowMultipleAllocations`` and a ``memory`` capacity whose request policy
is the sharing unit: claims take slices of it by amount (consumable capacity, KEP-5075).

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .health import NodeHealth
from .labelvalues import stable_down
from .sharing import Sharing, is_shared, unit_count
from .snapshot import NodeSnapshot

__all__ = [
    "DRIVER",
    "DraDevice",
    "device_name",
    "inventory",
    "parse_device_name",
]

#: the driver's name: the ResourceSlices' ``spec.driver``, the DeviceClass's, the attributes'
#: domain and the kubelet plugin's registered name
DRIVER = "gpu.omaticaya.io"

_NAME = re.compile(r"gpu-(0|[1-9][0-9]{0,3})(?:-mig-(0|[1-9][0-9]{0,3}))?")


def device_name(gpu_index: int, mig_index: int | None = None) -> str:
    """The device's name in the ResourceSlice (a DNS label): ``gpu-<index>`` for a whole GPU,
    ``gpu-<index>-mig-<MIG index>`` for a MIG device (NVML indices)."""
    if mig_index is None:
        return f"gpu-{gpu_index}"
    return f"gpu-{gpu_index}-mig-{mig_index}"


def parse_device_name(name: object) -> tuple[int, int | None] | None:
    """``(GPU index, MIG index or None)`` from a device name ``device_name`` made; ``None`` for
    anything else (the name comes from a ResourceClaim: untrusted)."""
    if not isinstance(name, str):
        return None
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    return int(m.group(1)), (int(m.group(2)) if m.group(2) is not None else None)


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device of the Node's ResourceSlice, from one reading.

    - ``name``: ``device_name``; ``gpu_index`` (``nvmlDeviceGetIndex``), ``mig_index`` (the
      MIG device's index on its GPU, ``None`` for a whole GPU).
    - ``uuid``: the device's own UUID (``GPU-...`` or ``MIG-...``, ``nvmlDeviceGetUUID``);
      ``gpu_uuid``: its GPU's (the same for a whole GPU). ``None`` when NVML could not say
      (a lost GPU).
    - ``profile``: the MIG profile (``1g.10gb``), ``None`` for a whole GPU.
    - ``shared``: a whole GPU shared by memory (consumable capacity, enforced by MPS).
    - ``memory_total_mib``: what the device has (``nvmlDeviceGetMemoryInfo``); for a shared GPU
      its units times ``unit_mib`` (the capacity claims take slices of); ``None`` unknown.
    - ``free_memory_mib``: the live free memory, rounded down to the memory step with the
      labels' hysteresis (``labelvalues.stable_down``: it falls at once, rises only past the
      next step by the margin); ``None`` while it cannot be read.
    - ``reasons``: empty when healthy, else the health rules' tokens (``xid-79``,
      ``ecc-uncorrected``, ``gpu-lost``; ``core.health``), the GPU's first.
    - ``unit_mib``: the sharing unit for a shared GPU (the capacity's request policy), else 0.
    """

    name: str
    gpu_index: int
    mig_index: int | None
    uuid: str | None
    gpu_uuid: str | None
    profile: str | None
    shared: bool
    memory_total_mib: int | None
    free_memory_mib: int | None
    reasons: tuple[str, ...] = ()
    unit_mib: int = 0

    @property
    def healthy(self) -> bool:
        return not self.reasons


def inventory(
    snapshot: NodeSnapshot,
    health: NodeHealth,
    sharing: Sharing,
    memory_step_mib: int,
    hysteresis_pct: float,
    previous_free_mib: Mapping[str, int] | None = None,
) -> list[DraDevice]:
    """The Node's devices in one reading, in name order of GPU then MIG index.

    ``health``: the health rules' verdict on ``snapshot`` (``core.health.assess``);
    ``sharing``: which GPUs are shared and the unit (``Sharing.of(settings)``);
    ``memory_step_mib`` and ``hysteresis_pct``: the labels' (``OMATICAYA_MEMORY_STEP_MIB``,
    ``OMATICAYA_HYSTERESIS_PCT``); ``previous_free_mib``: device name -> the free memory last
    published, for the hysteresis. A whole-snapshot NVML error gives no device (the caller
    keeps what it published). Never raises."""
    if snapshot.error is not None:
        return []
    previous = previous_free_mib or {}
    margin = hysteresis_pct / 100 * memory_step_mib

    def free(name: str, raw: int | None) -> int | None:
        if raw is None:
            return None
        return stable_down(max(raw, 0), memory_step_mib, previous.get(name), margin)

    mig_units = {(u.gpu_index, u.mig_index): u for u in health.units if u.is_mig}
    out: list[DraDevice] = []
    for g in sorted(snapshot.gpus, key=lambda g: g.index):
        gpu_reasons = health.gpus[g.index].reasons if g.index in health.gpus else ("unknown",)
        if g.error is None and g.mig_enabled:
            for mig in sorted(g.mig_devices, key=lambda m: m.index):
                name = device_name(g.index, mig.index)
                unit = mig_units.get((g.index, mig.index))
                reasons = unit.reasons if unit is not None else (*gpu_reasons, "mig-unread")
                if mig.error is not None and not reasons:
                    reasons = ("mig-error",)
                out.append(DraDevice(
                    name=name, gpu_index=g.index, mig_index=mig.index, uuid=mig.uuid,
                    gpu_uuid=g.uuid, profile=mig.profile, shared=False,
                    memory_total_mib=mig.memory_total_mib,
                    free_memory_mib=free(name, mig.memory_free_mib), reasons=tuple(reasons),
                ))
            continue
        name = device_name(g.index)
        shared = g.error is None and is_shared(g, sharing)
        total = g.memory_total_mib
        if shared and total is not None:
            total = unit_count(total, sharing.unit_mib) * sharing.unit_mib
        out.append(DraDevice(
            name=name, gpu_index=g.index, mig_index=None, uuid=g.uuid, gpu_uuid=g.uuid,
            profile=None, shared=shared, memory_total_mib=total,
            free_memory_mib=free(name, g.memory_free_mib if g.error is None else None),
            reasons=tuple(gpu_reasons), unit_mib=sharing.unit_mib if shared else 0,
        ))
    return out


def by_name(devices: Sequence[DraDevice]) -> dict[str, DraDevice]:
    """``{device.name: device}``."""
    return {d.name: d for d in devices}

"""The DRA driver ``gpu.omaticaya.io``: which devices a Node has, as one rule for the
ResourceSlice the agent publishes and the claims the kubelet plugin prepares.

Dynamic Resource Allocation (``resource.k8s.io/v1``, Kubernetes 1.34+) lets kube-scheduler
pick a named device from the ResourceSlices a driver publishes and write its choice into the
ResourceClaim; the driver's kubelet plugin then prepares exactly that device. Both halves of our
driver work from ``inventory``: the publisher (``core.publish.slice_device.slice_devices``, the
typed devices of the ResourceSlice) and the plugin (``omaticaya_py.dra``), so the device a claim
names is the device the plugin prepares.

One device per whole GPU, named by its UUID (``gpu-<uuid>``: ``GPU-4a1b...`` lower-cased) and,
on a GPU with MIG on, one per MIG device (``gpu-<uuid>-mig-<MIG index>``) instead of the GPU.
Names never come from the NVML index: a node that boots with a GPU missing renumbers the
others' indices (PCI order), and a claim allocated or checkpointed by name would then name
another physical GPU (``device_name``). A shared GPU (``OMATICAYA_SHARED_GPUS``)
is published with ``allowMultipleAllocations`` and a ``memory`` capacity whose request policy
is the sharing unit: claims take slices of it by amount (consumable capacity, KEP-5075).

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..model.labelvalues import stable_down
from ..model.sharing import Sharing, is_shared, unit_count
from ..model.snapshot import NodeSnapshot
from ..rules.attribution import ContainerDevices
from ..rules.health import NodeHealth

__all__ = [
    "API_VERSION",
    "DRIVER",
    "TAINT_MPS",
    "TAINT_UNHEALTHY",
    "DraDevice",
    "by_name",
    "claim_holders",
    "device_name",
    "gpu_part",
    "inventory",
    "parse_device_name",
    "slice_body",
    "slice_name",
    "strip_server_fields",
]

#: the driver's name: the ResourceSlices' ``spec.driver``, the DeviceClass's, the attributes'
#: domain and the kubelet plugin's registered name
DRIVER = "gpu.omaticaya.io"
#: the API group version of ResourceSlices, ResourceClaims and DeviceClasses we speak
API_VERSION = "resource.k8s.io/v1"
#: the taint on the device of a GPU the health rules call unhealthy (value: the first reason)
TAINT_UNHEALTHY = f"{DRIVER}/unhealthy"
#: the taint on a shared GPU whose CUDA MPS daemon is not up (value: why): nothing would
#: enforce a new claim's slice, so no new claim gets it (fail closed, as the device plugin)
TAINT_MPS = f"{DRIVER}/mps-not-enforced"

#: a GPU's part of a device name: ``gpu-`` then letters, digits and ``-`` (a DNS label's
#: characters), at most 54 characters so that a MIG suffix (``-mig-NNNN``) still fits 63
_GPU_PART = re.compile(r"gpu-[a-z0-9]([a-z0-9-]{0,48}[a-z0-9])?")
_MIG_SUFFIX = re.compile(r"-mig-(0|[1-9][0-9]{0,3})$")
_NOT_DNS = re.compile(r"[^a-z0-9-]+")
#: the most characters of a GPU's part of a name
_GPU_PART_MAX = 54


def gpu_part(gpu_uuid: str | None, gpu_index: int) -> str:
    """A GPU's part of its devices' names: its UUID (``nvmlDeviceGetUUID``) lower-cased, any
    character a DNS label cannot hold made ``-``, ``gpu-`` put first when it is not there,
    cut at 54 characters (a real UUID, ``GPU-`` and 36, is 40). A GPU whose UUID NVML could not
    give (lost before it was ever read) is ``gpu-index-<index>``: such a device is tainted and
    never prepared (``prepare.decide`` needs its UUID)."""
    if not gpu_uuid:
        return f"gpu-index-{gpu_index}"
    text = _NOT_DNS.sub("-", gpu_uuid.lower()).strip("-")
    if not text.startswith("gpu-"):
        text = f"gpu-{text}"
    return text[:_GPU_PART_MAX].rstrip("-") or f"gpu-index-{gpu_index}"


def device_name(gpu_uuid: str | None, mig_index: int | None = None, *, gpu_index: int = 0) -> str:
    """The device's name in the ResourceSlice (a DNS label, at most 63 characters):
    ``gpu_part(gpu_uuid, gpu_index)`` for a whole GPU (``gpu-4a1b2c3d-...``), then
    ``-mig-<MIG index>`` for a MIG device (its index on that GPU). Keyed by the GPU's UUID, not
    its NVML index: a reboot that loses a GPU renumbers indices, never UUIDs, so a claim
    allocated (or checkpointed) by name keeps naming the same physical GPU."""
    base = gpu_part(gpu_uuid, gpu_index)
    return base if mig_index is None else f"{base}-mig-{mig_index}"


def parse_device_name(name: object) -> tuple[str, int | None] | None:
    """``(the GPU's part, MIG index or None)`` of a device name ``device_name`` made; ``None``
    for anything else (the name comes from a ResourceClaim or the kubelet: untrusted)."""
    if not isinstance(name, str) or len(name) > 63:
        return None
    mig = _MIG_SUFFIX.search(name)
    base = name[: mig.start()] if mig else name
    if _GPU_PART.fullmatch(base) is None or "-mig-" in base:
        return None  # a UUID has no "-mig-": a MIG suffix of another form is not ours
    return base, (int(mig.group(1)) if mig else None)


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device of the Node's ResourceSlice, from one reading.

    - ``name``: ``device_name`` (from the GPU's UUID); ``gpu_index`` (``nvmlDeviceGetIndex``:
      published as the ``index`` attribute, renumbered when a GPU is lost at boot),
      ``mig_index`` (the MIG device's index on its GPU, ``None`` for a whole GPU).
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
      ``ecc-uncorrected``, ``gpu-lost``; ``core.rules.health``), the GPU's first.
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

    ``health``: the health rules' verdict on ``snapshot`` (``core.rules.health.assess``);
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
                name = device_name(g.uuid, mig.index, gpu_index=g.index)
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
        name = device_name(g.uuid, gpu_index=g.index)
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


def slice_name(node_name: str) -> str:
    """The name of the Node's one ResourceSlice: ``<node>-gpu.omaticaya.io`` (a DNS
    subdomain; a Node name is one, and at most 253 characters in all)."""
    return f"{node_name[: 253 - len(DRIVER) - 1]}-{DRIVER}"


def slice_body(node_name: str, node_uid: str | None, devices: Sequence[Mapping[str, Any]],
               generation: int = 1) -> dict[str, Any]:  # fmt: skip
    """The Node's ResourceSlice as the API takes it (for a server-side apply): driver
    ``DRIVER``, pool ``node_name`` (one slice in it, ``generation``), ``nodeName``, the
    rendered ``devices``; owned by the Node (``node_uid``) so that deleting the Node deletes
    it (no owner without the uid)."""
    meta: dict[str, Any] = {"name": slice_name(node_name)}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name,
                                    "uid": node_uid, "controller": True}]  # fmt: skip
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": [dict(d) for d in devices],
        },
    }


def strip_server_fields(devices: Any) -> list[dict[str, Any]]:
    """``spec.devices`` as read from the API server, compared as we render them: anything that
    is not a list of objects gives ``[]``."""
    if not isinstance(devices, list):
        return []
    return [d for d in devices if isinstance(d, dict)]


def claim_holders(
    listed: Sequence[ContainerDevices], node_name: str, snapshot: NodeSnapshot, sharing: Sharing,
) -> tuple[list[ContainerDevices], int]:
    """The containers holding our DRA devices, as the attribution takes holders: each
    PodResources entry of the driver (``resource_name`` ``DRIVER``, device IDs
    ``<pool>/<device name>``) with its devices turned into UUIDs (a whole GPU's ``GPU-...``, a
    MIG device's ``MIG-...``) from ``snapshot``, and the count of device IDs skipped: another
    pool (node), a name that is not ours, a device not in the reading (untrusted input: the
    kubelet's checkpoint can name anything). A slice of a shared GPU is left out (not counted
    as skipped): its size is the claim's, which PodResources does not carry, and the
    attribution would take its holder for the whole GPU's. Entries of other resources are
    not returned."""
    names: dict[str, str | None] = {}  # device name -> its UUID; None: a slice, left out
    for g in snapshot.gpus:
        if g.error is not None or not g.uuid:
            continue
        names[device_name(g.uuid, gpu_index=g.index)] = None if is_shared(g, sharing) else g.uuid
        for m in g.mig_devices:
            if m.uuid:
                names[device_name(g.uuid, m.index, gpu_index=g.index)] = m.uuid
    out: list[ContainerDevices] = []
    skipped = 0
    for a in listed:
        if a.resource_name != DRIVER:
            continue
        uuids: list[str] = []
        for device_id in a.device_ids:
            pool, _, name = device_id.partition("/")
            if pool != node_name or name not in names:
                skipped += 1
                continue
            uuid = names[name]
            if uuid is not None:
                uuids.append(uuid)
        if uuids:
            out.append(ContainerDevices(a.namespace, a.pod, a.container, DRIVER, tuple(uuids)))
    return out, skipped

"""The DRA driver ``gpu.omaticaya.io``: which devices a Node has, as one rule for the
ResourceSlice the agent publishes and the claims the kubelet plugin prepares.

Dynamic Resource Allocation (``resource.k8s.io/v1``, Kubernetes 1.34+) lets kube-scheduler
pick a named device from the ResourceSlices a driver publishes and write its choice into the
ResourceClaim; the driver's kubelet plugin then prepares exactly that device. Both halves of our
driver work from ``inventory``: the publisher (``render_slice``) and the plugin
(``omaticaya_py.dra``), so the device a claim names is the device the plugin prepares.

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

from ..model.labelvalues import sanitise_value, stable_down
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
    "held_devices",
    "inventory",
    "parse_device_name",
    "render_devices",
    "slice_body",
    "slice_name",
    "strip_server_fields",
    "worse_devices",
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


def _version(parts: Sequence[int | str]) -> str | None:
    """A semantic version (``major.minor.patch``) from 1 to 3 numeric parts, else ``None``."""
    nums = [str(int(p)) for p in parts if str(p).isdigit()]
    if not nums or len(nums) != len(parts) or len(nums) > 3:
        return None
    return ".".join((nums + ["0", "0"])[:3])


def _taint_value(reason: str) -> str:
    """A taint value (a label value: at most 63 characters of ``[A-Za-z0-9_.-]``)."""
    return sanitise_value(reason) or "unknown"


def render_devices(
    devices: Sequence[DraDevice],
    snapshot: NodeSnapshot,
    *,
    taint_effect: str = "NoSchedule",
    mps_down: Mapping[str, str] | None = None,
    taint_times: Mapping[tuple[str, str], str] | None = None,
) -> list[dict[str, Any]]:
    """The ``spec.devices`` of the Node's ResourceSlice (``resource.k8s.io/v1`` ``Device``
    objects as JSON), one per ``devices`` entry, in its order.

    Attributes (under our domain, so a selector reads
    ``device.attributes["gpu.omaticaya.io"].freeMemoryMiB``): ``type`` (``gpu``/``mig``),
    ``shared``, ``uuid``, ``index`` (the GPU's NVML index), ``productName``, ``architecture``
    (``nvmlDeviceGetArchitecture``), ``cudaComputeCapability`` (version, from
    ``nvmlDeviceGetCudaComputeCapability``), ``driverVersion`` (version,
    ``nvmlSystemGetDriverVersion``), ``cudaDriverVersion`` (version,
    ``nvmlSystemGetCudaDriverVersion_v2``), ``freeMemoryMiB`` (int, ``DraDevice``'s damped
    value), and for a MIG device ``profile``, ``parentUUID`` and ``migIndex``. An attribute
    NVML could not give is left out (a selector on it then does not match). Capacity
    ``memory`` (``<MiB>Mi``); a shared GPU has ``allowMultipleAllocations`` and a request
    policy of whole units (default one unit, steps of one unit).

    Taints (``taint_effect``: ``NoSchedule`` or ``NoExecute``): ``TAINT_UNHEALTHY`` with the
    first health reason on an unhealthy device; ``TAINT_MPS`` with the reason on a shared GPU
    whose UUID is in ``mps_down`` (GPU UUID -> why its MPS daemon is not up; always
    ``NoSchedule``: its running clients keep their server). ``taint_times``: ``(device name,
    taint key) -> RFC 3339 time`` the taint was first published, written as ``timeAdded`` so
    that a re-publish does not restart a toleration's clock."""
    mps = mps_down or {}
    times = taint_times or {}
    by_index = {g.index: g for g in snapshot.gpus}
    driver = _version(snapshot.driver_version.split(".")) if snapshot.driver_version else None
    cuda = _version(snapshot.cuda_driver_version) if snapshot.cuda_driver_version else None
    out: list[dict[str, Any]] = []
    for d in devices:
        g = by_index.get(d.gpu_index)
        attrs: dict[str, dict[str, Any]] = {
            "type": {"string": "mig" if d.mig_index is not None else "gpu"},
            "shared": {"bool": d.shared},
            "index": {"int": d.gpu_index},
        }
        if d.uuid:
            attrs["uuid"] = {"string": d.uuid}
        if g is not None and g.product:
            attrs["productName"] = {"string": g.product[:64]}
        if g is not None and g.architecture:
            attrs["architecture"] = {"string": g.architecture[:64]}
        if g is not None and g.compute_major is not None and g.compute_minor is not None:
            cc = _version((g.compute_major, g.compute_minor))
            if cc:
                attrs["cudaComputeCapability"] = {"version": cc}
        if driver:
            attrs["driverVersion"] = {"version": driver}
        if cuda:
            attrs["cudaDriverVersion"] = {"version": cuda}
        if d.free_memory_mib is not None:
            attrs["freeMemoryMiB"] = {"int": d.free_memory_mib}
        if d.mig_index is not None:
            attrs["migIndex"] = {"int": d.mig_index}
            if d.profile:
                attrs["profile"] = {"string": d.profile[:64]}
            if d.gpu_uuid:
                attrs["parentUUID"] = {"string": d.gpu_uuid}
        device: dict[str, Any] = {"name": d.name, "attributes": attrs}
        if d.memory_total_mib is not None:
            memory: dict[str, Any] = {"value": f"{d.memory_total_mib}Mi"}
            if d.shared and d.unit_mib > 0:
                unit = f"{d.unit_mib}Mi"
                memory["requestPolicy"] = {"default": unit, "validRange": {"min": unit, "step": unit}}
            device["capacity"] = {"memory": memory}
        if d.shared:
            device["allowMultipleAllocations"] = True
        taints: list[dict[str, Any]] = []
        if d.reasons:
            taints.append({"key": TAINT_UNHEALTHY, "value": _taint_value(d.reasons[0]),
                           "effect": taint_effect})
        why = mps.get(d.gpu_uuid) if d.shared and d.gpu_uuid else None
        if why is not None and not d.reasons:
            taints.append({"key": TAINT_MPS, "value": _taint_value(why),
                           "effect": "NoSchedule"})
        for t in taints:
            since = times.get((d.name, t["key"]))
            if since:
                t["timeAdded"] = since
        if taints:
            device["taints"] = taints
        out.append(device)
    return out


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


def _free(device: Mapping[str, Any]) -> int | None:
    value = (device.get("attributes") or {}).get("freeMemoryMiB", {})
    free = value.get("int") if isinstance(value, dict) else None
    return free if isinstance(free, int) else None


def _taint_keys(device: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {(str(t.get("key")), str(t.get("value")), str(t.get("effect")))
            for t in device.get("taints") or [] if isinstance(t, dict)}  # fmt: skip


def _static(device: Mapping[str, Any]) -> Any:
    attrs = {k: v for k, v in (device.get("attributes") or {}).items() if k != "freeMemoryMiB"}
    return attrs, device.get("capacity"), device.get("allowMultipleAllocations")


def worse_devices(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> bool:
    """Whether going from the published ``before`` to ``after`` makes the Node less attractive
    and must go at once (the labels' write budget, ``core.publish.budget.urgent``): a device gone, a
    device's free memory down, a taint added or changed, anything else about a device changed
    (its UUID, capacity: a scheduler may decide otherwise). More free memory, a taint removed
    or a new device may wait (``held_devices``)."""
    old = {d.get("name"): d for d in before}
    for d in after:
        b = old.pop(d.get("name"), None)
        if b is None:
            continue  # a new device lets more claims match: it may wait
        if _static(b) != _static(d):
            return True
        fb, fa = _free(b), _free(d)
        if fa is not None and (fb is None or fa < fb) or fa is None and fb is not None:
            return True
        if _taint_keys(d) - _taint_keys(b):
            return True
    return bool(old)  # a device gone


def held_devices(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``after`` with its changes for the better held back (while the write budget holds): a
    device's free memory stays at the published value when it rose, a taint that went stays,
    a new device waits. Changes for the worse are kept (``worse_devices``)."""
    old = {d.get("name"): d for d in before}
    out: list[dict[str, Any]] = []
    for d in after:
        b = old.get(d.get("name"))
        if b is None:
            continue
        held = dict(d)
        fb, fa = _free(b), _free(d)
        if fb is not None and fa is not None and fa > fb:
            held["attributes"] = {**d["attributes"], "freeMemoryMiB": {"int": fb}}
        gone = [t for t in b.get("taints") or [] if isinstance(t, dict)
                and (t.get("key"), t.get("value"), t.get("effect"))
                not in {(x.get("key"), x.get("value"), x.get("effect")) for x in d.get("taints") or []}]
        if gone:
            held["taints"] = [*(d.get("taints") or []), *gone]
        out.append(held)
    return out


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

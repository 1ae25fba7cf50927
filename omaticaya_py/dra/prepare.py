"""What ``NodePrepareResources`` decides for one ResourceClaim: pure, from the claim's JSON, the
node's devices (``core.publish.dra.inventory``) and facts read before the call (``NodeFacts``).

``decide(claim, ref, devices, facts)`` returns a ``PreparedClaim`` (one ``PreparedDevice`` per
allocation result of our driver on this node, each with the CDI container edits it gets) or
raises ``Refused`` with the reason the kubelet puts in the pod's events. ``cdi_spec`` turns a
``PreparedClaim`` into the CDI spec file's JSON (``CDI_VERSION``, kind ``CDI_KIND``); the
plugin (``plugin.DraPlugin``) does the I/O around these.

What a prepared device gives its container (CDI ``containerEdits``):

- env ``NVIDIA_VISIBLE_DEVICES=<UUID,...>``: the device's UUID (a MIG device's ``MIG-...``
  UUID, which the NVIDIA runtime resolves), joined with those of the claim's other devices of
  the same request (one variable per container: CDI applies a later device's value over an
  earlier's, so each device of a request carries the request's whole list), as the device
  plugin's ``envvar`` strategy does: a container and its user can tell which GPU it got.
- device nodes, each only when found as a character device under ``NodeFacts.dev_root``
  (``OMATICAYA_DRA_DEV_ROOT``): the GPU's ``nvidia<minor>`` (a MIG device: its parent GPU's),
  ``nvidiactl``, ``nvidia-uvm``, ``nvidia-uvm-tools``; container path and host path
  ``/dev/<name>`` (the runtime reads the host path on the host, where ``dev_root`` is the
  host's ``/dev``: the chart mounts it at ``/host/dev``), with the type, major and minor the
  plugin saw there (a fully specified node: the runtime needs no stat of its own). A MIG device's capability nodes (``/dev/nvidia-caps``) are left to the
  NVIDIA runtime, which ``NVIDIA_VISIBLE_DEVICES`` drives.
- a shared GPU's slice (``DraDevice.shared``): its ``consumedCapacity`` ``memory`` must be a
  whole number of ``unit_mib`` units. Under MPS (``OMATICAYA_SHARE_ENFORCEMENT=mps``) the
  container becomes the client of an MPS daemon of the slice's own, whose default pinned-memory
  limit is the slice (``core.allocation.mps``: a limit the container's environment cannot raise), named
  by ``claim_slice_id`` (``core.allocation.mps.client_spec``: env and mounts; ``PreparedDevice.daemon``:
  the request the plugin makes and waits for), and the claim is refused while the GPU's probe
  daemon is not up (fail closed); the slice must then be its claim's only device (a process is
  the client of one daemon). Without enforcement: the limit in the environment only. From
  driver r615 on, the driver's per-container limit too (``core.allocation.memory_limit``: the toolkit's
  hook applies it at the container's creation). Either way the slice
  must fit its GPU's live free memory less the slices prepared there that the reading does not
  show yet (``PendingSlice``, ``slices_pending``), by the device plugin's ``Allocate`` rule
  (``core.allocation.placement.fits_slice``); a claim's own slices never count against it.

Opaque configuration (``resourceclaim.opaque_configs``): ``GpuConfig``'s
``mpsActiveThreadPercentage`` applies to a shared GPU under MPS only. The claim's JSON is read by
``resourceclaim``; the CDI spec's pieces are ``cdi``'s (both re-exported here).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.allocation.memory_limit import slice_edits
from ..core.allocation.mps import (
    LIMIT_ENV,
    MPS_LIMIT_ENV,
    Layout,
    Mount,
    SliceRequest,
    client_spec,
    slice_id,
    thread_pct,
)
from ..core.allocation.placement import fits_slice
from ..core.allocation.shown import still_pending
from ..core.publish.dra import DRIVER, DraDevice, parse_device_name
from ..core.schema import GpuInfo
from .cdi import (
    CDI_CLASS,
    CDI_KIND,
    CDI_VENDOR,
    CDI_VERSION,
    DevNode,
    Edits,
    cdi_device,
    cdi_device_name,
    cdi_file_name,
    common_edits,
    spec_bytes,
)
from .resourceclaim import (
    CONFIG_API_VERSION,
    CONFIG_KIND,
    MAX_SLICE_MIB,
    THREADS_FIELD,
    ClaimRef,
    OpaqueConfig,
    Refused,
    capacity_mib,
    items,
    obj,
    opaque_configs,
    threads_for,
)

__all__ = [
    "CDI_CLASS", "CDI_KIND", "CDI_VENDOR", "CDI_VERSION", "CONFIG_API_VERSION", "CONFIG_KIND",
    "CONTROL_NODES", "MAX_SLICE_MIB", "OWNER", "ClaimRef", "DevNode", "Edits", "NodeFacts",
    "PendingSlice", "PreparedClaim", "PreparedDevice", "Refused", "capacity_mib",
    "cdi_device_name", "cdi_file_name", "cdi_spec", "claim_slice_id", "decide", "live_room",
    "slices_pending", "spec_bytes",
]  # fmt: skip

#: the NVIDIA driver's control nodes every GPU container needs (found under the dev root)
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


@dataclass(frozen=True, slots=True)
class PendingSlice:
    """A slice this plugin prepared on a shared GPU, kept (by the plugin, in memory) while the
    GPU's reading may not show it in use: its claim's UID, ``mib``, ``at_s`` (when it was
    prepared, on the agent's clock: monotonic seconds) and ``baseline_free_mib`` (the GPU's
    ``DraDevice.free_memory_mib`` then, less the memory of earlier slices shown since:
    ``slices_pending``; ``None``: unknown, never shown by a drop)."""

    claim_uid: str
    mib: int
    at_s: float
    baseline_free_mib: int | None


#: the one look at a book of slices (``core.allocation.shown.still_pending``), as the device plugin's
slices_pending = still_pending


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What prepare needs besides the claim and the devices, read just before (I/O by the
    plugin):

    - ``pool``: this node's pool name (the Node's name; the publisher's pool).
    - ``dev_root``: ``OMATICAYA_DRA_DEV_ROOT``; ``nodes``: the device nodes found there by name
      (``nvidia0``, ``nvidiactl``, ...; a missing one is left out of the spec).
    - ``minors``: GPU UUID -> its device minor (``/proc/driver/nvidia/gpus/*/information``); a
      GPU not there is taken to be ``nvidia<index>``.
    - ``mps``: the MPS layout when slices are enforced by MPS (``None``: enforcement off);
      ``mps_up``: GPU UUID -> ``(up, reason)`` of its daemon (``sources.mps.MpsWatch``) for
      each shared GPU; ``thread_share``: ``OMATICAYA_MPS_THREAD_SHARE``.
    - ``pending``: GPU UUID -> the slices this plugin prepared there that its reading does not
      show yet (``slices_pending`` at the devices' free memory; oldest first).
    - ``driver_major``: the NVIDIA driver's branch (``core.allocation.memory_limit.driver_major`` of the
      reading's ``nvmlSystemGetDriverVersion``; ``None``: unknown): from r615 on, a slice also
      gets the driver's per-container limit in its environment (``core.allocation.memory_limit``).
    - ``driver_mounts``: the NVIDIA driver's files, read-only (``driverfiles``): every claim's
      spec mounts them (``cdi_spec``); ``()``: none found, or ``OMATICAYA_DRA_DRIVER_FILES`` off.
    """

    pool: str
    dev_root: Path = Path("/dev")
    nodes: Mapping[str, DevNode] = field(default_factory=dict)
    minors: Mapping[str, int] = field(default_factory=dict)
    mps: Layout | None = None
    mps_up: Mapping[str, tuple[bool, str]] = field(default_factory=dict)
    thread_share: bool = False
    pending: Mapping[str, tuple[PendingSlice, ...]] = field(default_factory=dict)
    driver_major: int | None = None
    driver_mounts: tuple[Mount, ...] = ()


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One allocation result prepared: the kubelet's ``Device`` (``request_names``, ``pool``,
    ``device``, ``share_id``) and its CDI device (``cdi_name``, its ``edits``); ``uuid``: the
    device's UUID; ``mib``: a slice's memory (``None``: a whole device); ``daemon``: under MPS,
    the request for the slice's own MPS daemon (``core.allocation.mps.SliceRequest``, ``at_s`` 0: the
    plugin asks for it and waits before the claim counts as prepared)."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_name: str
    uuid: str
    edits: Edits
    share_id: str | None = None
    mib: int | None = None
    daemon: SliceRequest | None = None

    @property
    def cdi_id(self) -> str:
        """The fully qualified CDI device name: ``gpu.omaticaya.io/claim=<cdi_name>``."""
        return f"{CDI_KIND}={self.cdi_name}"


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """A claim prepared: ``ref``, its ``devices`` (empty: no result of ours), the driver's
    files its spec mounts (``driver_mounts``, read-only)."""

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    driver_mounts: tuple[Mount, ...] = ()


#: who the DRA plugin's slice requests are from (``core.allocation.mps.SliceRequest.owner``)
OWNER = "dra"


def claim_slice_id(claim_uid: str, device: str) -> str:
    """The MPS slice ID of ``device`` prepared for claim ``claim_uid``
    (``core.allocation.mps.slice_id`` of ``claim:<uid>:<device>``): the unprepare finds it again."""
    return slice_id(f"claim:{claim_uid}:{device}")


# -- the decision ----------------------------------------------------------------------------


def _node(facts: NodeFacts, name: str) -> tuple[DevNode, ...]:
    found = facts.nodes.get(name)
    return (found,) if found is not None else ()


def decide(claim: Mapping[str, Any], ref: ClaimRef, devices: Sequence[DraDevice] | None,
           facts: NodeFacts, *, no_reading: str = "") -> PreparedClaim:  # fmt: skip
    """Prepare ``claim`` (the ResourceClaim's JSON, as GET returns it) named by ``ref`` on a
    node whose devices are ``devices`` (``core.publish.dra.inventory`` of the latest reading; ``None``:
    no usable reading, ``no_reading`` says why). Returns the ``PreparedClaim``; raises ``Refused`` with the reason: the
    claim is another one now (UID), not allocated, allocated on another node's pool, a device
    unknown or not in the reading, unhealthy (its reasons), a bad opaque config, a slice that
    is not a whole number of units, an MPS daemon not up, a slice its GPU's live free memory
    less the other claims' pending slices cannot hold (``live_room``), a device twice in one
    claim, an MPS slice beside other devices."""
    allocation = _allocation(claim, ref)
    results = items(obj(allocation.get("devices") or {}, "status.allocation.devices").get("results"),
                    "status.allocation.devices.results")  # fmt: skip
    ours = []
    for i, raw in enumerate(results):
        result = obj(raw, f"status.allocation.devices.results[{i}]")
        if result.get("driver") == DRIVER:
            ours.append(result)
    configs = opaque_configs(allocation)
    if not ours:
        return PreparedClaim(ref, ())
    if devices is None:
        raise Refused(no_reading or "no reading of the GPUs yet (the agent has not finished its first tick)")
    picked = _pick(ours, devices, facts)
    mps_slices = [p.device.name for p in picked if p.device.shared and facts.mps is not None]
    if mps_slices and len(picked) > 1:
        raise Refused(f"the MPS slice of {mps_slices[0]} must be its claim's only device (a "
                      f"process is the client of one MPS daemon); this claim has {len(picked)}")  # fmt: skip
    # the request's UUIDs, for NVIDIA_VISIBLE_DEVICES
    by_request: dict[str, list[str]] = {}
    for p in picked:
        assert p.device.uuid is not None
        by_request.setdefault(p.request, []).append(p.device.uuid)
    prepared = []
    for p in picked:
        device = _device(p, by_request[p.request], threads_for(configs, p.request), ref, facts)
        prepared.append(device)
        if device.mib is not None:
            live_room(p.device, device.mib, ref, facts)
    return PreparedClaim(ref, tuple(prepared), facts.driver_mounts)


def _allocation(claim: Mapping[str, Any], ref: ClaimRef) -> dict[str, Any]:
    """The claim's ``status.allocation``. Raises ``Refused`` when the claim is another one now
    (its UID) or not allocated."""
    meta = obj(claim.get("metadata") or {}, "metadata")
    if meta.get("uid") != ref.uid:
        raise Refused(f"ResourceClaim {ref.namespace}/{ref.name} has UID {meta.get('uid')!r:.64}, "
                      f"not {ref.uid}: it was deleted and created again")  # fmt: skip
    status = claim.get("status") or {}
    allocation = status.get("allocation") if isinstance(status, dict) else None
    if not isinstance(allocation, dict):
        raise Refused(f"ResourceClaim {ref.namespace}/{ref.name} is not allocated")
    return allocation


@dataclass(frozen=True, slots=True)
class _Picked:
    """One allocation result of ours (``result``: its JSON) and the node's ``device`` it names,
    for ``request`` (``<request>`` or ``<request>/<subrequest>``; ``""``: none)."""

    result: Mapping[str, Any]
    device: DraDevice
    request: str


def _pick(ours: Sequence[Mapping[str, Any]], devices: Sequence[DraDevice], facts: NodeFacts) -> list[_Picked]:
    """Each of our allocation results with its device. Raises ``Refused``: a request that is no
    string, another node's pool, a device unknown or not in the reading, unhealthy, without a
    UUID, or twice in the claim."""
    known = {d.name: d for d in devices}
    picked: list[_Picked] = []
    seen: dict[str, str] = {}
    for result in ours:
        name, pool, request = result.get("device"), result.get("pool"), result.get("request", "")
        if not isinstance(request, str):
            raise Refused(f"the allocation result of device {name!r:.64}: request: expected a "
                          f"string; got {request!r:.64}")  # fmt: skip
        if pool != facts.pool:
            raise Refused(f"device {name!r:.64} is allocated from pool {pool!r:.64}, not this "
                          f"node's ({facts.pool})")  # fmt: skip
        if not isinstance(name, str) or parse_device_name(name) is None:
            raise Refused(f"device {name!r:.64}: unknown (not a device of {DRIVER})")
        dev = known.get(name)
        if dev is None:
            raise Refused(f"device {name}: not in the node's reading (the GPU is gone, or was "
                          "repartitioned)")  # fmt: skip
        if not dev.healthy:
            raise Refused(f"device {name} is unhealthy: {', '.join(dev.reasons)}")
        if dev.uuid is None:
            raise Refused(f"device {name}: its UUID cannot be read")
        if name in seen:
            raise Refused(f"device {name} is allocated twice in one claim (requests "
                          f"{seen[name]} and {request}): ask for it in one request")  # fmt: skip
        seen[name] = request
        picked.append(_Picked(result, dev, request))
    return picked


def live_room(dev: DraDevice, mib: int, ref: ClaimRef, facts: NodeFacts) -> None:
    """Refuse a slice of ``mib`` MiB of the shared GPU ``dev`` for claim ``ref`` that the GPU's
    live free memory (``DraDevice.free_memory_mib``: the reading's, rounded down to the memory
    step) less the slices pending there (``facts.pending``, but those of ``ref``'s own claim:
    a claim prepared again already holds its memory) cannot hold: the rule the device plugin's
    ``Allocate`` refuses a slice by (``core.allocation.placement.fits_slice``). Free memory unknown: not
    refused (as ``Allocate``). Raises ``Refused`` naming the device, the GPU, its free MiB, the
    pending MiB and the slice's MiB."""
    free = dev.free_memory_mib
    if free is None:
        return
    gpu_uuid = dev.gpu_uuid or dev.uuid
    pending = sum(s.mib for s in facts.pending.get(gpu_uuid or "", ()) if s.claim_uid != ref.uid)
    if not fits_slice(GpuInfo(dev.gpu_index, free - pending, True), mib, dev.unit_mib or 1):
        raise Refused(f"device {dev.name}: GPU {dev.gpu_index} {gpu_uuid} has {free} MiB free by "
                      f"its live reading, {pending} MiB of it prepared for slices not in use "
                      f"yet: a slice of {mib} MiB does not fit")  # fmt: skip


def _device(picked: _Picked, uuids: Sequence[str], config: OpaqueConfig | None, ref: ClaimRef,
            facts: NodeFacts) -> PreparedDevice:  # fmt: skip
    """The prepared device of ``picked``: its CDI edits (``uuids``: its request's UUIDs, for
    ``NVIDIA_VISIBLE_DEVICES``; ``config``: the opaque entry whose thread share applies), a
    slice's memory and MPS daemon. Raises ``Refused`` (a slice not in whole units, its MPS
    daemon not up, a thread share for a device that is no MPS slice)."""
    result, dev, request = picked.result, picked.device, picked.request
    threads = config.threads_pct if config is not None else None
    threads_where = config.where if config is not None else ""
    assert dev.uuid is not None
    gpu_uuid = dev.gpu_uuid or dev.uuid
    minor = facts.minors.get(gpu_uuid, dev.gpu_index)
    nodes = _node(facts, f"nvidia{minor}")
    for control in CONTROL_NODES:
        nodes += _node(facts, control)
    env = [f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}"]
    mounts: tuple[Mount, ...] = ()
    mib: int | None = None
    daemon: SliceRequest | None = None
    if dev.shared:
        consumed = result.get("consumedCapacity")
        amount = consumed.get("memory") if isinstance(consumed, dict) else None
        if amount is None:
            raise Refused(f"device {dev.name} is a shared GPU, but the allocation consumed no "
                          "memory capacity (consumedCapacity.memory)")  # fmt: skip
        mib = capacity_mib(amount)
        unit = dev.unit_mib or 1
        if mib % unit:
            raise Refused(f"device {dev.name}: consumedCapacity memory {amount} ({mib} MiB) is "
                          f"not a whole number of {unit} MiB units")  # fmt: skip
        units = mib // unit
        if facts.mps is not None:
            up, reason = facts.mps_up.get(gpu_uuid, (False, "mps-state-missing"))
            if not up:
                raise Refused(f"device {dev.name}: its MPS daemon is not up ({reason}): the "
                              "slice cannot be enforced")  # fmt: skip
            pct = threads
            if pct is None and facts.thread_share:
                pct = thread_pct(units, (dev.memory_total_mib or 0) // unit or units)
            sid = claim_slice_id(ref.uid, dev.name)
            spec = client_spec(facts.mps, sid, mib, threads_pct=pct)
            env += [f"{k}={v}" for k, v in spec.envs.items()]
            mounts = tuple(spec.mounts)
            daemon = SliceRequest(sid, gpu_uuid, dev.gpu_index, mib, OWNER,
                                  f"claim:{ref.uid}:{dev.name}", pct)  # fmt: skip
        else:
            env += [f"{MPS_LIMIT_ENV}=0={mib}M", f"{LIMIT_ENV}={mib}"]
        env += slice_edits(gpu_uuid, mib, facts.driver_major, name_hook=False).env_list()
    if threads is not None and not (dev.shared and facts.mps is not None):
        raise Refused(f"{threads_where}.opaque.parameters.{THREADS_FIELD}: only for a shared GPU "
                      f"under MPS; {dev.name} is not one")  # fmt: skip
    share_id = result.get("shareID")
    return PreparedDevice(
        request_names=(request,) if request else (),
        pool=facts.pool, device=dev.name, cdi_name=cdi_device_name(ref.uid, dev.name),
        uuid=dev.uuid, edits=Edits(tuple(env), nodes, mounts),
        share_id=share_id if isinstance(share_id, str) and share_id else None, mib=mib,
        daemon=daemon,
    )  # fmt: skip


# -- the CDI spec ----------------------------------------------------------------------------


def cdi_spec(claim: PreparedClaim, dev_root: Path = Path("/dev")) -> dict[str, Any]:
    """The claim's CDI spec (JSON-ready): ``cdiVersion`` ``CDI_VERSION``, kind ``CDI_KIND``,
    one device per prepared device, named ``<claim UID>-<device name>``, with its
    ``containerEdits`` (``cdi.cdi_device``; ``dev_root``: the host's /dev as the runtime sees
    it, ``/dev`` but in tests); the driver's files as the spec's own ``containerEdits``."""
    devices = [cdi_device(d.cdi_name, d.edits, dev_root) for d in claim.devices]
    common = common_edits(claim.driver_mounts) if claim.devices else {}
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices,
            **({"containerEdits": common} if common else {})}  # fmt: skip

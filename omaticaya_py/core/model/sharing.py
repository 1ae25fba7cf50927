"""GPU sharing by memory: which GPUs are shared, and the memory units they are served as.

A shared GPU is served to the kubelet as ``omaticaya.io/gpu-memory`` (the shared resource), one
device per ``unit_mib`` of its total memory, instead of as one whole ``nvidia.com/gpu``. A pod
asks for a slice in units (``resources.limits: omaticaya.io/gpu-memory: 20`` is 20 units, 20 GiB
with the default 1,024 MiB unit); every unit of one slice comes from one GPU.

Unit device IDs name their GPU: ``<GPU UUID>::<k>`` with ``k`` in ``0 .. units - 1`` (the form
NVIDIA's time-slicing uses for its replicas), so the kubelet's checkpoint, PodResources and our
``Allocate`` all tell which GPU a unit is on from the ID alone.

What the agent shares (``Sharing``: the shared GPUs and the unit, from the settings), whether a
GPU is served in units (``is_shared``) and the over-use episodes its Events follow
(``episodes``); who holds which slice and how much each uses is the attribution's
(``core.allocation.slice_use.gpu_slices``).

Pure: the agent (render, attribution), the device plugin and the extender use the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from .snapshot import GpuReading

__all__ = [
    "DEFAULT_GPU_RESOURCE",
    "DEFAULT_SHARED_RESOURCE",
    "DEFAULT_UNIT_MIB",
    "SHARED_GPUS_FORM",
    "UNIT_SEPARATOR",
    "INDICES_FORM",
    "IndexMoved",
    "SharedGpus",
    "Sharing",
    "device_order",
    "episodes",
    "gpu_indices",
    "gpu_room_mib",
    "is_shared",
    "moved_indices",
    "parse_indices",
    "parse_shared_gpus",
    "parse_unit_id",
    "slice_mib",
    "unit_count",
    "unit_gpu",
    "unit_id",
    "unit_ids",
]

#: the shared resource the device plugin serves and the extender places
DEFAULT_SHARED_RESOURCE = "omaticaya.io/gpu-memory"
#: the whole-GPU extended resource (``OMATICAYA_DEVICE_PLUGIN_RESOURCE``), NVIDIA's device
#: plugin's name too
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
#: MiB per unit device (``OMATICAYA_SHARE_UNIT_MIB``)
DEFAULT_UNIT_MIB = 1024
#: between the GPU UUID and the unit number in a unit device ID
UNIT_SEPARATOR = "::"
#: the forms ``OMATICAYA_SHARED_GPUS`` takes, for error messages
SHARED_GPUS_FORM = (
    "'none' (the default), 'all', GPU UUIDs like 'GPU-4a1b2c3d-...' (the safe form: a reboot "
    "that loses a GPU renumbers the others' indices, never their UUIDs), or GPU indices like "
    "'0,1,2,3' or '0-3'"
)

#: the form of a persisted index map (``parse_indices``), for error messages
INDICES_FORM = '{"version": 1, "gpus": {"<NVML index>": "<GPU UUID>", ...}}'

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
#: a GPU UUID as NVML gives it (``nvmlDeviceGetUUID``: ``GPU-`` and hex groups), lower-cased
_GPU_UUID = re.compile(r"^gpu-[0-9a-f]+(?:-[0-9a-f]+){0,7}$")
_UNIT_ID = re.compile(r"^(?P<uuid>.+)::(?P<k>0|[1-9]\d{0,6})$")


@dataclass(frozen=True, slots=True)
class SharedGpus:
    """Which GPUs are shared: none, ``all``, the ``uuids`` given (``nvmlDeviceGetUUID``,
    lower-cased: the GPU's own identity, which no reboot renumbers) and the ``indices`` given
    (``nvmlDeviceGetIndex``: PCI order, which shifts when a GPU is gone at boot). MIG-enabled
    GPUs are never shared this way (their MIG devices are a resource of their own); callers
    check ``mig_enabled`` themselves."""

    all: bool = False
    indices: frozenset[int] = frozenset()
    uuids: frozenset[str] = frozenset()

    def shares(self, index: int | None, uuid: str | None) -> bool:
        """Whether the GPU at NVML ``index`` whose UUID is ``uuid`` (``None``: unknown) is one
        of these: ``all``, its index listed, or its UUID listed (compared without case)."""
        if self.all:
            return True
        if index is not None and index in self.indices:
            return True
        return uuid is not None and uuid.lower() in self.uuids

    def __bool__(self) -> bool:
        return self.all or bool(self.indices) or bool(self.uuids)

    def __str__(self) -> str:
        if self.all:
            return "all"
        parts = [str(i) for i in sorted(self.indices)] + [u.upper()[:4] + u[4:] for u in sorted(self.uuids)]
        return ",".join(parts) or "none"


@dataclass(frozen=True, slots=True)
class Sharing:
    """What the agent shares: ``gpus`` (``OMATICAYA_SHARED_GPUS``) in units of ``unit_mib``
    (``OMATICAYA_SHARE_UNIT_MIB``). ``Sharing()`` shares nothing."""

    gpus: SharedGpus = SharedGpus()
    unit_mib: int = 1024

    @classmethod
    def of(cls, settings: object) -> Sharing:
        """From the settings (``shared_gpus``, ``share_unit_mib``)."""
        return cls(settings.shared_gpus, settings.share_unit_mib)  # type: ignore[attr-defined]

    def __bool__(self) -> bool:
        return bool(self.gpus)


def is_shared(g: GpuReading, sharing: Sharing | None) -> bool:
    """Whether GPU ``g`` is served as memory units: its UUID or index is shared
    (``SharedGpus.shares``) and MIG is not on (a GPU with MIG on is given out as MIG devices,
    never in units)."""
    return sharing is not None and sharing.gpus.shares(g.index, g.uuid) and not g.mig_enabled


def parse_shared_gpus(value: str | Iterable[int] | SharedGpus | None) -> SharedGpus:
    """``OMATICAYA_SHARED_GPUS``: ``''``/``none`` -> no GPU shared, ``all``, or GPU UUIDs,
    indices and ranges separated by commas or spaces (``GPU-4a1b...,GPU-9c8d...``,
    ``0,1,2,3``, ``0-3``, ``0-1 6``; both kinds may be mixed).

    Raises ``ValueError`` naming the expected form (``SHARED_GPUS_FORM``) on anything else
    (a negative or reversed range, a name that is no GPU UUID, more than 1,024 indices)."""
    if isinstance(value, SharedGpus):
        return value
    if value is None:
        return SharedGpus()
    if not isinstance(value, str):
        indices = frozenset(value)
        if not all(isinstance(i, int) and 0 <= i < 1024 for i in indices):
            raise ValueError(f"expected {SHARED_GPUS_FORM}")
        return SharedGpus(indices=indices)
    text = value.strip().lower()
    if text in ("", "none"):
        return SharedGpus()
    if text == "all":
        return SharedGpus(all=True)
    found: set[int] = set()
    uuids: set[str] = set()
    for part in (p for p in re.split(r"[,\s]+", text) if p):
        if part.startswith("gpu-"):
            if len(part) > 80 or not _GPU_UUID.match(part):
                raise ValueError(f"expected {SHARED_GPUS_FORM}; got {part[:48]!r}, not a GPU UUID")
            uuids.add(part)
            continue
        m = _RANGE.match(part)
        if m is None:
            raise ValueError(f"expected {SHARED_GPUS_FORM}; got {part[:32]!r}")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo or hi >= 1024:
            raise ValueError(f"expected {SHARED_GPUS_FORM}; got the range {part[:32]!r}")
        found.update(range(lo, hi + 1))
    return SharedGpus(indices=frozenset(found), uuids=frozenset(uuids))


@dataclass(frozen=True, slots=True)
class IndexMoved:
    """A shared GPU index (``OMATICAYA_SHARED_GPUS`` by index) that names another GPU than it
    did at the last start: ``index``, the UUID it named then (``before``) and now (``now``,
    ``None``: no GPU at that index now)."""

    index: int
    before: str
    now: str | None

    def message(self) -> str:
        """The text of the log line and the Event: what moved, and the safe form."""
        now = f"GPU {self.now}" if self.now else "no GPU"
        return (f"OMATICAYA_SHARED_GPUS names GPU index {self.index}, which was GPU {self.before} "
                f"at the last start and is {now} now (a GPU lost or added renumbered the "
                f"indices): sharing follows the index; name GPUs by UUID to keep sharing on "
                f"the same GPU")  # fmt: skip


def moved_indices(shared: SharedGpus, before: Mapping[int, str], now: Mapping[int, str]
                  ) -> list[IndexMoved]:  # fmt: skip
    """The shared indices (``shared.indices``: those named by index, not ``all``, not a UUID)
    whose GPU changed since the last start: ``before`` and ``now`` are NVML index -> GPU UUID
    (``nvmlDeviceGetIndex``/``nvmlDeviceGetUUID``) at the last start (as persisted) and now. An
    index not in ``before`` (never seen) is not reported; one gone from ``now`` is. In index
    order."""
    out = []
    for index in sorted(shared.indices):
        was = before.get(index)
        if was is None:
            continue
        is_now = now.get(index)
        if is_now is None or is_now.lower() != was.lower():
            out.append(IndexMoved(index, was, is_now))
    return out


def gpu_indices(gpus: Iterable[GpuReading]) -> dict[int, str]:
    """NVML index -> GPU UUID (``nvmlDeviceGetIndex``/``nvmlDeviceGetUUID``) of the GPUs of
    one reading; a GPU whose UUID could not be read is left out. The map a start persists and
    the next start compares (``moved_indices``): the DRA plugin's and the device plugin's."""
    return {g.index: g.uuid for g in gpus if g.uuid}


def parse_indices(doc: object) -> dict[int, str]:
    """A persisted index map, already decoded from JSON (``INDICES_FORM``:
    ``{"version": 1, "gpus": {"<index>": "<UUID>"}}``) -> NVML index -> GPU UUID. Entries whose
    index is not a number of at most 4 digits or whose UUID is not a string are left out.
    Raises ``ValueError`` naming ``INDICES_FORM`` for anything else (another version, no
    ``gpus`` object)."""
    gpus = doc.get("gpus") if isinstance(doc, dict) and doc.get("version") == 1 else None
    if not isinstance(gpus, dict):
        raise ValueError(f"not a version 1 file of GPU indices: expected {INDICES_FORM}")
    return {int(k): v for k, v in gpus.items()
            if isinstance(v, str) and str(k).isdigit() and len(str(k)) <= 4}  # fmt: skip


def unit_count(memory_total_mib: int | None, unit_mib: int) -> int:
    """Units a GPU of ``memory_total_mib`` (``nvmlDeviceGetMemoryInfo().total``) is served as:
    whole units only (an H100 80GB, 81,559 MiB, is 79 units of 1,024 MiB). 0 when unknown."""
    if not memory_total_mib or memory_total_mib <= 0 or unit_mib <= 0:
        return 0
    return memory_total_mib // unit_mib


def unit_id(gpu_uuid: str, k: int) -> str:
    """The device ID of unit ``k`` of a GPU: ``GPU-1a2b...::7``."""
    return f"{gpu_uuid}{UNIT_SEPARATOR}{k}"


def unit_ids(gpu_uuid: str, units: int) -> list[str]:
    """Every unit device ID of a GPU, in order."""
    return [unit_id(gpu_uuid, k) for k in range(units)]


def parse_unit_id(device_id: str) -> tuple[str, int] | None:
    """``(GPU UUID, k)`` of a unit device ID, ``None`` for anything else (a whole GPU's UUID,
    a made-up ID from an untrusted caller)."""
    m = _UNIT_ID.match(device_id) if len(device_id) <= 256 else None
    return (m.group("uuid"), int(m.group("k"))) if m else None


def unit_gpu(device_id: str) -> str | None:
    """The GPU UUID a unit device ID names, ``None`` if it is not a unit ID."""
    parsed = parse_unit_id(device_id)
    return parsed[0] if parsed else None


def slice_mib(units: int, unit_mib: int) -> int:
    """MiB of a slice of ``units`` units (what ``Allocate`` sets as the limit)."""
    return max(units, 0) * unit_mib


def gpu_room_mib(free_mib: int, units_left: int, unit_mib: int) -> int:
    """The largest slice one shared GPU can take, MiB: the least of its two books, its live
    free memory ``free_mib`` (``nvmlDeviceGetMemoryInfo().free``, less what is handed out and
    not yet in use) and its ``units_left`` units no container holds (the kubelet's books) x
    ``unit_mib``; never below 0.

    The one rule of "a slice fits on this GPU": the agent's ``gpu.shared.memory.free-mib``
    (``core.allocation.slice_use.slice_room_mib``), the extender's per-GPU room (``core.schema.parse_node``, from the
    telemetry's ``share_units`` and its holders' ``limit_mib``) and the device plugin's choice
    (``deviceplugin.slices.Room``) all call it."""
    return max(min(free_mib, max(units_left, 0) * unit_mib), 0)


def device_order(healthy: bool, free_mib: int | None, index: int) -> tuple[bool, int, int]:
    """The sort key of a whole GPU among those not yet assigned, first preferred first:
    healthy before unhealthy, most live free memory (MiB; ``None`` unknown: last), lowest
    NVML index on a tie.

    The one rule of "which whole GPU a pod gets": the device plugin's
    ``GetPreferredAllocation`` hands out GPUs in this order (``deviceplugin.allocation.preferred``,
    topology breaking a tie of free memory on real NVML), and the extender reserves the same
    GPUs for a pod it places (``scheduler.inflight.choose_gpus``), so the GPU the kubelet assigns
    is the one the extender counted as taken. The plugin does not know a pod's memory need
    (the device plugin API gives it none): a node passes only when the GPUs first in this
    order each have the pod's need free."""
    return (not healthy, -(free_mib if free_mib is not None else -1), index)


K = TypeVar("K", bound=Hashable)  # an over-use episode's key


def episodes(reported: frozenset[K], now: Iterable[K]) -> tuple[list[K], frozenset[K]]:
    """Over-use episodes: ``(keys whose episode starts now, reported keys still in one)``,
    given the keys whose episode was already said (``reported``) and those over their limit
    ``now``. An episode is said once when it starts and ends when its key is no longer over; a
    later return starts a new one. The caller adds the keys it said to the second part (one it
    could not say stays new, and is tried again)."""
    current = list(dict.fromkeys(now))
    return [k for k in current if k not in reported], frozenset(reported & set(current))

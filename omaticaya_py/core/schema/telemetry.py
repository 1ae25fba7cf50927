"""The telemetry annotation as one versioned model: what the agent writes, what readers parse.

``<prefix>/telemetry`` on each Node holds the agent's whole last reading as compact JSON with
sorted keys (``Telemetry.to_json``). The same pydantic models parse it back
(``Telemetry.parse``) for the scheduler extender, ``omaticaya top`` and the tests. Reading is
lenient, because any controller can write a Node's annotations: a field of the wrong type reads
as ``None``, a GPU entry that is not an object or has no whole ``index`` is skipped, and only a
document that is not a JSON object (or is too large, or nests too deep) is unreadable. A
``schema`` newer than ``TELEMETRY_VERSION`` is refused (``SCHEMA_NEWER``: it may mean anything
to this reader); one that is absent or not a number is read as this version.

Shape (``"schema"`` is ``TELEMETRY_VERSION``)::

    {"schema", "agent", "read_at" (RFC 3339, UTC), "source", "health", "driver", "cuda",
     "error"?, "lease"?, "refresh_s"?, "expires_at"?, "window_s"?, "share_unit_mib"?,
     "gpus": [{"index", "uuid", "product", "memory_total_mib", "memory_free_mib",
               "memory_used_mib", "utilization_pct", "temperature_c", "power_w",
               "ecc_uncorrected_volatile", "ecc_corrected_volatile", "remapped_rows_pending",
               "remapped_rows_failure", "process_count", "health", "reasons", "error"?,
               "sm_active_pct"?, "tensor_active_pct"?, "dram_bw_pct"? (GPM),
               "memory_free_min_mib"?, "utilization_p95_pct"?, "xids"?: [{"xid", "at"}],
               "pods"?: [{"namespace", "pod",
               "container", "memory_used_mib"?, "limit_mib"?, "over_limit"?}], "memory_out_of_band_mib"?,
               "shared"?, "share_units"?, "mps"?, "mig_enabled"?, "mig_devices"?: [{"index", "uuid", "profile",
               "gpu_instance_id", "memory_total_mib", "memory_free_mib", "memory_used_mib",
               "process_count", "health", "reasons", "error"?, "pods"?,
               "memory_out_of_band_mib"?}], "pci_bus_id"?, "numa_node"?, "pcie_root"?,
               "nvlink_island"?}],
     "links"?: [{"a", "b", "level"?, "nvlinks", "p2p"?}]}

Values NVML did not give (NotSupported) are ``null``; keys marked ``?`` appear only when set.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_serializer,
    model_validator,
)

from .values import json_float, json_int, json_str, rfc3339_s

__all__ = [
    "MAX_TELEMETRY_BYTES",
    "SCHEMA_NEWER",
    "TELEMETRY",
    "TELEMETRY_VERSION",
    "GpuTelemetry",
    "LinkTelemetry",
    "MigTelemetry",
    "PodTelemetry",
    "Telemetry",
    "XidTelemetry",
]

#: Annotation name (under the prefix) holding the whole reading as compact JSON.
TELEMETRY = "telemetry"
#: ``"schema"`` field of the telemetry JSON: bumped when a reader would misread a new document.
TELEMETRY_VERSION = 2
#: the most a Node's annotations can hold in total (the API server's limit): a larger telemetry
#: value did not come from the API server and is not parsed
MAX_TELEMETRY_BYTES = 256 * 1024
#: the problem of a document whose ``schema`` is newer than this reader's (one name, whatever the
#: number: it is a metric label)
SCHEMA_NEWER = (
    f"telemetry annotation of an unknown newer schema (this reader knows up to {TELEMETRY_VERSION})"
)


def _newer_schema(value: Any) -> bool:
    """Whether the ``schema`` value ``value`` names a version newer than ``TELEMETRY_VERSION``
    (any number above it, infinities and numbers too large to read included; a whole number as
    text as ``json_int`` reads it). Anything else is not a version: read leniently."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return not value <= TELEMETRY_VERSION  # NaN too: no version this reader knows
    version = json_int(value)
    return version is not None and version > TELEMETRY_VERSION


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list | tuple) else ()


Int = Annotated[int | None, BeforeValidator(json_int)]
Float = Annotated[float | None, BeforeValidator(json_float)]
Str = Annotated[str | None, BeforeValidator(json_str)]
Bool = Annotated[bool | None, BeforeValidator(_bool)]
Strings = Annotated[tuple[str, ...], BeforeValidator(_strings)]
Index = Annotated[int, BeforeValidator(json_int)]  # required: an entry without one is skipped


def _entries(model: type[BaseModel]) -> Callable[[Any], tuple[Any, ...]]:
    """A before-validator for a list of ``model`` entries that skips the unreadable ones."""

    def read(value: Any) -> tuple[Any, ...]:
        out = []
        for entry in value if isinstance(value, list | tuple) else ():
            if isinstance(entry, model):
                out.append(entry)
            elif isinstance(entry, dict):
                try:
                    out.append(model.model_validate(entry))
                except ValidationError:
                    continue
        return tuple(out)

    return read


def _optional_entries(model: type[BaseModel]) -> Callable[[Any], tuple[Any, ...] | None]:
    """Like ``_entries``, but absent (``None``) stays absent."""
    read = _entries(model)
    return lambda value: None if value is None else read(value)


class _Document(BaseModel):
    """Common config; keys in ``_OPTIONAL`` are left out of the JSON while unset (``None``)."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)
    _OPTIONAL: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: Any) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for key in self._OPTIONAL:
            if out.get(key) is None:
                out.pop(key, None)
        return out


class PodTelemetry(_Document):
    """A container holding a GPU or MIG device (the kubelet's PodResources), and the memory its
    processes use on it (``memory_used_mib``: when the device has this one holder and every
    process on it could be placed; absent otherwise). On a shared GPU: its slice
    (``limit_mib``), the memory of its own processes there (``memory_used_mib``, when they are
    placed and named) and ``over_limit`` while it holds more than its slice."""

    _OPTIONAL = frozenset({"memory_used_mib", "limit_mib", "over_limit"})
    namespace: Str = None
    pod: Str = None
    container: Str = None
    memory_used_mib: Int = None
    #: on a shared GPU: the container's slice (its memory units x the unit, MiB)
    limit_mib: Int = None
    #: on a shared GPU: true while the container holds more than its slice (``memory_used_mib``
    #: over ``limit_mib``); absent otherwise
    over_limit: Annotated[bool | None, BeforeValidator(lambda v: True if v is True else None)] = None


Pods = Annotated[tuple[PodTelemetry, ...] | None, BeforeValidator(_optional_entries(PodTelemetry))]


class XidTelemetry(_Document):
    """A fatal Xid that keeps its GPU Unhealthy: the code and when the agent saw its latest
    event (``at``, RFC 3339 with milliseconds, UTC). Written since schema 2 without a version
    bump (older readers ignore it); a restarted agent seeds its Xid window from it
    (``core.rules.xid_seed``)."""

    xid: Index
    at: Str = None

    @property
    def at_s(self) -> float | None:
        """``at`` in epoch seconds (``None``: absent or unreadable)."""
        return rfc3339_s(self.at)


class LinkTelemetry(_Document):
    """What joins two GPUs of the node (``core.model.topology.PairLink``), by NVML index:
    ``level`` the PCIe common ancestor (``NVML_TOPOLOGY_*``: 0 same board ... 50 across the
    system), ``nvlinks`` the NVLinks joining them, ``p2p`` whether P2P reads work. An entry
    without two whole indices is skipped. Written since schema 2 without a version bump."""

    _OPTIONAL = frozenset({"level", "p2p"})
    a: Index
    b: Index
    level: Int = None
    nvlinks: Int = None
    p2p: Bool = None


class MigTelemetry(_Document):
    """One MIG device of a GPU with MIG on (from ``nvmlDeviceGetMigDeviceHandleByIndex`` and
    its memory, processes and attributes); ``health``/``reasons`` from ``core.rules.health``."""

    _OPTIONAL = frozenset({"error", "pods", "memory_out_of_band_mib"})
    index: Index
    uuid: Str = None
    profile: Str = None
    gpu_instance_id: Int = None
    memory_total_mib: Int = None
    memory_free_mib: Int = None
    memory_used_mib: Int = None
    process_count: Int = None
    health: Str = None
    reasons: Strings = ()
    error: Str = None
    pods: Pods = None
    memory_out_of_band_mib: Int = None


class GpuTelemetry(_Document):
    """One GPU as published: NVML's values (MiB, %, °C, W, error counts), its health and the
    reasons for it, and, with MIG on, its MIG devices. ``memory_free_min_mib`` and
    ``utilization_p95_pct``: the least free memory and the p95 utilisation over the document's
    ``window_s`` (``core.model.window``; absent until the window is half covered). ``pods``: the
    containers holding it; ``memory_out_of_band_mib``: memory of processes in no pod (both
    absent when the agent attributes nothing; with MIG on, per MIG device, and the GPU's
    out-of-band memory is their sum). ``xids``: the fatal Xids behind its ``xid-N`` reasons,
    with their times (absent when there are none, and from agents before it was added).
    ``memory_free_unreadable`` (not written) is true when a reader found a ``memory_free_mib``
    that is not a whole number."""

    _OPTIONAL = frozenset(
        {
            "error", "mig_enabled", "mig_devices", "memory_free_min_mib", "utilization_p95_pct",
            "pods", "memory_out_of_band_mib", "xids", "shared", "share_units", "mps",
            "sm_active_pct", "tensor_active_pct", "dram_bw_pct", "pci_bus_id", "numa_node",
            "pcie_root", "nvlink_island",
        }
    )
    index: Index
    uuid: Str = None
    product: Str = None
    memory_total_mib: Int = None
    memory_free_mib: Int = None
    memory_used_mib: Int = None
    utilization_pct: Float = None
    #: GPM (Hopper and newer, issue 40): SM activity, tensor activity and DRAM bandwidth, % over
    #: the interval, rounded to 0.1 like utilisation; absent (never 0) where GPM is not
    #: supported, and from agents before it
    sm_active_pct: Float = None
    tensor_active_pct: Float = None
    dram_bw_pct: Float = None
    temperature_c: Int = None
    power_w: Float = None
    ecc_uncorrected_volatile: Int = None
    ecc_corrected_volatile: Int = None
    remapped_rows_pending: Bool = None
    remapped_rows_failure: Bool = None
    process_count: Int = None
    health: Str = None
    reasons: Strings = ()
    error: Str = None
    mig_enabled: Annotated[bool | None, BeforeValidator(lambda v: True if v is True else None)] = None
    mig_devices: Annotated[
        tuple[MigTelemetry, ...] | None, BeforeValidator(_optional_entries(MigTelemetry))
    ] = None
    memory_free_min_mib: Int = None
    utilization_p95_pct: Float = None
    pods: Pods = None
    memory_out_of_band_mib: Int = None
    xids: Annotated[
        tuple[XidTelemetry, ...] | None, BeforeValidator(_optional_entries(XidTelemetry))
    ] = None
    #: served as memory units (``core.model.sharing``), not whole; absent when not shared
    shared: Annotated[bool | None, BeforeValidator(lambda v: True if v is True else None)] = None
    #: units it is served as (``core.model.sharing.unit_count``); absent when not shared
    share_units: Int = None
    #: a shared GPU's enforcement by CUDA MPS (issue 39): ``"up"`` while its MPS control
    #: daemon answers with a fresh heartbeat (each slice capped at its limit), else the reason
    #: it is not (``mps-daemon-down``, ``mps-daemon-starting``, ``mps-state-missing``,
    #: ``mps-state-unreadable``, ``mps-state-stale``: its units are not served then); absent
    #: for a GPU not shared and with ``OMATICAYA_SHARE_ENFORCEMENT=none`` (nothing enforces a
    #: slice), and from agents before it
    mps: Str = None
    #: topology (issue 50; ``core.model.topology.GpuTopology``): its PCI address in BDF form,
    #: its NUMA node, its PCIe root complex (``pci<domain>:<bus>``) and its NVLink island
    #: (``NodeTopology.islands``); absent when unknown, and from agents before it
    pci_bus_id: Str = None
    numa_node: Int = None
    pcie_root: Str = None
    nvlink_island: Str = None
    memory_free_unreadable: bool = Field(default=False, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _note_unreadable(cls, data: Any) -> Any:
        if isinstance(data, dict):
            raw = data.get("memory_free_mib")
            data = {**data, "memory_free_unreadable": raw is not None and json_int(raw) is None}
        return data

    @property
    def mig(self) -> bool:
        """True when MIG is on (the GPU is given out as MIG devices, not whole)."""
        return self.mig_enabled is True


class Telemetry(_Document):
    """The whole annotation. ``lease`` (``"namespace/name"``) names the Lease that carries the
    agent's liveness; without it, ``refresh_s``/``expires_at`` are the agent's promise to
    rewrite the document within ``refresh_s`` of ``read_at``. ``gpus_listed`` (not written) is
    true when the document lists GPU objects at all, even unreadable ones."""

    _OPTIONAL = frozenset(
        {"error", "lease", "refresh_s", "expires_at", "window_s", "share_unit_mib", "links"}
    )
    version: Int = Field(default=None, alias="schema")
    agent: Str = None
    read_at: Str = None
    source: Str = None
    health: Str = None
    driver: Str = None
    cuda: Str = None
    gpus: Annotated[tuple[GpuTelemetry, ...], BeforeValidator(_entries(GpuTelemetry))] = ()
    error: Str = None
    lease: Str = None
    refresh_s: Float = None
    expires_at: Str = None
    window_s: Float = None
    #: MiB per memory unit of the shared GPUs; absent when no GPU is shared
    share_unit_mib: Int = None
    #: what joins each pair of GPUs (``LinkTelemetry``), lower index first; absent when the
    #: agent knows no topology (a trace without it, an older agent)
    links: Annotated[
        tuple[LinkTelemetry, ...] | None, BeforeValidator(_optional_entries(LinkTelemetry))
    ] = None
    gpus_listed: bool = Field(default=False, exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _note_listed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            listed = data.get("gpus")
            data = {
                **data,
                "gpus_listed": isinstance(listed, list | tuple)
                and any(isinstance(g, dict | GpuTelemetry) for g in listed),
            }
        return data

    @property
    def read_at_s(self) -> float | None:
        """``read_at`` in epoch seconds (``None``: absent or not RFC 3339 with a zone)."""
        return rfc3339_s(self.read_at)

    @property
    def expires_at_s(self) -> float | None:
        """``expires_at`` in epoch seconds (``None``: absent or unreadable)."""
        return rfc3339_s(self.expires_at)

    def to_json(self) -> str:
        """The annotation value: compact JSON, keys sorted."""
        return json.dumps(self.model_dump(by_alias=True), separators=(",", ":"), sort_keys=True)

    @classmethod
    def parse(cls, raw: Any) -> tuple[Telemetry | None, str | None]:
        """``(document, None)``, or ``(None, problem)`` when ``raw`` is not a string, is over
        ``MAX_TELEMETRY_BYTES``, is not a JSON object, nests too deep, or has a ``schema`` newer
        than ``TELEMETRY_VERSION`` (``SCHEMA_NEWER``). Never raises."""
        if not isinstance(raw, str):
            return None, "unreadable telemetry annotation (not a string)"
        if len(raw) > MAX_TELEMETRY_BYTES:
            return None, f"unreadable telemetry annotation (over {MAX_TELEMETRY_BYTES} bytes)"
        try:
            loaded = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            loaded = None
        if not isinstance(loaded, dict):
            return None, "unreadable telemetry annotation"
        if _newer_schema(loaded.get("schema")):
            return None, SCHEMA_NEWER
        try:
            return cls.model_validate(loaded), None
        except (ValidationError, RecursionError):
            return None, "unreadable telemetry annotation"

    @staticmethod
    def names_lease(raw: str | None, lease: str) -> bool:
        """Whether the annotation value ``raw`` names the Lease ``lease`` (``"ns/name"``): the
        agent's check that readers know where its liveness is (a substring test on the compact
        JSON this module writes, so that a quiet tick parses nothing)."""
        return raw is not None and f'"lease":{json.dumps(lease)}' in raw

"""The trace file format (versions 1 to 3, ``docs/trace-format.md``): its pydantic models and ``load_trace``.

Version 3 adds a GPU's place on the node to its ``devices[]`` entry, every key optional:
``topology``, ``numa_node``, ``cpu_affinity``, ``pcie_root``, ``nvlinks``, ``p2p_read``,
``fabric`` (``TraceDevice``; made a ``NodeTopology`` by ``sources.trace_topology``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..core.model.topology import LEVEL_NAMES, pci_bdf

__all__ = [
    "FORMAT_VERSIONS",
    "MAX_GPUS",
    "MAX_TRACE_BYTES",
    "NVLINK_MAX_LINKS",
    "Trace",
    "TraceError",
    "load_trace",
]

MIB = 1024 * 1024
#: Trace format versions this reader replays (``format_version``; absent means 1).
FORMAT_VERSIONS = (1, 2, 3)
#: Largest trace file read (an hour of 8 GPUs at 0.25 s is ~200 MiB).
MAX_TRACE_BYTES = 512 * MIB
#: Most GPUs in one sample (NVML's device indices on the largest nodes are far below this).
MAX_GPUS = 1024
#: ``NVML_NVLINK_MAX_LINKS`` (nvml.h): NVLink numbers are 0 .. 17
NVLINK_MAX_LINKS = 18
#: Most 64-bit words of a CPU mask (``cpu_affinity``): 65,536 CPUs
MAX_CPU_WORDS = 1024


class TraceError(ValueError):
    """A trace file cannot be read or does not follow the format; ``str()`` is one line per
    problem, each starting with the file name."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, strict=True, allow_inf_nan=False)


class NvmlErr(_Model):
    nvml_error: str
    message: str = ""


class MemoryBytes(_Model):
    total: int = Field(ge=0)
    used: int = Field(ge=0)
    free: int = Field(ge=0)


class UtilizationPct(_Model):
    gpu: float
    memory: float | None = None


class GpmSample(_Model):
    """A reading's ``gpm`` object: the GPU's GPM metrics over ``(t[k-1], t[k]]``; a metric may
    be an ``NvmlErr`` or absent; ``supported: false`` is a GPU without GPM. Other metrics
    (``graphics_pct``, ``sm_occupancy_pct``, ...) are kept as extra fields."""

    supported: bool = True
    nvml_error: None = None  # ``{"nvml_error": X}`` is the union's NvmlErr, never this
    sm_active_pct: float | NvmlErr | None = None
    tensor_active_pct: float | NvmlErr | None = None
    dram_bw_pct: float | NvmlErr | None = None


class RemappedRows(_Model):
    correctable: int = 0
    uncorrectable: int = 0
    pending: int = 0
    failure: int = 0


class Process(_Model):
    pid: int
    usedGpuMemory: int | None = None


class MigSample(_Model):
    index: int = Field(ge=0)
    nvml_error: str | None = None
    message: str = ""
    memory_bytes: MemoryBytes | NvmlErr | None = None
    compute_processes: list[Process] | NvmlErr | None = None


def _unique(items: list[Any], what: str) -> None:
    seen: set[int] = set()
    for i, item in enumerate(items):
        if item.index in seen:
            raise ValueError(f"{what}[{i}]: index {item.index} appears twice")
        seen.add(item.index)


class GpuSample(_Model):
    index: int = Field(ge=0, lt=MAX_GPUS)
    nvml_error: str | None = None
    message: str = ""
    memory_bytes: MemoryBytes | NvmlErr | None = None
    utilization_pct: UtilizationPct | NvmlErr | None = None
    temperature_c: float | NvmlErr | None = None
    power_mw: float | NvmlErr | None = None
    performance_state: int | NvmlErr | None = None
    ecc_uncorrected_volatile: int | NvmlErr | None = None
    ecc_corrected_volatile: int | NvmlErr | None = None
    remapped_rows: RemappedRows | NvmlErr | None = None
    compute_processes: list[Process] | NvmlErr | None = None
    mig_devices: list[MigSample] = Field(default_factory=list, max_length=64)
    gpm: GpmSample | NvmlErr | None = None

    @model_validator(mode="after")
    def _unique_mig(self) -> GpuSample:
        _unique(self.mig_devices, "mig_devices")
        return self


class XidRecord(_Model):
    index: int
    xid: int


class Sample(_Model):
    t: float
    gpus: list[GpuSample] | None = Field(default=None, max_length=MAX_GPUS)
    nvml_error: str | None = None
    message: str = ""
    xid_events: list[XidRecord] = Field(default_factory=list)

    @model_validator(mode="after")
    def _gpus_or_error(self) -> Sample:
        if self.gpus is None and self.nvml_error is None:
            raise ValueError("a sample needs 'gpus' or 'nvml_error'")
        _unique(self.gpus or [], "gpus")
        return self


class MigAttributes(_Model):
    gpu_instance_slice_count: int = Field(gt=0)
    compute_instance_slice_count: int = Field(gt=0)
    memory_size_mb: int = Field(gt=0)  # MiB, as nvmlDeviceAttributes_t.memorySizeMB


class MigDevice(_Model):
    index: int = Field(ge=0)
    uuid: str | None = None
    name: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    attributes: MigAttributes | None = None


def _peer_map(value: dict[str, int], allowed: tuple[int, ...], what: str) -> dict[str, int]:
    """A ``{"<peer index>": value}`` map: keys decimal GPU indices, values among ``allowed``."""
    for key, item in value.items():
        if not (key.isdigit() and int(key) < MAX_GPUS):
            raise ValueError(f"key {key!r} is not a GPU index (0 .. {MAX_GPUS - 1})")
        if item not in allowed:
            raise ValueError(f"{key}: {item} is not {what} ({', '.join(map(str, allowed))})")
    return value


def _bus_id(value: str | None) -> str | None:
    if value is not None and pci_bdf(value) is None:
        raise ValueError(f"{value!r} is not a PCI bus id (NVML form '00000000:3B:00.0')")
    return value


class NvLinkFact(_Model):
    """One entry of a device's ``nvlinks`` (version 3): ``link`` its number, ``state``
    (``nvmlDeviceGetNvLinkState``: 1 enabled), ``remote_pci_bus_id``
    (``nvmlDeviceGetNvLinkRemotePciInfo_v2``, NVML's ``busId`` form), ``remote_device_type``
    (``nvmlDeviceGetNvLinkRemoteDeviceType``: 0 GPU, 1 IBM NPU, 2 NVSwitch, 255 unknown)."""

    link: int = Field(ge=0, lt=NVLINK_MAX_LINKS)
    state: int = Field(ge=0, le=1)
    remote_pci_bus_id: str | None = None
    remote_device_type: int | None = None

    @field_validator("remote_pci_bus_id")
    @classmethod
    def _remote(cls, value: str | None) -> str | None:
        return _bus_id(value)

    @field_validator("remote_device_type")
    @classmethod
    def _remote_type(cls, value: int | None) -> int | None:
        if value is not None and value not in (0, 1, 2, 255):
            raise ValueError(f"{value} is not an nvmlIntNvLinkDeviceType_t (0, 1, 2, 255)")
        return value


class FabricFact(_Model):
    """A device's ``fabric`` (version 3): ``nvmlDeviceGetGpuFabricInfoV``'s ``clusterUuid``,
    ``cliqueId``, ``state`` (``nvmlGpuFabricState_t``: 3 completed) and ``status``
    (``nvmlReturn_t``: 0 success)."""

    cluster_uuid: str = Field(min_length=1, max_length=64)
    clique_id: int = Field(ge=0)
    state: int = Field(ge=0, le=3)
    status: int = Field(ge=0)


class TraceDevice(_Model):
    index: int = Field(ge=0)
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    architecture: int | None = None
    cuda_compute_capability: list[int] | None = Field(default=None, min_length=2, max_length=2)
    mig_mode: list[int] | None = Field(default=None, min_length=2, max_length=2)
    max_mig_device_count: int | None = None
    mig_devices: list[MigDevice] = Field(default_factory=list)
    # version 3: the GPU's place on the node (docs/trace-format.md), every key optional
    topology: dict[str, int] | None = None
    numa_node: int | None = Field(default=None, ge=-1)
    cpu_affinity: list[int] | None = Field(default=None, max_length=MAX_CPU_WORDS)
    pcie_root: str | None = Field(default=None, pattern=r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
    nvlinks: list[NvLinkFact] | None = Field(default=None, max_length=NVLINK_MAX_LINKS)
    p2p_read: dict[str, int] | None = None
    fabric: FabricFact | None = None

    @field_validator("topology")
    @classmethod
    def _topology(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        if value is None:
            return None
        return _peer_map(value, tuple(LEVEL_NAMES), "an NVML_TOPOLOGY_* level")

    @field_validator("p2p_read")
    @classmethod
    def _p2p(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        if value is None:
            return None
        return _peer_map(value, tuple(range(7)), "an nvmlGpuP2PStatus_t")

    @field_validator("cpu_affinity")
    @classmethod
    def _words(cls, value: list[int] | None) -> list[int] | None:
        for k, word in enumerate(value or ()):
            if not 0 <= word < 1 << 64:
                raise ValueError(f"word {k}: {word} is not a 64-bit CPU mask word")
        return value

    @field_validator("nvlinks")
    @classmethod
    def _links(cls, value: list[NvLinkFact] | None) -> list[NvLinkFact] | None:
        seen: set[int] = set()
        for i, link in enumerate(value or ()):
            if link.link in seen:
                raise ValueError(f"nvlinks[{i}]: link {link.link} appears twice")
            seen.add(link.link)
        return value


class Trace(_Model):
    """A whole trace document (format: ``docs/trace-format.md``)."""

    format_version: int = 1
    samples: list[Sample] = Field(min_length=1)
    devices: list[TraceDevice] = Field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    interval_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> Trace:
        if self.format_version not in FORMAT_VERSIONS:
            raise ValueError(
                f"format_version {self.format_version} is not one this reader replays "
                f"({', '.join(map(str, FORMAT_VERSIONS))})"
            )
        for i in range(1, len(self.samples)):
            if self.samples[i].t < self.samples[i - 1].t:
                raise ValueError(
                    f"samples must be in order of 't': samples[{i}].t={self.samples[i].t} "
                    f"comes after samples[{i - 1}].t={self.samples[i - 1].t}"
                )
        return self


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part[:1].isupper() or part in {"int", "float", "str", "bool", "none"} or "[" in part:
            continue  # union member tags pydantic adds to the location
        else:
            out += ("." if out else "") + part
    return out or "(top level)"


def load_trace(path: Path | str) -> Trace:
    """Read and validate a trace file. Raises ``TraceError`` (file and place named)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_TRACE_BYTES:
            raise TraceError(
                f"{path}: {size // MIB} MiB is larger than a trace can be "
                f"({MAX_TRACE_BYTES // MIB} MiB): record a shorter one"
            )
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not UTF-8 text: byte {exc.start}: {exc.reason}") from None
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"{path}: not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    if not isinstance(raw, dict):
        raise TraceError(f"{path}: (top level): expected a JSON object")
    version = raw.get("format_version", 1)
    if version not in FORMAT_VERSIONS:  # before the fields: a newer format fails as such
        raise TraceError(
            f"{path}: format_version: {version!r} is not a version this reader replays "
            f"({', '.join(map(str, FORMAT_VERSIONS))}); upgrade omaticaya"
        )
    try:
        return Trace.model_validate(raw)
    except ValidationError as exc:
        seen: list[str] = []
        for err in exc.errors():
            if "NvmlErr" in err["loc"] and err["type"] == "missing":
                continue  # the other branch of "value | {nvml_error}" says what is wrong
            line = f"{path}: {_where(err['loc'])}: {err['msg'].removeprefix('Value error, ')}"
            if line not in seen:
                seen.append(line)
        raise TraceError("\n".join(seen[:5])) from None

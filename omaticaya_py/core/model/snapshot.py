"""Frozen models of one reading of a node's GPUs.

A reader (``nvml.NvmlReader`` on real hardware, ``replay.TraceReader`` over a recorded trace)
turns NVML's answers into these plain values once per tick; everything downstream (health,
render, diff, metrics, ``show``) reads only these. Units are in the field names: ``_mib`` is
MiB (2**20 bytes), ``_pct`` percent 0-100, ``_c`` degrees Celsius, ``_w`` watts, ``_s`` seconds.
``None`` means "not available": the field was NotSupported or could not be read; it is never
a fault on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from .topology import NodeTopology

__all__ = [
    "ARCHITECTURES",
    "GpuProcess",
    "GpuReading",
    "MigReading",
    "NodeSnapshot",
    "Reader",
    "XidEvent",
    "mig_profile_name",
]

#: NVML ``nvmlDeviceGetArchitecture`` enum (``NVML_DEVICE_ARCH_*``) -> lower-case family name,
#: as NVIDIA GPU Feature Discovery writes ``nvidia.com/gpu.family`` (which it derives from the
#: compute capability: 8.9 is ``ada-lovelace``, NVML's ``NVML_DEVICE_ARCH_ADA``), so that a
#: selector copied from GFD matches ours.
ARCHITECTURES: dict[int, str] = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada-lovelace",
    9: "hopper",
    10: "blackwell",
    13: "rubin",
}


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on a GPU or MIG device: ``nvmlDeviceGetComputeRunningProcesses`` on its
    handle (``pid`` in the host's PID namespace; ``usedGpuMemory`` bytes -> MiB, rounded down;
    ``None`` where NVML does not report it)."""

    pid: int
    used_memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical Xid error NVML delivered for one GPU.

    Source: an NVML event set with ``nvmlEventTypeXidCriticalError`` (``eventData`` is the Xid),
    or a trace sample's ``xid_events``. ``at_s`` is on the reader's clock (see
    ``NodeSnapshot.clock_s``).
    """

    index: int
    xid: int
    at_s: float
    uuid: str | None = None  # the GPU's UUID when known: indices shift when a GPU is gone


def mig_profile_name(
    gpu_instance_slices: int,
    compute_instance_slices: int,
    memory_size_mib: int,
    parent_total_bytes: int,
) -> str:
    """The MIG profile name NVIDIA's tools use (``1g.10gb``, ``3g.40gb``, ``1c.3g.40gb``).

    Inputs are ``nvmlDeviceGetAttributes_v2`` on the MIG handle (``gpuInstanceSliceCount``,
    ``computeInstanceSliceCount``, ``memorySizeMB``, which is MiB) and the parent GPU's total
    memory in bytes (``nvmlDeviceGetMemoryInfo``). The memory part is the instance's share of
    the GPU rounded up to eighths, times the GPU's memory in whole GiB (rounded up), to the
    nearest integer, a half up (Go's ``math.Round``, as NVIDIA's go-nvlib names them; Python's
    ``round`` takes a half to even): an H100 80GB's 9984 MiB instance is ``10gb``, half of an
    H200's 141 GiB ``71gb``. Raises ``ValueError`` for a non-positive slice count or parent
    memory.
    """
    if gpu_instance_slices <= 0 or compute_instance_slices <= 0 or parent_total_bytes <= 0:
        raise ValueError("MIG slice counts and the parent's memory must be positive")
    gib = 1 << 30
    share = math.ceil(memory_size_mib * (1 << 20) / parent_total_bytes * 8) / 8
    memory_gb = math.floor(share * -(-parent_total_bytes // gib) + 0.5)  # eighths: exact
    name = f"{gpu_instance_slices}g.{memory_gb}gb"
    if compute_instance_slices != gpu_instance_slices:
        name = f"{compute_instance_slices}c.{name}"
    return name


@dataclass(frozen=True, slots=True)
class MigReading:
    """One MIG device (a GPU instance + compute instance) of a MIG-enabled GPU, at one moment.

    A schedulable unit of its own: ``uuid`` is ``MIG-...``; ``index`` is its slot on the parent
    (``nvmlDeviceGetMigDeviceHandleByIndex``); ``profile`` is ``mig_profile_name`` of its
    ``nvmlDeviceGetAttributes_v2``. Memory is ``nvmlDeviceGetMemoryInfo`` on the MIG handle
    (bytes -> MiB, rounded down); ``process_count`` is
    ``nvmlDeviceGetComputeRunningProcesses_v3`` on the MIG handle. NVML has no utilisation per
    MIG device. ``error`` is set (the ``pynvml`` exception class name) when it could not be read.
    """

    index: int
    uuid: str | None = None
    profile: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    memory_free_mib: int | None = None
    process_count: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one moment.

    When ``error`` is set (the name of the ``pynvml`` exception class, e.g.
    ``"NVMLError_GpuIsLost"``), the GPU could not be read and only ``index`` (and the static
    facts known from earlier reads) are meaningful.

    Sources on real NVML: ``nvmlDeviceGetName``, ``nvmlDeviceGetUUID``,
    ``nvmlDeviceGetArchitecture``, ``nvmlDeviceGetCudaComputeCapability``,
    ``nvmlDeviceGetMemoryInfo`` (total/free/used, bytes -> MiB, rounded down),
    ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)`` averaged since the previous read
    (``utilization_pct``), ``nvmlDeviceGetUtilizationRates`` (``memory_utilization_pct``),
    ``nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)``, ``nvmlDeviceGetPowerUsage`` (mW -> W),
    ``nvmlDeviceGetTotalEccErrors(..., NVML_VOLATILE_ECC)``, ``nvmlDeviceGetRemappedRows``,
    ``nvmlDeviceGetComputeRunningProcesses`` (``process_count``, and each process's PID and
    used memory in ``processes``), ``nvmlDeviceGetPerformanceState``.

    GPM (GPU Performance Monitoring, Hopper and newer: ``nvmlGpmQueryDeviceSupport``): the
    reader keeps one ``nvmlGpmSampleGet`` sample per GPU and each read takes the next, so
    ``nvmlGpmMetricsGet`` between the two gives the interval's means: ``sm_active_pct``
    (``NVML_GPM_METRIC_SM_UTIL``: the share of SMs busy, DCGM's ``SM_ACTIVE``),
    ``tensor_active_pct`` (``NVML_GPM_METRIC_ANY_TENSOR_UTIL``) and ``dram_bw_pct``
    (``NVML_GPM_METRIC_DRAM_BW_UTIL``). Where GPM is supported ``utilization_pct`` is
    ``sm_active_pct`` (``nvmlDeviceGetSamples`` is not called: 2.35-2.8 ms a GPU on an H100);
    the first read after an ``nvmlInit`` has no earlier sample and takes
    ``nvmlDeviceGetUtilizationRates``. ``None`` (absent, never 0) where GPM is not supported
    (pre-Hopper, MIG on, vGPU) or the metric could not be read.

    MIG: ``mig_enabled`` is ``nvmlDeviceGetMigMode``'s current mode (``None`` where the GPU
    cannot do MIG); with it on, ``mig_devices`` holds the GPU's MIG devices (the schedulable
    units) and ``utilization_pct`` is ``None`` (NVML has none with MIG on), while memory,
    temperature, power, ECC and remapped rows stay the whole GPU's.
    """

    index: int
    uuid: str | None = None
    product: str | None = None
    architecture: str | None = None
    compute_major: int | None = None
    compute_minor: int | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    memory_free_mib: int | None = None
    utilization_pct: float | None = None
    memory_utilization_pct: float | None = None
    sm_active_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_bw_pct: float | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    performance_state: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_volatile: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    process_count: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    mig_enabled: bool | None = None
    mig_devices: tuple[MigReading, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """Every GPU of the node at one tick.

    - ``read_at``: wall-clock time of the read (UTC, timezone-aware).
    - ``clock_s``: the reader's own clock in seconds (monotonic on NVML, trace time on replay);
      Xid ``at_s`` and health windows use it.
    - ``error``: set when the library itself could not be read (``NVMLError_DriverNotLoaded``,
      ``NVMLError_LibraryNotFound``, ...): then ``gpus`` is empty and health is Unknown.
    - ``xid_events``: critical Xid events delivered since the previous read.
    - ``driver_version``: the display driver's version, ``nvmlSystemGetDriverVersion`` as NVML
      gives it (text, ``"580.65.06"``).
    - ``cuda_driver_version``: the CUDA version the driver supports,
      ``nvmlSystemGetCudaDriverVersion_v2`` (``13000``) as (major, minor): ``(13, 0)``.
    - ``topology``: how the GPUs are wired (``core.model.topology.NodeTopology``), read once per
      ``nvmlInit`` (the same object in every snapshot of that session) or from a trace of
      format version 3; ``None``: not known (an older trace, or NVML could not say).
    """

    read_at: datetime
    clock_s: float
    gpus: tuple[GpuReading, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: tuple[int, int] | None = None
    error: str | None = None
    xid_events: tuple[XidEvent, ...] = field(default=())
    source: str = "nvml"
    topology: NodeTopology | None = None


class Reader(Protocol):
    """What the agent reads GPUs through: NVML or a recorded trace.

    ``read()`` never raises for an NVML failure: a failed GPU or library is reported in the
    snapshot (``GpuReading.error``, ``NodeSnapshot.error``) so that health can say so.
    """

    def read(self) -> NodeSnapshot: ...

    def close(self) -> None: ...

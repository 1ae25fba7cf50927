"""Frozen models of one reading of a node's GPUs.

A reader (``nvml.NvmlReader`` on real hardware, ``replay.TraceReader`` over a recorded trace)
turns NVML's answers into these plain values once per tick; everything downstream (health,
render, diff, metrics, ``show``) reads only these. Units are in the field names: ``_mib`` is
MiB (2**20 bytes), ``_pct`` percent 0-100, ``_c`` degrees Celsius, ``_w`` watts, ``_s`` seconds.
``None`` means "not available": the field was NotSupported or could not be read; it is never
a fault on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

__all__ = ["GpuReading", "NodeSnapshot", "Reader", "XidEvent", "ARCHITECTURES"]

#: NVML ``nvmlDeviceGetArchitecture`` enum (``NVML_DEVICE_ARCH_*``) -> lower-case family name.
ARCHITECTURES: dict[int, str] = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
    13: "rubin",
}


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
    ``nvmlDeviceGetComputeRunningProcesses`` (count), ``nvmlDeviceGetPerformanceState``.
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
    temperature_c: int | None = None
    power_w: float | None = None
    performance_state: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_volatile: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    process_count: int | None = None
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
    - ``cuda_driver_version``: ``nvmlSystemGetCudaDriverVersion_v2`` as (major, minor).
    """

    read_at: datetime
    clock_s: float
    gpus: tuple[GpuReading, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: tuple[int, int] | None = None
    error: str | None = None
    xid_events: tuple[XidEvent, ...] = field(default=())
    source: str = "nvml"


class Reader(Protocol):
    """What the agent reads GPUs through: NVML or a recorded trace.

    ``read()`` never raises for an NVML failure: a failed GPU or library is reported in the
    snapshot (``GpuReading.error``, ``NodeSnapshot.error``) so that health can say so.
    """

    def read(self) -> NodeSnapshot: ...

    def close(self) -> None: ...

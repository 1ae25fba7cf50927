"""Trace reader: replays a recorded NVML trace (format version 1, 2 or 3, see
``docs/trace-format.md``) as if it were NVML.

Same interface as ``nvml.NvmlReader``: ``read() -> NodeSnapshot``. A trace is validated once at
load with pydantic; a bad one raises ``TraceError`` naming the file and the place
(``samples[3].gpus[0].index: Field required``). Any number of GPUs replays; errors are replayed
as recorded (a field's ``nvml_error`` becomes ``None`` = absent, a GPU's becomes
``GpuReading.error``, a sample's becomes ``NodeSnapshot.error``).

Time: ``at_s`` pins the trace time (``once``/``show --trace-at``); otherwise trace time follows
the wall clock from the first read, looping at the end. Utilisation is the mean of the samples
since the previous read (on the first read: over ``window_s``). GPM (a reading's ``gpm``
object): ``sm_active_pct``, ``tensor_active_pct`` and ``dram_bw_pct`` are the time-weighted
means over the same samples (sample k weighing ``t[k] - t[k-1]``, its value covering that
interval), present only where every one of them has the metric (as the test library's
``nvmlGpmMetricsGet`` answers), and ``utilization_pct`` is then ``sm_active_pct``, as the NVML
reader does where GPM is supported; a trace without ``gpm`` replays as before. Xid events are those of the
samples since the previous read (on the first read: every one up to the trace time).

Version 2 adds MIG: a device's ``mig_devices`` (static facts and ``attributes``) and, per
sample, each MIG device's memory and processes; the profile name is derived from the
attributes (``snapshot.mig_profile_name``). A version this reader does not know is refused.

Version 3 adds topology to ``devices[]`` (``topology``, ``numa_node``, ``cpu_affinity``,
``pcie_root``, ``nvlinks``, ``p2p_read``, ``fabric``): built once at load into one
``NodeTopology`` (``sources.trace_topology.trace_topology``), carried as
``NodeSnapshot.topology`` by every snapshot whose sample has GPUs (as the NVML reader reads it
once per ``nvmlInit``; a sample where NVML itself failed has none). A trace without those keys
replays with ``topology`` ``None``.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..core.model.snapshot import (
    ARCHITECTURES,
    GpuProcess,
    GpuReading,
    MigReading,
    NodeSnapshot,
    XidEvent,
    mig_profile_name,
)
from .trace import MIB, GpmSample, GpuSample, NvmlErr, TraceDevice, TraceError, load_trace
from .trace_topology import trace_topology

__all__ = ["TraceError", "TraceReader", "load_trace"]


def _ok(value: Any) -> Any:
    return None if isinstance(value, NvmlErr) else value


def _processes(procs: Any) -> tuple[GpuProcess, ...]:
    """The trace's ``compute_processes`` (``pid``, ``usedGpuMemory`` bytes) as processes."""
    return tuple(
        GpuProcess(p.pid, p.usedGpuMemory // MIB if p.usedGpuMemory is not None else None)
        for p in procs or ()
    )


def _mig_readings(
    sample: GpuSample, device: TraceDevice | None, parent_total: int | None
) -> tuple[MigReading, ...]:
    facts = {m.index: m for m in device.mig_devices} if device is not None else {}
    out = []
    for m in sample.mig_devices:
        fact = facts.get(m.index)
        static: dict[str, Any] = {}
        if fact is not None:
            attrs = fact.attributes
            profile = None
            if attrs is not None and parent_total:
                profile = mig_profile_name(
                    attrs.gpu_instance_slice_count,
                    attrs.compute_instance_slice_count,
                    attrs.memory_size_mb,
                    parent_total,
                )
            static = {
                "uuid": fact.uuid,
                "profile": profile,
                "gpu_instance_id": fact.gpu_instance_id,
                "compute_instance_id": fact.compute_instance_id,
            }
        if m.nvml_error is not None:
            out.append(MigReading(index=m.index, error=m.nvml_error, **static))
            continue
        mem = _ok(m.memory_bytes)
        procs = _ok(m.compute_processes)
        out.append(
            MigReading(
                index=m.index,
                memory_total_mib=mem.total // MIB if mem else None,
                memory_used_mib=mem.used // MIB if mem else None,
                memory_free_mib=mem.free // MIB if mem else None,
                process_count=len(procs) if procs is not None else None,
                processes=_processes(procs),
                **static,
            )
        )
    return tuple(out)


#: the GPM metrics a reading carries, in ``_Frame.gpm``'s order
GPM_FIELDS = ("sm_active_pct", "tensor_active_pct", "dram_bw_pct")
_Gpm = tuple[float | None, float | None, float | None]


def _gpm(sample: GpuSample) -> _Gpm | None:
    """A reading's GPM metrics (clamped 0-100; a failed or absent metric ``None``), or ``None``
    where the GPU has no GPM in this sample."""
    g = sample.gpm
    if sample.nvml_error is not None or not isinstance(g, GpmSample) or not g.supported:
        return None
    out = []
    for name in GPM_FIELDS:
        value = _ok(getattr(g, name))
        out.append(min(100.0, max(0.0, float(value))) if value is not None else None)
    return (out[0], out[1], out[2])


def _reading(sample: GpuSample, device: TraceDevice | None) -> GpuReading:
    static: dict[str, Any] = {}
    if device is not None and device.mig_mode is not None:
        static["mig_enabled"] = bool(device.mig_mode[0])
    if device is not None:
        cc = device.cuda_compute_capability
        static |= {
            "uuid": device.uuid,
            "product": device.name,
            "architecture": ARCHITECTURES.get(device.architecture or -1),
            "compute_major": cc[0] if cc else None,
            "compute_minor": cc[1] if cc else None,
        }
    if sample.nvml_error is not None:
        return GpuReading(index=sample.index, error=sample.nvml_error, **static)
    mem = _ok(sample.memory_bytes)
    util = _ok(sample.utilization_pct)
    remap = _ok(sample.remapped_rows)
    procs = _ok(sample.compute_processes)
    temp = _ok(sample.temperature_c)
    power = _ok(sample.power_mw)
    migs: tuple[MigReading, ...] = ()
    if static.get("mig_enabled"):
        migs = _mig_readings(sample, device, mem.total if mem else None)
    gpm = _gpm(sample) or (None, None, None)
    return GpuReading(
        sm_active_pct=gpm[0],
        tensor_active_pct=gpm[1],
        dram_bw_pct=gpm[2],
        mig_devices=migs,
        index=sample.index,
        memory_total_mib=mem.total // MIB if mem else None,
        memory_used_mib=mem.used // MIB if mem else None,
        memory_free_mib=mem.free // MIB if mem else None,
        utilization_pct=gpm[0] if gpm[0] is not None else (util.gpu if util else None),
        memory_utilization_pct=util.memory if util else None,
        temperature_c=int(temp) if temp is not None else None,
        power_w=power / 1000.0 if power is not None else None,
        performance_state=_ok(sample.performance_state),
        ecc_uncorrected_volatile=_ok(sample.ecc_uncorrected_volatile),
        ecc_corrected_volatile=_ok(sample.ecc_corrected_volatile),
        remapped_rows_pending=bool(remap.pending) if remap else None,
        remapped_rows_failure=bool(remap.failure) if remap else None,
        process_count=len(procs) if procs is not None else None,
        processes=_processes(procs),
        **static,
    )


@dataclass(frozen=True)
class _Frame:
    t: float
    gpus: tuple[GpuReading, ...]
    error: str | None
    xids: tuple[tuple[int, int, str | None], ...]  # (GPU index, Xid, GPU UUID)
    util_pct: dict[int, float]  # classic utilisation (``utilization_pct.gpu``) by GPU index
    gpm: dict[int, _Gpm]  # GPM metrics by GPU index, GPUs with GPM in this sample only
    weight: float  # t[k] - t[k-1]: the interval this sample's GPM values cover


class TraceReader:
    """``Reader`` over a trace file.

    - ``at_s``: fixed trace time in seconds (the latest sample with ``t <= at_s`` is read).
    - ``window_s``: utilisation averaging window of the first read.
    - ``clock``: seconds, monotonic; trace time = ``speed * (clock() - first read)``, looping.
    Raises ``TraceError`` at construction for a bad trace.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        at_s: float | None = None,
        window_s: float = 10.0,
        loop: bool = True,
        speed: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = Path(path)
        trace = load_trace(self.path)
        devices = {d.index: d for d in trace.devices}
        v = trace.cuda_driver_version
        self.driver_version = trace.driver_version
        #: the node's topology (format version 3), one object for every snapshot; ``None``: none
        self.topology = trace_topology(trace.devices)
        self.cuda_driver_version = (v // 1000, (v % 1000) // 10) if v else None
        self.frames = tuple(
            _Frame(
                t=s.t,
                gpus=tuple(_reading(g, devices.get(g.index)) for g in (s.gpus or ())),
                error=s.nvml_error,
                xids=tuple(
                    (x.index, x.xid, getattr(devices.get(x.index), "uuid", None))
                    for x in s.xid_events
                ),
                util_pct={},
                gpm={},
                weight=0.0,
            )
            for s in trace.samples
        )
        self._times = [f.t for f in self.frames]
        last = self.frames[-1].t
        self.period_s = last + (trace.interval_s or (last / max(len(self.frames) - 1, 1)) or 1.0)
        for k, (frame, s) in enumerate(zip(self.frames, trace.samples, strict=True)):
            for g in s.gpus or ():
                util = _ok(g.utilization_pct) if g.nvml_error is None else None
                if util is not None:
                    frame.util_pct[g.index] = util.gpu
                gpm = _gpm(g)
                if gpm is not None:
                    frame.gpm[g.index] = gpm
            # the first sample of a loop covers the time since the previous loop's last one
            prev = self._times[k - 1] if k else self._times[-1] - self.period_s
            object.__setattr__(frame, "weight", max(frame.t - prev, 0.0))
        self.at_s = at_s
        self.window_s = window_s
        self.loop = loop
        self.speed = speed
        self.clock = clock
        self._start: float | None = None
        self._prev_s: float | None = None  # unwrapped trace time of the previous read
        self._averaged: dict[tuple[GpuReading, float | None, _Gpm], GpuReading] = {}

    def _frames_between(self, lo: float, hi: float) -> list[tuple[float, _Frame]]:
        """Frames with unwrapped time in (lo, hi], as (unwrapped time, frame)."""
        out: list[tuple[float, _Frame]] = []
        if hi < lo:
            return out
        if not self.loop:
            i, j = bisect.bisect_right(self._times, lo), bisect.bisect_right(self._times, hi)
            return [(f.t, f) for f in self.frames[i:j]]
        cycle = int(max(lo, 0.0) // self.period_s)
        while cycle * self.period_s <= hi:
            base = cycle * self.period_s
            i = bisect.bisect_right(self._times, lo - base) if lo >= base else 0
            j = bisect.bisect_right(self._times, hi - base)
            out.extend((base + f.t, f) for f in self.frames[i:j])
            cycle += 1
        return out

    def now_s(self) -> float:
        """Current unwrapped trace time in seconds."""
        if self.at_s is not None:
            return self.at_s
        now = self.clock()
        if self._start is None:
            self._start = now
        return (now - self._start) * self.speed

    def read(self) -> NodeSnapshot:
        """The snapshot at the current trace time (see the class docstring)."""
        now = self.now_s()
        wrapped = now % self.period_s if self.loop else now
        i = max(bisect.bisect_right(self._times, wrapped) - 1, 0)
        frame = self.frames[i]
        first = self._prev_s is None
        lo = (now - self.window_s) if self._prev_s is None else self._prev_s
        window = self._frames_between(lo, now)
        # Xid events: every one up to now on the first read, else those of the same window
        xid_frames = self._frames_between(-1.0, now) if first else window
        events = tuple(
            XidEvent(index=idx, xid=xid, at_s=t, uuid=uuid)
            for t, f in xid_frames
            for idx, xid, uuid in f.xids
        )
        self._prev_s = now
        read_at = datetime.now(timezone.utc)
        if frame.error is not None:
            return NodeSnapshot(
                read_at=read_at,
                clock_s=now,
                error=frame.error,
                xid_events=events,
                source=f"trace:{self.path.name}",
            )
        gpus = frame.gpus
        if len(window) > 1:
            gpus = self._mean_utilization(gpus, window)
        return NodeSnapshot(
            read_at=read_at,
            clock_s=now,
            gpus=gpus,
            driver_version=self.driver_version,
            cuda_driver_version=self.cuda_driver_version,
            xid_events=events,
            source=f"trace:{self.path.name}",
            topology=self.topology,
        )

    def _mean_utilization(
        self, gpus: tuple[GpuReading, ...], window: list[tuple[float, _Frame]]
    ) -> tuple[GpuReading, ...]:
        """``gpus`` with ``utilization_pct`` replaced by the mean over ``window`` (GPUs with an
        error, or with no utilisation in the window, unchanged), and the GPM metrics by their
        time-weighted means where every sample of the window has GPM for the GPU (else
        ``None``); ``utilization_pct`` is then ``sm_active_pct`` where that is present.

        One pass over the window for all GPUs; the averaged reading is remembered per (recorded
        reading, mean), so that a steady trace builds no new object (bench/tick.py)."""
        values: dict[int, list[float]] = {}
        for _, f in window:
            for index, value in f.util_pct.items():
                got = values.get(index)
                if got is None:
                    values[index] = [value]
                else:
                    got.append(value)
        memo = self._averaged
        out = []
        for gpu in gpus:
            seen = values.get(gpu.index)
            gpm = self._mean_gpm(gpu.index, window)
            if gpu.error is not None or (not seen and gpm is None and gpu.sm_active_pct is None):
                out.append(gpu)
                continue
            mean = sum(seen) / len(seen) if seen else gpu.utilization_pct
            fields = gpm or (None, None, None)
            if fields[0] is not None:
                mean = fields[0]
            key = (gpu, mean, fields)  # a frozen reading: hashed by value
            averaged = memo.get(key)
            if averaged is None:
                if len(memo) >= 4096:
                    memo.clear()
                averaged = memo[key] = replace(
                    gpu,
                    utilization_pct=mean,
                    sm_active_pct=fields[0],
                    tensor_active_pct=fields[1],
                    dram_bw_pct=fields[2],
                )
            out.append(averaged)
        return tuple(out)

    @staticmethod
    def _mean_gpm(index: int, window: list[tuple[float, _Frame]]) -> _Gpm | None:
        """The time-weighted GPM means of GPU ``index`` over ``window``; ``None`` unless every
        sample of it has GPM for the GPU. Each metric is the mean over the samples that have
        it (a recording's first sample has none: GPM needs a previous sample; a metric NVML
        failed on leaves that sample out), ``None`` when none of them has it."""
        sums = [0.0, 0.0, 0.0]
        weights = [0.0, 0.0, 0.0]
        latest: list[float | None] = [None, None, None]
        for _, f in window:
            g = f.gpm.get(index)
            if g is None:
                return None
            for i, value in enumerate(g):
                if value is not None:
                    sums[i] += f.weight * value
                    weights[i] += f.weight
                    latest[i] = value
        # samples at one instant (no weight): the latest value each metric has
        means = [sums[i] / weights[i] if weights[i] > 0.0 else latest[i] for i in range(3)]
        return (means[0], means[1], means[2])

    def close(self) -> None:
        """Nothing to release; present for the ``Reader`` interface."""

"""Render: a snapshot and its health -> the labels and annotations the Node should carry.

Pure functions, no I/O. Every key is ``<prefix>/<name>``; every value is checked against the
Kubernetes label-value rules and a bad one is dropped (and reported in ``Desired.dropped``),
never sent. Numbers are integers so that ``nodeAffinity`` ``Gt``/``Lt`` work on them, and are
quantised (memory rounded down to ``memory_step_mib``, utilisation rounded to
``utilization_step_pct``) so that noise does not turn into API writes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..allocation.slice_use import slice_room_mib
from ..model.labelvalues import (
    is_valid_key,
    is_valid_value,
    quantise_down,
    quantise_nearest,
    sanitise_value,
    stable_down,
    stable_nearest,
)
from ..model.sharing import SharedGpus, Sharing, is_shared
from ..model.snapshot import NodeSnapshot
from ..rules.attribution import GpuAttribution, gpu_out_of_band_mib
from ..rules.health import NodeHealth, Unit
from ..schema import TELEMETRY, names
from ..schema.names import STATIC_NAMES, gpu_key, mig_key
from .render_telemetry import telemetry, telemetry_annotation, telemetry_document

__all__ = [
    "Desired",
    "RenderSettings",
    "STATIC_NAMES",
    "TELEMETRY",
    "driver_version_parts",
    "is_static",
    "is_valid_key",
    "is_valid_value",
    "quantise_down",
    "quantise_nearest",
    "render",
    "sanitise_value",
    "stable_down",
    "stable_nearest",
    "telemetry",
    "telemetry_annotation",
    "telemetry_document",
]

Labels = Mapping[str, str]

@dataclass(frozen=True)
class Desired:
    """What the Node should carry under the prefix: full keys -> values.

    ``dropped`` lists ``(key, value)`` pairs that failed validation and were left out.
    """

    labels: dict[str, str]
    annotations: dict[str, str]
    dropped: tuple[tuple[str, str], ...] = field(default=())


class RenderSettings(Protocol):
    """The values rendering reads: the agent's ``config.settings.Settings`` has them (each
    documented there; ``OMATICAYA_<NAME>``), and a test may pass any object that does. Pure
    rendering takes these, not the settings object, so that the publishing floor does not
    import the configuration above it."""

    @property
    def prefix(self) -> str: ...
    @property
    def hysteresis_pct(self) -> float: ...
    @property
    def memory_step_mib(self) -> int: ...
    @property
    def utilization_step_pct(self) -> int: ...
    @property
    def temperature_step_c(self) -> int: ...
    @property
    def idle_utilization_pct(self) -> float: ...
    @property
    def per_gpu_labels(self) -> bool: ...
    @property
    def temperature_labels(self) -> bool: ...
    @property
    def sm_active_labels(self) -> bool: ...
    @property
    def shared_gpus(self) -> SharedGpus: ...
    @property
    def share_unit_mib(self) -> int: ...


@dataclass(frozen=True, slots=True)
class _Tick:
    """One render's inputs: the reading, its health, the settings it reads, the previous
    tick's labels (for the hysteresis: ``down``, ``nearest``) and who uses each GPU."""

    snapshot: NodeSnapshot
    health: NodeHealth
    s: RenderSettings
    previous: Mapping[str, str]
    attribution: Mapping[str, GpuAttribution]

    def _before(self, name: str) -> int | None:
        value = self.previous.get(f"{self.s.prefix}/{name}")
        return int(value) if value is not None and value.isdigit() else None

    def down(self, name: str, raw: float, step: int) -> str:
        """``raw`` rounded down to ``step`` with the hysteresis against label ``name``."""
        margin = self.s.hysteresis_pct / 100 * step
        return str(stable_down(raw, step, self._before(name), margin))

    def nearest(self, name: str, raw: float, step: int) -> str:
        """``raw`` rounded to the nearest ``step`` with the hysteresis against ``name``."""
        margin = self.s.hysteresis_pct / 100 * step
        return str(stable_nearest(raw, step, self._before(name), margin))


def _node_labels(
    snapshot: NodeSnapshot,
    health: NodeHealth,
    s: RenderSettings,
    previous: Mapping[str, str],
    attribution: Mapping[str, GpuAttribution],
) -> dict[str, str]:
    out: dict[str, str] = {names.HEALTH: str(health.state)}
    if snapshot.error is not None:
        return out  # nothing else can be trusted: numbers would be stale
    t = _Tick(snapshot, health, s, previous, attribution)
    out.update(_hardware_labels(snapshot))
    # aggregates count schedulable units: whole GPUs, and MIG devices on GPUs with MIG on; a
    # shared GPU is no whole GPU (a pod asking for nvidia.com/gpu cannot get it): it has its own
    # label, the largest slice one shared GPU can take
    sharing = Sharing.of(s)
    shared = {g.index for g in snapshot.gpus if is_shared(g, sharing)}
    healthy = tuple(u for u in health.healthy_units if u.gpu_index not in shared or u.is_mig)
    out.update(_load_labels(t, healthy))
    out.update(_mig_labels(health.units, s, t.down))
    if shared:
        rooms = [
            room
            for g in snapshot.gpus
            if g.index in shared and g.error is None and health.gpus[g.index].healthy
            if (room := slice_room_mib(g, attribution.get(g.uuid or ""), s.share_unit_mib))
            is not None
        ]
        out[names.SHARED_MEMORY_FREE] = (
            t.down(names.SHARED_MEMORY_FREE, max(rooms), s.memory_step_mib) if rooms else "0"
        )
    if s.per_gpu_labels:
        out.update(_per_gpu_labels(t, healthy))
    return out


def _hardware_labels(snapshot: NodeSnapshot) -> dict[str, str]:
    """The GPU count, the most common product (and whether there are others), its family and
    compute capability, the driver and CUDA versions, the smallest GPU's memory."""
    gpus = snapshot.gpus
    out = {names.GPU_COUNT: str(len(gpus))}
    products = Counter(g.product for g in gpus if g.product)
    if products:
        product, _ = products.most_common(1)[0]
        out[names.PRODUCT] = sanitise_value(product)
        if len(products) > 1:
            out[names.PRODUCT_MIXED] = "true"
        ref = next(g for g in gpus if g.product == product)
        if ref.architecture:
            out[names.FAMILY] = ref.architecture
        if ref.compute_major is not None and ref.compute_minor is not None:
            out[names.COMPUTE_MAJOR] = str(ref.compute_major)
            out[names.COMPUTE_MINOR] = str(ref.compute_minor)
    out.update(_version_labels(snapshot))
    totals = [g.memory_total_mib for g in gpus if g.memory_total_mib is not None]
    if totals:
        out[names.MEMORY_TOTAL] = str(min(totals))
    return out


def _load_labels(t: _Tick, healthy: tuple[Unit, ...]) -> dict[str, str]:
    """The aggregates over the ``healthy`` schedulable units: free memory (most on one unit,
    and summed), lowest utilisation and SM activity, idle and healthy counts."""
    s, out = t.s, {}
    free = [u.memory_free_mib for u in healthy if u.memory_free_mib is not None]
    mem_step, util_step = s.memory_step_mib, s.utilization_step_pct
    out[names.MEMORY_FREE] = t.down(names.MEMORY_FREE, max(free), mem_step) if free else "0"
    out[names.MEMORY_FREE_TOTAL] = (
        t.down(names.MEMORY_FREE_TOTAL, sum(free), mem_step) if free else "0"
    )
    utils = [u.utilization_pct for u in healthy if u.utilization_pct is not None]
    if utils:
        # NVML can report a sample above 100 (rounding in the driver): never publish one
        out[names.UTILIZATION] = t.nearest(names.UTILIZATION, min(min(utils), 100.0), util_step)
    # GPM SM activity of each whole GPU that has it (``None`` elsewhere: never 0)
    sm_active = {
        g.index: g.sm_active_pct for g in t.snapshot.gpus if g.error is None and not g.mig_enabled
    }
    actives = [
        a for u in healthy if not u.is_mig and (a := sm_active.get(u.gpu_index)) is not None
    ]
    if actives:
        out[names.SM_ACTIVE] = t.nearest(names.SM_ACTIVE, min(min(actives), 100.0), util_step)
    out[names.IDLE_COUNT] = str(
        sum(1 for u in healthy if _idle(u, s.idle_utilization_pct, sm_active.get(u.gpu_index)))
    )
    out[names.HEALTHY_COUNT] = str(len(healthy))
    return out


def _per_gpu_labels(t: _Tick, healthy: tuple[Unit, ...]) -> dict[str, str]:
    """``gpu-N.*``: each GPU's health, and for a readable one its free memory (a MIG GPU's:
    its freest healthy MIG device), utilisation, SM activity (opt-in), out-of-band memory and
    temperature (opt-in)."""
    s, out = t.s, {}
    mem_step, util_step = s.memory_step_mib, s.utilization_step_pct
    mig_free: dict[int, list[int]] = {}
    for u in healthy:
        if u.is_mig and u.memory_free_mib is not None:
            mig_free.setdefault(u.gpu_index, []).append(u.memory_free_mib)
    for g in t.snapshot.gpus:
        def key(name: str, index: int = g.index) -> str:
            return gpu_key(index, name)

        out[key(names.GPU_HEALTH)] = str(t.health.gpus[g.index].state)
        if g.error is not None:
            continue
        if g.mig_enabled:
            out[key(names.GPU_MIG_ENABLED)] = "true"
            # a MIG GPU's free memory is that of its freest healthy MIG device: the most
            # one pod can get on it; no utilisation (NVML has none with MIG on)
            if g.index in mig_free:
                out[key(names.GPU_MEMORY_FREE)] = t.down(
                    key(names.GPU_MEMORY_FREE), max(mig_free[g.index]), mem_step
                )
        elif g.memory_free_mib is not None:
            out[key(names.GPU_MEMORY_FREE)] = t.down(key(names.GPU_MEMORY_FREE), g.memory_free_mib, mem_step)
        if g.utilization_pct is not None and not g.mig_enabled:
            out[key(names.GPU_UTILIZATION)] = t.nearest(
                key(names.GPU_UTILIZATION), min(g.utilization_pct, 100.0), util_step
            )
        if s.sm_active_labels and g.sm_active_pct is not None and not g.mig_enabled:
            out[key(names.GPU_SM_ACTIVE)] = t.nearest(
                key(names.GPU_SM_ACTIVE), min(g.sm_active_pct, 100.0), util_step
            )
        # processes in no pod (needs the host's /proc): only when there is some
        oob = gpu_out_of_band_mib(g, t.attribution)
        if oob and quantise_down(oob, mem_step) > 0:
            out[key(names.GPU_MEMORY_OUT_OF_BAND)] = str(quantise_down(oob, mem_step))
        # opt-in: it changes with load and no scheduler decides on it (telemetry has it)
        if s.temperature_labels and g.temperature_c is not None and g.temperature_c >= 0:
            out[key(names.GPU_TEMPERATURE)] = t.nearest(
                key(names.GPU_TEMPERATURE), g.temperature_c, s.temperature_step_c
            )
    return out


def driver_version_parts(version: str | None) -> tuple[str, str, str] | None:
    """The display driver's version (``nvmlSystemGetDriverVersion``) split as GPU Feature
    Discovery splits it: ``"580.65.06"`` -> ``("580", "65", "06")`` (text: the revision keeps
    its leading zero), ``"580.65"`` -> ``("580", "65", "")``; ``None`` for no version or one
    that is not ``X.Y[.Z]`` (GFD refuses those)."""
    if not version:
        return None
    parts = version.split(".")
    if not 2 <= len(parts) <= 3:
        return None
    return parts[0], parts[1], parts[2] if len(parts) == 3 else ""


def _version_labels(snapshot: NodeSnapshot) -> dict[str, str]:
    """The driver and CUDA versions under GPU Feature Discovery's current names and meanings:
    ``cuda.driver-version.{major,minor,revision,full}`` is the display driver's version
    (``nvmlSystemGetDriverVersion``: ``580``, ``65``, ``06``, ``580.65.06``),
    ``cuda.runtime-version.{major,minor,full}`` the CUDA version the driver supports
    (``nvmlSystemGetCudaDriverVersion_v2``, 13000: ``13``, ``0``, ``13.0``). Each set is absent
    when NVML did not give it (or gave a driver version that is not ``X.Y[.Z]``); the revision
    is absent for a driver version of two parts (GFD writes it empty: we write no empty value)."""
    out: dict[str, str] = {}
    driver = driver_version_parts(snapshot.driver_version)
    if driver is not None and snapshot.driver_version is not None:
        major, minor, revision = driver
        out[names.DRIVER_MAJOR], out[names.DRIVER_MINOR] = major, minor
        if revision:
            out[names.DRIVER_REVISION] = revision
        out[names.DRIVER_FULL] = snapshot.driver_version
    if snapshot.cuda_driver_version is not None:
        cuda_major, cuda_minor = snapshot.cuda_driver_version
        out[names.CUDA_MAJOR] = str(cuda_major)
        out[names.CUDA_MINOR] = str(cuda_minor)
        out[names.CUDA_FULL] = f"{cuda_major}.{cuda_minor}"
    return out


def _idle(unit: Unit, below_pct: float, sm_active_pct: float | None = None) -> bool:
    """No compute process, and (whole GPUs) busy under ``below_pct``: GPM SM activity where the
    GPU has it (``sm_active_pct``: a resident kernel that does nothing keeps classic utilisation
    near 100 but SM activity near 0), else utilisation; a MIG device has no utilisation in
    NVML, so no process is what idle means there."""
    if unit.process_count:
        return False
    if unit.is_mig:
        return unit.process_count == 0
    busy = sm_active_pct if sm_active_pct is not None else unit.utilization_pct
    return busy is not None and busy < below_pct


def _mig_labels(
    units: tuple[Unit, ...], s: RenderSettings, down: Callable[[str, float, int], str]
) -> dict[str, str]:
    """MIG labels, in GPU Feature Discovery's vocabulary: ``mig.strategy=mixed`` (each profile
    is its own resource, ``nvidia.com/mig-<profile>``), and per profile ``mig-<profile>.count``
    (MIG devices), ``.healthy-count``, ``.idle-count`` (healthy, no process) and
    ``.memory.free-mib`` (most free on one healthy device, rounded down). None without MIG."""
    by_profile: dict[str, list[Unit]] = {}
    for u in units:
        if u.is_mig and u.profile:
            by_profile.setdefault(u.profile, []).append(u)
    if not by_profile:
        return {}
    out = {names.MIG_STRATEGY: "mixed"}
    for profile, members in sorted(by_profile.items()):
        healthy = [u for u in members if u.healthy]
        out[mig_key(profile, names.MIG_COUNT)] = str(len(members))
        out[mig_key(profile, names.MIG_HEALTHY_COUNT)] = str(len(healthy))
        out[mig_key(profile, names.MIG_IDLE_COUNT)] = str(sum(1 for u in healthy if _idle(u, 0.0)))
        free = [u.memory_free_mib for u in healthy if u.memory_free_mib is not None]
        out[mig_key(profile, names.MIG_MEMORY_FREE)] = (
            down(mig_key(profile, names.MIG_MEMORY_FREE), max(free), s.memory_step_mib) if free else "0"
        )
    return out


def render(
    snapshot: NodeSnapshot,
    health: NodeHealth,
    settings: RenderSettings,
    previous: Mapping[str, str] | None = None,
    *,
    with_telemetry: bool = True,
    attribution: Mapping[str, GpuAttribution] | None = None,
) -> Desired:
    """Desired labels and annotations (full keys under ``settings.prefix``) for this snapshot.

    Labels follow the schema in docs/labels.md (node aggregates, static facts, per-GPU keys when
    ``per_gpu_labels``, their temperature only with ``temperature_labels``, their GPM SM
    activity only with ``sm_active_labels``); the one annotation
    is ``<prefix>/telemetry`` (left out when ``with_telemetry`` is false: the agent builds it
    only for a patch that carries it). Invalid
    keys or values are dropped and listed in ``Desired.dropped``. ``previous`` (the labels
    rendered last tick) turns on hysteresis for the rounded numbers (``settings.hysteresis_pct``).
    ``attribution`` (who uses each GPU, by UUID) adds ``gpu-N.memory.out-of-band-mib`` where
    processes in no pod hold memory, and goes into the telemetry. GPUs served as memory units
    (``settings.shared_gpus``, not MIG) are left out of the whole-GPU aggregates (free memory,
    utilisation, SM activity, idle and healthy counts) and give ``gpu.shared.memory.free-mib`` instead.
    """
    prefix = settings.prefix
    labels: dict[str, str] = {}
    dropped: list[tuple[str, str]] = []
    attribution = attribution or {}
    for name, value in _node_labels(snapshot, health, settings, previous or {}, attribution).items():
        key = f"{prefix}/{name}"
        if value and is_valid_key(key) and is_valid_value(value):
            labels[key] = value
        else:
            dropped.append((key, value))
    annotations: dict[str, str] = {}
    if with_telemetry:
        annotations, bad = telemetry_annotation(
            snapshot, health, prefix, attribution=attribution or None,
            sharing=Sharing.of(settings),
        )
        dropped.extend(bad)
    return Desired(labels=labels, annotations=annotations, dropped=tuple(dropped))


def is_static(key: str, prefix: str) -> bool:
    """True for a label key that names hardware facts (kept on graceful exit)."""
    return key.removeprefix(prefix + "/") in STATIC_NAMES


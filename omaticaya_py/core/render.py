"""Render: a snapshot and its health -> the labels and annotations the Node should carry.

Pure functions, no I/O. Every key is ``<prefix>/<name>``; every value is checked against the
Kubernetes label-value rules and a bad one is dropped (and reported in ``Desired.dropped``),
never sent. Numbers are integers so that ``nodeAffinity`` ``Gt``/``Lt`` work on them, and are
quantised (memory rounded down to ``memory_step_mib``, utilisation rounded to
``utilization_step_pct``) so that noise does not turn into API writes.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta, timezone

from .. import __version__
from .health import NodeHealth, Unit
from .schema import (
    COMPUTE_MAJOR,
    COMPUTE_MINOR,
    CUDA_MAJOR,
    CUDA_MINOR,
    FAMILY,
    GPU_COUNT,
    GPU_HEALTH,
    GPU_MEMORY_FREE,
    GPU_MIG_ENABLED,
    GPU_TEMPERATURE,
    GPU_UTILIZATION,
    HEALTH,
    HEALTHY_COUNT,
    IDLE_COUNT,
    MEMORY_FREE,
    MEMORY_FREE_TOTAL,
    MEMORY_TOTAL,
    MIG_COUNT,
    MIG_HEALTHY_COUNT,
    MIG_IDLE_COUNT,
    MIG_MEMORY_FREE,
    MIG_STRATEGY,
    PRODUCT,
    PRODUCT_MIXED,
    STATIC_NAMES,
    TELEMETRY,
    TELEMETRY_VERSION,
    UTILIZATION,
    gpu_key,
    mig_key,
)
from .settings import Settings
from .snapshot import NodeSnapshot

__all__ = [
    "Desired",
    "STATIC_NAMES",
    "TELEMETRY",
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
]

Labels = Mapping[str, str]

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_BAD_CHARS = re.compile(r"[^-A-Za-z0-9_.]+")
MAX_ANNOTATIONS_BYTES = 256 * 1024


def is_valid_key(key: str) -> bool:
    """True if ``key`` is a Kubernetes qualified name (``[prefix/]name``) usable as a label key."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _PREFIX.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_NAME.match(name))


def is_valid_value(value: str) -> bool:
    """True if ``value`` is a valid label value: at most 63 characters of ``[-A-Za-z0-9_.]``,
    starting and ending alphanumeric (or empty)."""
    return len(value) <= 63 and bool(_VALUE.match(value))


def sanitise_value(text: str) -> str:
    """Turn free text (an NVML product name) into a label value: runs of other characters
    become ``-``, the ends are trimmed to alphanumerics, at most 63 characters.

    ``"NVIDIA H100 80GB HBM3"`` -> ``"NVIDIA-H100-80GB-HBM3"``.
    """
    value = _BAD_CHARS.sub("-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def quantise_down(value: float, step: int) -> int:
    """``value`` rounded down to a multiple of ``step`` (memory: a label never promises more)."""
    return int(value // step) * step


def quantise_nearest(value: float, step: int) -> int:
    """``value`` rounded half up to the nearest multiple of ``step`` (utilisation)."""
    if isinstance(value, int):  # exact for any size
        return (2 * value + step) // (2 * step) * step
    return int((value + step / 2) // step) * step


def stable_down(raw: float, step: int, previous: int | None, margin: float) -> int:
    """``quantise_down`` with hysteresis: the value drops as soon as the reading does (a label
    never promises more free memory than there is) but rises only once the reading passes the
    next step edge by ``margin``."""
    value = quantise_down(raw, step)
    if previous is None or value <= previous:
        return value
    return max(previous, quantise_down(raw - margin, step))


def stable_nearest(raw: float, step: int, previous: int | None, margin: float) -> int:
    """``quantise_nearest`` with hysteresis: the previous value is kept while the reading stays
    within half a step plus ``margin`` of it."""
    value = quantise_nearest(raw, step)
    if previous is None or value == previous or abs(raw - previous) >= step / 2 + margin:
        return value
    return previous


@dataclass(frozen=True)
class Desired:
    """What the Node should carry under the prefix: full keys -> values.

    ``dropped`` lists ``(key, value)`` pairs that failed validation and were left out.
    """

    labels: dict[str, str]
    annotations: dict[str, str]
    dropped: tuple[tuple[str, str], ...] = field(default=())


def _node_labels(
    snapshot: NodeSnapshot, health: NodeHealth, s: Settings, previous: Mapping[str, str]
) -> dict[str, str]:
    out: dict[str, str] = {HEALTH: str(health.state)}
    share = s.hysteresis_pct / 100

    def before(name: str) -> int | None:
        value = previous.get(f"{s.prefix}/{name}")
        return int(value) if value is not None and value.isdigit() else None

    def down(name: str, raw: float, step: int) -> str:
        return str(stable_down(raw, step, before(name), share * step))

    def nearest(name: str, raw: float, step: int) -> str:
        return str(stable_nearest(raw, step, before(name), share * step))

    if snapshot.error is not None:
        return out  # nothing else can be trusted: numbers would be stale
    gpus = snapshot.gpus
    out[GPU_COUNT] = str(len(gpus))
    products = Counter(g.product for g in gpus if g.product)
    if products:
        product, _ = products.most_common(1)[0]
        out[PRODUCT] = sanitise_value(product)
        if len(products) > 1:
            out[PRODUCT_MIXED] = "true"
        ref = next(g for g in gpus if g.product == product)
        if ref.architecture:
            out[FAMILY] = ref.architecture
        if ref.compute_major is not None and ref.compute_minor is not None:
            out[COMPUTE_MAJOR] = str(ref.compute_major)
            out[COMPUTE_MINOR] = str(ref.compute_minor)
    if snapshot.cuda_driver_version is not None:
        out[CUDA_MAJOR] = str(snapshot.cuda_driver_version[0])
        out[CUDA_MINOR] = str(snapshot.cuda_driver_version[1])
    totals = [g.memory_total_mib for g in gpus if g.memory_total_mib is not None]
    if totals:
        out[MEMORY_TOTAL] = str(min(totals))

    # aggregates count schedulable units: whole GPUs, and MIG devices on GPUs with MIG on
    healthy = health.healthy_units
    free = [u.memory_free_mib for u in healthy if u.memory_free_mib is not None]
    mem_step, util_step = s.memory_step_mib, s.utilization_step_pct
    out[MEMORY_FREE] = down(MEMORY_FREE, max(free), mem_step) if free else "0"
    out[MEMORY_FREE_TOTAL] = (
        down(MEMORY_FREE_TOTAL, sum(free), mem_step) if free else "0"
    )
    utils = [u.utilization_pct for u in healthy if u.utilization_pct is not None]
    if utils:
        # NVML can report a sample above 100 (rounding in the driver): never publish one
        out[UTILIZATION] = nearest(UTILIZATION, min(min(utils), 100.0), util_step)
    out[IDLE_COUNT] = str(sum(1 for u in healthy if _idle(u, s.idle_utilization_pct)))
    out[HEALTHY_COUNT] = str(len(healthy))
    out.update(_mig_labels(health.units, s, down))

    if s.per_gpu_labels:
        mig_free: dict[int, list[int]] = {}
        for u in healthy:
            if u.is_mig and u.memory_free_mib is not None:
                mig_free.setdefault(u.gpu_index, []).append(u.memory_free_mib)
        for g in gpus:
            def key(name: str, index: int = g.index) -> str:
                return gpu_key(index, name)

            out[key(GPU_HEALTH)] = str(health.gpus[g.index].state)
            if g.error is not None:
                continue
            if g.mig_enabled:
                out[key(GPU_MIG_ENABLED)] = "true"
                # a MIG GPU's free memory is that of its freest healthy MIG device: the most
                # one pod can get on it; no utilisation (NVML has none with MIG on)
                if g.index in mig_free:
                    out[key(GPU_MEMORY_FREE)] = down(
                        key(GPU_MEMORY_FREE), max(mig_free[g.index]), mem_step
                    )
            elif g.memory_free_mib is not None:
                out[key(GPU_MEMORY_FREE)] = down(key(GPU_MEMORY_FREE), g.memory_free_mib, mem_step)
            if g.utilization_pct is not None and not g.mig_enabled:
                out[key(GPU_UTILIZATION)] = nearest(
                    key(GPU_UTILIZATION), min(g.utilization_pct, 100.0), util_step
                )
            if g.temperature_c is not None and g.temperature_c >= 0:
                out[key(GPU_TEMPERATURE)] = nearest(
                    key(GPU_TEMPERATURE), g.temperature_c, s.temperature_step_c
                )
    return out


def _idle(unit: Unit, below_pct: float) -> bool:
    """No compute process, and (whole GPUs) utilisation under ``below_pct``; a MIG device has
    no utilisation in NVML, so no process is what idle means there."""
    if unit.process_count:
        return False
    if unit.is_mig:
        return unit.process_count == 0
    return unit.utilization_pct is not None and unit.utilization_pct < below_pct


def _mig_labels(
    units: tuple[Unit, ...], s: Settings, down: Callable[[str, float, int], str]
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
    out = {MIG_STRATEGY: "mixed"}
    for profile, members in sorted(by_profile.items()):
        healthy = [u for u in members if u.healthy]
        out[mig_key(profile, MIG_COUNT)] = str(len(members))
        out[mig_key(profile, MIG_HEALTHY_COUNT)] = str(len(healthy))
        out[mig_key(profile, MIG_IDLE_COUNT)] = str(sum(1 for u in healthy if _idle(u, 0.0)))
        free = [u.memory_free_mib for u in healthy if u.memory_free_mib is not None]
        out[mig_key(profile, MIG_MEMORY_FREE)] = (
            down(mig_key(profile, MIG_MEMORY_FREE), max(free), s.memory_step_mib) if free else "0"
        )
    return out


def telemetry(
    snapshot: NodeSnapshot,
    health: NodeHealth,
    refresh_s: float | None = None,
    lease: str | None = None,
) -> str:
    """The telemetry annotation: the snapshot as compact JSON, keys sorted.

    Shape: ``{"agent", "read_at" (RFC 3339), "source", "health", "driver", "cuda",
    "error"?, "gpus": [{"index", "uuid", "product", "memory_total_mib", "memory_free_mib",
    "memory_used_mib", "utilization_pct", "temperature_c", "power_w", "ecc_uncorrected_volatile",
    "ecc_corrected_volatile", "remapped_rows_pending", "remapped_rows_failure",
    "process_count", "health", "reasons", "mig_enabled"?, "mig_devices"?: [{"index", "uuid",
    "profile", "gpu_instance_id", "memory_total_mib", "memory_free_mib", "memory_used_mib",
    "process_count", "health", "reasons"}]}]}``; absent (NotSupported) values are ``null``;
    the MIG keys only on a GPU with MIG on. ``lease`` (``"namespace/name"``): the
    ``coordination.k8s.io`` Lease that carries the agent's liveness (then no ``refresh_s``:
    the document is rewritten only with a label change).
    """
    mig_units = {(u.gpu_index, u.mig_index): u for u in health.units if u.is_mig}
    gpus = []
    for g in snapshot.gpus:
        gh = health.gpus[g.index]
        mig: dict[str, object] = {}
        if g.mig_enabled:
            mig["mig_enabled"] = True
            mig["mig_devices"] = [
                {
                    "index": m.index,
                    "uuid": m.uuid,
                    "profile": m.profile,
                    "gpu_instance_id": m.gpu_instance_id,
                    "memory_total_mib": m.memory_total_mib,
                    "memory_free_mib": m.memory_free_mib,
                    "memory_used_mib": m.memory_used_mib,
                    "process_count": m.process_count,
                    "health": str(mig_units[(g.index, m.index)].state),
                    "reasons": list(mig_units[(g.index, m.index)].reasons),
                    **({"error": m.error} if m.error else {}),
                }
                for m in g.mig_devices
            ]
        gpus.append(
            {
                "index": g.index,
                "uuid": g.uuid,
                "product": g.product,
                "memory_total_mib": g.memory_total_mib,
                "memory_free_mib": g.memory_free_mib,
                "memory_used_mib": g.memory_used_mib,
                "utilization_pct": None if g.utilization_pct is None else round(g.utilization_pct, 1),
                "temperature_c": g.temperature_c,
                "power_w": None if g.power_w is None else round(g.power_w, 1),
                "ecc_uncorrected_volatile": g.ecc_uncorrected_volatile,
                "ecc_corrected_volatile": g.ecc_corrected_volatile,
                "remapped_rows_pending": g.remapped_rows_pending,
                "remapped_rows_failure": g.remapped_rows_failure,
                "process_count": g.process_count,
                "health": str(gh.state),
                "reasons": list(gh.reasons),
                **({"error": g.error} if g.error else {}),
                **mig,
            }
        )
    doc: dict[str, object] = {
        "schema": TELEMETRY_VERSION,
        "agent": __version__,
        "read_at": snapshot.read_at.astimezone(timezone.utc)
        .isoformat(timespec="seconds")
        .replace("+00:00", "Z"),
        "source": snapshot.source,
        "health": str(health.state),
        "driver": snapshot.driver_version,
        "cuda": ".".join(map(str, snapshot.cuda_driver_version))
        if snapshot.cuda_driver_version
        else None,
        "gpus": gpus,
    }
    if snapshot.error is not None:
        doc["error"] = snapshot.error
    if lease is not None:  # liveness is on this Lease ("namespace/name"), not on this document
        doc["lease"] = lease
    if refresh_s is not None:  # the publisher's promise: rewritten within refresh_s of read_at
        doc["refresh_s"] = refresh_s
        doc["expires_at"] = (snapshot.read_at + timedelta(seconds=refresh_s)).astimezone(
            timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")  # fmt: skip
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def render(
    snapshot: NodeSnapshot,
    health: NodeHealth,
    settings: Settings,
    previous: Mapping[str, str] | None = None,
    *,
    with_telemetry: bool = True,
) -> Desired:
    """Desired labels and annotations (full keys under ``settings.prefix``) for this snapshot.

    Labels follow the schema in the README (node aggregates, static facts, per-GPU keys when
    ``per_gpu_labels``); the one annotation is ``<prefix>/telemetry`` (left out when
    ``with_telemetry`` is false: the agent builds it only for a patch that carries it). Invalid
    keys or values are dropped and listed in ``Desired.dropped``. ``previous`` (the labels
    rendered last tick) turns on hysteresis for the rounded numbers (``settings.hysteresis_pct``).
    """
    prefix = settings.prefix
    labels: dict[str, str] = {}
    dropped: list[tuple[str, str]] = []
    key_ok, value_ok = _KEY_OK.get, _VALUE_OK.get
    for name, value in _node_labels(snapshot, health, settings, previous or {}).items():
        key = f"{prefix}/{name}"
        ok = key_ok(key)
        if ok is None:
            ok = _memo_valid(_KEY_OK, is_valid_key, key)
        if ok:
            ok = value_ok(value)
            if ok is None:
                ok = _memo_valid(_VALUE_OK, is_valid_value, value)
        if ok and value:
            labels[key] = value
        else:
            dropped.append((key, value))
    annotations: dict[str, str] = {}
    if with_telemetry:
        annotations, bad = telemetry_annotation(snapshot, health, prefix)
        dropped.extend(bad)
    return Desired(labels=labels, annotations=annotations, dropped=tuple(dropped))


def telemetry_annotation(
    snapshot: NodeSnapshot,
    health: NodeHealth,
    prefix: str,
    refresh_s: float | None = None,
    lease: str | None = None,
) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """``({"<prefix>/telemetry": json}, [])``, or ``({}, [(key, start of value)])`` when the key is
    invalid or the JSON too large for the Node's annotations (256 KiB)."""
    key = f"{prefix}/{TELEMETRY}"
    value = telemetry(snapshot, health, refresh_s, lease)
    if _memo_valid(_KEY_OK, is_valid_key, key) and len(value) < MAX_ANNOTATIONS_BYTES:
        return {key: value}, []
    return {}, [(key, value[:80])]


_KEY_OK: dict[str, bool] = {}
_VALUE_OK: dict[str, bool] = {}
_MEMO_MAX = 4096


def _memo_valid(memo: dict[str, bool], check: Callable[[str], bool], text: str) -> bool:
    """``check(text)``, remembered: a tick renders the same keys and mostly the same values
    as the last one, and the regex checks were half of ``render``'s time (bench/tick.py)."""
    ok = memo.get(text)
    if ok is None:
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        ok = memo[text] = check(text)
    return ok


def is_static(key: str, prefix: str) -> bool:
    """True for a label key that names hardware facts (kept on graceful exit)."""
    return key.removeprefix(prefix + "/") in STATIC_NAMES


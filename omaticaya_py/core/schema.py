"""The label and telemetry contract: every key name, written by ``core.render``, read back here.

The agent writes Node labels ``<prefix>/<name>`` and one annotation ``<prefix>/telemetry``
(compact JSON, ``TELEMETRY_VERSION``); every reader (the scheduler extender, tests, the README's
tables) takes the names from this module, and ``parse_node`` turns a Node's labels and
telemetry back into typed state (``NodeGpuState``), treating them as untrusted input.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# ---------------------------------------------------------------------------- the names ----

#: Annotation name (under the prefix) holding the whole reading as compact JSON.
TELEMETRY = "telemetry"
#: ``"schema"`` field of the telemetry JSON: bumped when a reader would misread a new document.
TELEMETRY_VERSION = 2

# node labels (under the prefix)
HEALTH = "gpu.health"
GPU_COUNT = "gpu.count"
PRODUCT = "gpu.product"
PRODUCT_MIXED = "gpu.product.mixed"
FAMILY = "gpu.family"
COMPUTE_MAJOR = "gpu.compute.major"
COMPUTE_MINOR = "gpu.compute.minor"
CUDA_MAJOR = "cuda.driver.major"
CUDA_MINOR = "cuda.driver.minor"
MEMORY_TOTAL = "gpu.memory.total-mib"
MEMORY_FREE = "gpu.memory.free-mib"
MEMORY_FREE_TOTAL = "gpu.memory.free-total-mib"
UTILIZATION = "gpu.utilization-pct"
IDLE_COUNT = "gpu.idle-count"
HEALTHY_COUNT = "gpu.healthy-count"
MIG_STRATEGY = "mig.strategy"

#: Label names that describe the hardware, not its state: kept on graceful exit.
STATIC_NAMES = frozenset(
    {
        GPU_COUNT,
        PRODUCT,
        PRODUCT_MIXED,
        FAMILY,
        COMPUTE_MAJOR,
        COMPUTE_MINOR,
        CUDA_MAJOR,
        CUDA_MINOR,
        MEMORY_TOTAL,
    }
)

# per-GPU labels: gpu_key(index, ...)
GPU_HEALTH = "health"
GPU_MEMORY_FREE = "memory.free-mib"
GPU_UTILIZATION = "utilization-pct"
GPU_TEMPERATURE = "temperature-c"
GPU_MIG_ENABLED = "mig.enabled"

# per-MIG-profile labels: mig_key(profile, ...)
MIG_COUNT = "count"
MIG_HEALTHY_COUNT = "healthy-count"
MIG_IDLE_COUNT = "idle-count"
MIG_MEMORY_FREE = "memory.free-mib"


def gpu_key(index: int, name: str) -> str:
    """A per-GPU label name: ``gpu_key(3, GPU_HEALTH)`` -> ``gpu-3.health``."""
    return f"gpu-{index}.{name}"


def mig_key(profile: str, name: str) -> str:
    """A per-MIG-profile label name: ``mig_key("1g.10gb", MIG_COUNT)`` -> ``mig-1g.10gb.count``
    (a ``+`` in a profile name, not allowed in a label name, becomes ``-``)."""
    return f"mig-{profile.replace('+', '-')}.{name}"


#: per-GPU label names read back: (index, name)
PER_GPU_KEY = re.compile(
    r"^gpu-(\d+)\.("
    + "|".join(re.escape(n) for n in (GPU_MEMORY_FREE, GPU_HEALTH, GPU_MIG_ENABLED))
    + r")$"
)

# ------------------------------------------------------------------------- node state ----


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    free_mib: int
    healthy: bool


@dataclass(frozen=True, slots=True)
class NodeGpuState:
    """What the extender knows about one node's GPUs, parsed once per Node change.

    ``known`` is False when the node carries no Omaticaya data at all; ``health`` is the
    ``gpu.health`` label (or the telemetry's); ``read_at`` is epoch seconds (``None``: no
    telemetry annotation); ``expires_at`` is epoch seconds, the agent's own promise of its next
    rewrite (``None``: an agent that does not publish it, or a value not to be trusted);
    ``lease`` is the ``"<namespace>/<name>"`` of the Lease that holds the agent's liveness
    (``None``: none named, or not of that form): its renewals, not ``read_at``, say whether
    the telemetry is current; ``gpus`` per GPU; ``free_total_mib`` over healthy GPUs."""

    name: str
    known: bool = False
    health: str | None = None
    read_at: float | None = None
    expires_at: float | None = None
    gpus: tuple[GpuInfo, ...] = ()
    free_total_mib: int = 0
    problem: str | None = None
    lease: str | None = None


_INT_TEXT = re.compile(r"^\s*-?[0-9]{1,18}\s*$")


def json_int(value: Any) -> int | None:
    """A whole number from JSON or a label value, or ``None`` for anything else: booleans,
    NaN, infinities, floats or text beyond 18 digits (no GPU has 10^18 MiB), non-ASCII digits."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < 10**18 else None
    if isinstance(value, float):
        return int(value) if math.isfinite(value) and abs(value) < 1e18 else None
    if isinstance(value, str) and _INT_TEXT.match(value):
        return int(value)
    return None


def json_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def json_mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _read_at(text: Any) -> float | None:
    if not isinstance(text, str) or not text or len(text) > 64:
        return None
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if stamp.tzinfo is None:
        return None
    return stamp.timestamp()


#: the longest ``expires_at - read_at`` trusted (a weekly schedule plus a day of heartbeat):
#: beyond it the value did not come from a working agent, and the extender's TTL applies
MAX_REFRESH_S = 8 * 24 * 3600.0

#: the most a Node's annotations can hold in total (the API server's limit): a larger telemetry
#: value did not come from the API server and is not parsed
MAX_TELEMETRY_BYTES = 256 * 1024



#: a Lease reference as the agent writes it: ``<namespace>/<name>`` (a DNS label, a DNS
#: subdomain)
_LEASE_REF = re.compile(
    r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9](?:[-.a-z0-9]{0,251}[a-z0-9])?$"
)


def lease_ref(value: Any) -> str | None:
    """``value`` when it is a ``"<namespace>/<name>"`` Lease reference, else ``None``."""
    if isinstance(value, str) and len(value) <= 317 and _LEASE_REF.match(value):
        return value
    return None


def parse_node(
    name: str,
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    prefix: str = "omaticaya.io",
) -> NodeGpuState:
    """A node's GPU state from its labels and the ``<prefix>/telemetry`` annotation.

    Per-GPU data comes from the telemetry (exact MiB) when it parses, else from the
    ``gpu-N.*`` labels, else from the node aggregates (``gpu.memory.free-mib`` on one GPU,
    ``gpu.healthy-count`` GPUs). Only whole GPUs count: a GPU with MIG on (``mig_enabled`` in
    the telemetry, ``gpu-N.mig.enabled`` label) is given out as MIG devices, not as a GPU.

    Everything here is untrusted (any controller can write a Node's annotations): it never
    raises. Values of the wrong type are ignored; a telemetry annotation that is not a JSON
    object, is over ``MAX_TELEMETRY_BYTES``, nests too deep for the parser, holds a number that
    is not finite where a whole number belongs, or lacks a valid ``read_at`` sets ``problem``
    (the filter then fails the node with that reason)."""
    labels = json_mapping(labels)
    annotations = json_mapping(annotations)
    p = prefix + "/"
    mine = {
        k[len(p) :]: v
        for k, v in labels.items()
        if isinstance(k, str) and k.startswith(p) and isinstance(v, str)
    }
    raw = annotations.get(p + TELEMETRY)
    doc: Mapping[str, Any] | None = None
    problem = None
    if raw is not None:
        if not isinstance(raw, str):
            problem = "unreadable telemetry annotation (not a string)"
        elif len(raw) > MAX_TELEMETRY_BYTES:
            problem = f"unreadable telemetry annotation (over {MAX_TELEMETRY_BYTES} bytes)"
        else:
            try:
                loaded = json.loads(raw)
                doc = loaded if isinstance(loaded, dict) else None
            except (ValueError, RecursionError):  # RecursionError: nested too deep
                doc = None
            if doc is None:
                problem = "unreadable telemetry annotation"
    health = json_str(mine.get(HEALTH)) or (json_str(doc.get("health")) if doc else None)
    if not mine and doc is None:
        return NodeGpuState(name=name, problem=problem)
    read_at = _read_at(doc.get("read_at")) if doc else None
    if doc is not None and read_at is None:
        problem = "telemetry annotation without a valid read_at"
    expires_at = _read_at(doc.get("expires_at")) if doc and read_at is not None else None
    if expires_at is not None and not 0 <= expires_at - read_at <= MAX_REFRESH_S:  # type: ignore[operator]
        expires_at = None

    # whole GPUs only: a GPU with MIG on is given out as MIG devices (nvidia.com/mig-<profile>),
    # never as a whole GPU, so its whole-GPU free memory must not make room for a pod
    gpus: list[GpuInfo] = []
    listed = False
    if doc is not None and isinstance(doc.get("gpus"), list):
        for g in doc["gpus"]:
            if not isinstance(g, dict):
                continue
            listed = True
            if g.get("mig_enabled") is True:
                continue
            index, free = json_int(g.get("index")), json_int(g.get("memory_free_mib"))
            if index is None:
                continue
            if free is None and g.get("memory_free_mib") is not None:
                problem = "telemetry annotation with a bad memory_free_mib"
            gpus.append(
                GpuInfo(index, free or 0, g.get("health") == "Healthy" and free is not None)
            )
    if not gpus and not listed:
        per: dict[int, dict[str, str]] = {}
        for key, value in mine.items():
            m = PER_GPU_KEY.match(key)
            if m:
                per.setdefault(int(m.group(1)), {})[m.group(2)] = value
        for index in sorted(per):
            if per[index].get(GPU_MIG_ENABLED) == "true":
                continue
            free = json_int(per[index].get(GPU_MEMORY_FREE))
            gpus.append(
                GpuInfo(
                    index, free or 0, per[index].get(GPU_HEALTH) == "Healthy" and free is not None
                )
            )
    if not gpus and not listed and MIG_STRATEGY not in mine:  # aggregates count MIG devices
        free = json_int(mine.get(MEMORY_FREE))
        healthy = json_int(mine.get(HEALTHY_COUNT)) or 0
        if free is not None and healthy > 0:
            # only aggregates: the best GPU has `free`; assume no more than that on the others,
            # capped by the free total
            total = json_int(mine.get(MEMORY_FREE_TOTAL)) or free
            left = total
            for index in range(healthy):
                share = min(free, left)
                gpus.append(GpuInfo(index, share, True))
                left -= share
    free_total = sum(g.free_mib for g in gpus if g.healthy)
    return NodeGpuState(
        name=name,
        known=True,
        health=health,
        read_at=read_at,
        expires_at=expires_at,
        lease=lease_ref(doc.get("lease")) if doc is not None and read_at is not None else None,
        gpus=tuple(gpus),
        free_total_mib=free_total,
        problem=problem,
    )


def state_from_object(node: Mapping[str, Any], prefix: str) -> NodeGpuState:
    """``parse_node`` on a v1.Node document (as the scheduler sends in ``Nodes.items``)."""
    meta = json_mapping(json_mapping(node).get("metadata"))
    name = meta.get("name")
    return parse_node(
        name if isinstance(name, str) else "", meta.get("labels"), meta.get("annotations"), prefix
    )


# ------------------------------------------------------------------- per-GPU readings ----


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU of the telemetry annotation, every field as published (``None``: absent,
    NotSupported, or not of the right type): what a viewer such as ``omaticaya top --gpus``
    shows. ``utilization_pct`` and ``power_w`` are finite floats; ``reasons`` are strings."""

    index: int
    uuid: str | None = None
    product: str | None = None
    memory_free_mib: int | None = None
    memory_total_mib: int | None = None
    utilization_pct: float | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    process_count: int | None = None
    health: str | None = None
    reasons: tuple[str, ...] = ()
    mig_enabled: bool = False
    mig_devices: int = 0


def json_float(value: Any) -> float | None:
    """A finite number from JSON, or ``None`` (booleans, NaN, infinities, text)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and abs(number) < 1e18 else None


def parse_gpu_readings(
    annotations: Mapping[str, str] | None, prefix: str = "omaticaya.io"
) -> tuple[GpuReading, ...]:
    """Each GPU of the ``<prefix>/telemetry`` annotation, by index, for display.

    Untrusted input, like ``parse_node``: it never raises; an annotation that is absent, not a
    JSON object or over ``MAX_TELEMETRY_BYTES`` gives ``()`` (``parse_node`` names the
    problem), a GPU entry that is not an object or has no whole ``index`` is skipped, and a
    field of the wrong type reads as ``None``."""
    raw = json_mapping(annotations).get(prefix + "/" + TELEMETRY)
    if not isinstance(raw, str) or len(raw) > MAX_TELEMETRY_BYTES:
        return ()
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return ()
    listed = doc.get("gpus") if isinstance(doc, dict) else None
    readings: dict[int, GpuReading] = {}
    for g in listed if isinstance(listed, list) else ():
        if not isinstance(g, dict) or (index := json_int(g.get("index"))) is None:
            continue
        reasons = g.get("reasons")
        migs = g.get("mig_devices")
        readings.setdefault(
            index,
            GpuReading(
                index=index,
                uuid=json_str(g.get("uuid")),
                product=json_str(g.get("product")),
                memory_free_mib=json_int(g.get("memory_free_mib")),
                memory_total_mib=json_int(g.get("memory_total_mib")),
                utilization_pct=json_float(g.get("utilization_pct")),
                temperature_c=json_int(g.get("temperature_c")),
                power_w=json_float(g.get("power_w")),
                process_count=json_int(g.get("process_count")),
                health=json_str(g.get("health")),
                reasons=tuple(r for r in reasons if isinstance(r, str))
                if isinstance(reasons, list)
                else (),
                mig_enabled=g.get("mig_enabled") is True,
                mig_devices=len(migs) if isinstance(migs, list) else 0,
            ),
        )
    return tuple(readings[i] for i in sorted(readings))

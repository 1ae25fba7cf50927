"""The label table: every Node label the agent writes, as ``<prefix>/<name>``, one row each.

``LABELS`` says of each label its name, where it sits (the node, each GPU: ``gpu-N.<name>``,
each MIG profile: ``mig-<profile>.<name>``), whether it is a hardware fact (kept on graceful
exit: ``STATIC_NAMES``), its unit, and which way it moves when the Node gets less attractive to
a scheduler (``core.publish.budget`` sends those changes at once). The writer (``core.publish.render``), the
write budget (``core.publish.budget``), every reader (``schema.nodestate``, the extender, ``omaticaya
top``) and the label tables of README.md and docs/labels.md (checked by ``tests/core/publish/test_label_table.py``) agree with it.
Adding a label is one row here, plus its value in ``core.publish.render``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "LABELS",
    "STATIC_NAMES",
    "Label",
    "Scope",
    "Worse",
    "by_worse",
    "gpu_key",
    "mig_key",
    "per_gpu",
]

# node labels (under the prefix)
HEALTH = "gpu.health"
GPU_COUNT = "gpu.count"
PRODUCT = "gpu.product"
PRODUCT_MIXED = "gpu.product.mixed"
FAMILY = "gpu.family"
COMPUTE_MAJOR = "gpu.compute.major"
COMPUTE_MINOR = "gpu.compute.minor"
# the driver and CUDA versions, under GPU Feature Discovery's current names and meanings
#: the display driver's version (``nvmlSystemGetDriverVersion``, ``580.65.06``): its parts as
#: text (``580``, ``65``, ``06``: the revision keeps its leading zero; absent for a driver
#: version of two parts, where GFD writes it empty) and the whole string
DRIVER_MAJOR = "cuda.driver-version.major"
DRIVER_MINOR = "cuda.driver-version.minor"
DRIVER_REVISION = "cuda.driver-version.revision"
DRIVER_FULL = "cuda.driver-version.full"
#: the CUDA version the driver supports (``nvmlSystemGetCudaDriverVersion_v2``, ``13000``):
#: ``13``, ``0`` and ``13.0``
CUDA_MAJOR = "cuda.runtime-version.major"
CUDA_MINOR = "cuda.runtime-version.minor"
CUDA_FULL = "cuda.runtime-version.full"
MEMORY_TOTAL = "gpu.memory.total-mib"
MEMORY_FREE = "gpu.memory.free-mib"
MEMORY_FREE_TOTAL = "gpu.memory.free-total-mib"
UTILIZATION = "gpu.utilization-pct"
#: GPM SM activity (``GpuReading.sm_active_pct``): the lowest of the healthy whole GPUs that
#: have it, rounded like utilisation; absent when none has it (no GPM: pre-Hopper, MIG, vGPU)
SM_ACTIVE = "gpu.sm-active-pct"
IDLE_COUNT = "gpu.idle-count"
HEALTHY_COUNT = "gpu.healthy-count"
MIG_STRATEGY = "mig.strategy"
#: with shared GPUs (``core.model.sharing``): the largest slice one healthy shared GPU can take now
#: (live free memory, no more than its units not held), MiB rounded down to the memory step
SHARED_MEMORY_FREE = "gpu.shared.memory.free-mib"

# per-GPU labels: gpu_key(index, ...)
GPU_HEALTH = "health"
GPU_MEMORY_FREE = "memory.free-mib"
GPU_UTILIZATION = "utilization-pct"
GPU_TEMPERATURE = "temperature-c"
#: GPM SM activity, rounded like utilisation; only with ``sm_active_labels`` and GPM
GPU_SM_ACTIVE = "sm-active-pct"
GPU_MIG_ENABLED = "mig.enabled"
#: memory of processes in no pod, MiB rounded down to the memory step; only when non-zero
GPU_MEMORY_OUT_OF_BAND = "memory.out-of-band-mib"

# per-MIG-profile labels: mig_key(profile, ...)
MIG_COUNT = "count"
MIG_HEALTHY_COUNT = "healthy-count"
MIG_IDLE_COUNT = "idle-count"
MIG_MEMORY_FREE = "memory.free-mib"


#: where a label sits: on the node, per GPU (``gpu-N.<name>``), per MIG profile
Scope = Literal["node", "gpu", "mig"]
#: which way a change makes the Node less attractive: ``less`` (a number down), ``more`` (a
#: number up), ``health`` (down the ``core.publish.budget.HEALTH_RANK``), ``neutral`` (never: not a
#: scheduling input), ``changed`` (text: a value that changes, never one that appears)
Worse = Literal["less", "more", "health", "neutral", "changed"]


@dataclass(frozen=True, slots=True)
class Label:
    """One row of the label table: ``name`` (per GPU or per MIG profile: the part after
    ``gpu-N.`` / ``mig-<profile>.``), ``scope``, ``static`` (a hardware fact, kept on graceful
    exit), ``unit`` (``mib``, ``pct``, ``c``, ``count``; ``None``: text or a flag) and
    ``worse`` (see ``Worse``)."""

    name: str
    scope: Scope
    static: bool
    unit: str | None
    worse: Worse


#: every label the agent writes (``core.publish.render`` gives each its value)
LABELS: tuple[Label, ...] = (
    Label(HEALTH, "node", False, None, "health"),
    Label(GPU_COUNT, "node", True, "count", "less"),
    Label(PRODUCT, "node", True, None, "changed"),
    Label(PRODUCT_MIXED, "node", True, None, "changed"),
    Label(FAMILY, "node", True, None, "changed"),
    Label(COMPUTE_MAJOR, "node", True, None, "changed"),
    Label(COMPUTE_MINOR, "node", True, None, "changed"),
    Label(DRIVER_MAJOR, "node", True, None, "changed"),
    Label(DRIVER_MINOR, "node", True, None, "changed"),
    Label(DRIVER_REVISION, "node", True, None, "changed"),
    Label(DRIVER_FULL, "node", True, None, "changed"),
    Label(CUDA_MAJOR, "node", True, None, "changed"),
    Label(CUDA_MINOR, "node", True, None, "changed"),
    Label(CUDA_FULL, "node", True, None, "changed"),
    Label(MEMORY_TOTAL, "node", True, "mib", "less"),
    Label(MEMORY_FREE, "node", False, "mib", "less"),
    Label(MEMORY_FREE_TOTAL, "node", False, "mib", "less"),
    Label(UTILIZATION, "node", False, "pct", "more"),
    Label(SM_ACTIVE, "node", False, "pct", "more"),
    Label(IDLE_COUNT, "node", False, "count", "less"),
    Label(HEALTHY_COUNT, "node", False, "count", "less"),
    Label(MIG_STRATEGY, "node", False, None, "changed"),
    Label(SHARED_MEMORY_FREE, "node", False, "mib", "less"),
    Label(GPU_HEALTH, "gpu", False, None, "health"),
    Label(GPU_MEMORY_FREE, "gpu", False, "mib", "less"),
    Label(GPU_UTILIZATION, "gpu", False, "pct", "more"),
    Label(GPU_TEMPERATURE, "gpu", False, "c", "neutral"),
    Label(GPU_SM_ACTIVE, "gpu", False, "pct", "more"),
    Label(GPU_MIG_ENABLED, "gpu", False, None, "changed"),
    Label(GPU_MEMORY_OUT_OF_BAND, "gpu", False, "mib", "more"),
    Label(MIG_COUNT, "mig", False, "count", "less"),
    Label(MIG_HEALTHY_COUNT, "mig", False, "count", "less"),
    Label(MIG_IDLE_COUNT, "mig", False, "count", "less"),
    Label(MIG_MEMORY_FREE, "mig", False, "mib", "less"),
)

#: Label names that describe the hardware, not its state: kept on graceful exit.
STATIC_NAMES = frozenset(row.name for row in LABELS if row.static)


def by_worse(worse: Worse, scope: Scope) -> frozenset[str]:
    """The names (for ``gpu``/``mig``: the part after ``gpu-N.`` / ``mig-<profile>.``) of the
    labels in ``scope`` whose ``worse`` is ``worse``."""
    return frozenset(row.name for row in LABELS if row.worse == worse and row.scope == scope)



def gpu_key(index: int, name: str) -> str:
    """A per-GPU label name: ``gpu_key(3, GPU_HEALTH)`` -> ``gpu-3.health``."""
    return f"gpu-{index}.{name}"


def mig_key(profile: str, name: str) -> str:
    """A per-MIG-profile label name: ``mig_key("1g.10gb", MIG_COUNT)`` -> ``mig-1g.10gb.count``
    (a ``+`` in a profile name, not allowed in a label name, becomes ``-``)."""
    return f"mig-{profile.replace('+', '-')}.{name}"


_PER_GPU = re.compile(r"^gpu-([0-9]{1,9})\.(.+)$")


def per_gpu(labels: Mapping[str, str]) -> dict[int, dict[str, str]]:
    """The per-GPU labels among ``labels`` (label names without the prefix -> values), read
    back: GPU index -> {name after ``gpu-N.`` -> value} (the inverse of ``gpu_key``); other
    keys, and ``gpu-N`` that is no plain number, are left out. Never raises."""
    out: dict[int, dict[str, str]] = {}
    for key, value in labels.items():
        if m := _PER_GPU.match(key):
            out.setdefault(int(m.group(1)), {})[m.group(2)] = value
    return out

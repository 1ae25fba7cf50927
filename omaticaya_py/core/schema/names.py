"""Label names: every Node label the agent writes, as ``<prefix>/<name>``.

The writer (``core.render``), the write budget (``core.budget``), every reader (the extender,
``omaticaya top``, the tests) and the README's tables take the names from here.
"""

from __future__ import annotations

import re

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
#: with shared GPUs (``core.sharing``): the largest slice one healthy shared GPU can take now
#: (live free memory, no more than its units not held), MiB rounded down to the memory step
SHARED_MEMORY_FREE = "gpu.shared.memory.free-mib"

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
#: memory of processes in no pod, MiB rounded down to the memory step; only when non-zero
GPU_MEMORY_OUT_OF_BAND = "memory.out-of-band-mib"

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


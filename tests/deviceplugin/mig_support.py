"""What other test files share of test_mig.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from tests.helpers import VERSIONS

STATIC = {
    "gpu.product": "NVIDIA-H100-80GB-HBM3",
    "gpu.family": "hopper",
    "gpu.compute.major": "9",
    "gpu.compute.minor": "0",
    **VERSIONS,
    "gpu.memory.total-mib": "81559",
}


#: one H100 in 3g.40gb + 2g.20gb + 2g.20gb at t=15: the 30 GiB load runs in the 3g.40gb
#: instance (8832 MiB free there)
H100_MIG_AT_15 = {
    **STATIC,
    "gpu.count": "1",
    "gpu.health": "Healthy",
    "gpu.memory.free-mib": "19456",  # the freest unit: a 2g.20gb (20083 MiB)
    "gpu.memory.free-total-mib": "48128",  # 8832 + 20083 + 20083, rounded down
    "gpu.idle-count": "2",
    "gpu.healthy-count": "3",
    "mig.strategy": "mixed",
    "mig-2g.20gb.count": "2",
    "mig-2g.20gb.healthy-count": "2",
    "mig-2g.20gb.idle-count": "2",
    "mig-2g.20gb.memory.free-mib": "19456",
    "mig-3g.40gb.count": "1",
    "mig-3g.40gb.healthy-count": "1",
    "mig-3g.40gb.idle-count": "0",
    "mig-3g.40gb.memory.free-mib": "8192",
    "gpu-0.health": "Healthy",
    "gpu-0.mig.enabled": "true",
    "gpu-0.memory.free-mib": "19456",
    "gpu-0.temperature-c": "60",
}

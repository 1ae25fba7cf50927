"""What other test files share of test_mig_mode.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from tests.nvmltestlib import (
    MIG_MIXED,
    fault,
    nvml_worker_fixture,  # noqa: F401 - fixture
    sample,
    scenario,
    testlib_fixture,  # noqa: F401 - fixture
)

#: GPU 1's MIG devices once MIG is on: GPU 0's layout (seven 1g.10gb) under UUIDs of its own
GPU1_MIG_UUIDS = [f"MIG-00000000-0000-4000-8000-00000000001{slot}" for slot in range(7)]


Mode = tuple[int, int] | str  # [current, pending], or the NVML error nvmlDeviceGetMigMode gives


def gpu1(mode: Mode) -> dict[str, Any]:
    """GPU 1's reading in a sample where ``nvmlDeviceGetMigMode`` answers ``mode``; with the
    current mode on, as NVML reads such a GPU: no utilisation, seven MIG devices (also with an
    error: the test library then keeps the static mode, which the cases with one have on)."""
    if not isinstance(mode, str) and not mode[0]:
        return {"mig_mode": list(mode)}
    gpu0 = json.loads(MIG_MIXED.read_text())["samples"][0]["gpus"][0]
    return {
        "mig_mode": fault(mode) if isinstance(mode, str) else list(mode),
        "utilization_pct": fault("NVMLError_NotSupported"),
        "mig_devices": copy.deepcopy(gpu0["mig_devices"]),
    }


def trace(path: Path, facts: tuple[int, int], modes: list[Mode]) -> Path:
    """One sample per mode of GPU 1, over ``mig-mixed-trace.json`` (GPU 0 in seven 1g.10gb MIG
    devices); GPU 1's static ``mig_mode`` is ``facts`` and its MIG devices' facts are there for
    whenever MIG is on."""

    def devices(devs: list[dict[str, Any]]) -> None:
        devs[1]["mig_mode"] = list(facts)
        devs[1]["max_mig_device_count"] = 7
        devs[1]["mig_devices"] = [
            dict(copy.deepcopy(m), uuid=GPU1_MIG_UUIDS[m["index"]]) for m in devs[0]["mig_devices"]
        ]

    return scenario(path, *(sample(gpu1=gpu1(m)) for m in modes), devices=devices)


ON, OFF = (1, 1), (0, 0)

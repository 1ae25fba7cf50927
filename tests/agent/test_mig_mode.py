"""MIG mode turned on or off at runtime (issue 48, item 4), through the real ``pynvml`` and
``NvmlReader`` on the NVML test library (tests/nvml).

``nvmlDeviceGetMigMode`` gives ``[current, pending]``: MIG devices exist while the current mode is
on; the pending mode is what the next GPU reset makes current (nvml.h) and changes nothing until
then. The reader asks every GPU's mode on every read (``sources/nvml/mig.py`` ``follow_mode``),
so a change is in the first read after NVML reports it: a bound of one tick. The test library
serves a mode changed at runtime as a sample reading's own ``mig_mode`` (tests/nvml/README.md).

- the reader, table-driven: a sequence of GPU 1's modes, one per sample -> what each read says;
- every surface follows the reading: one ``Agent`` ticking over ``NvmlReader`` in a process that
  loaded the test library (this module run as ``python -m tests.agent.test_mig_mode``), each tick's
  labels, telemetry annotation, device plugin inventory (whole GPUs and the ``1g.10gb`` profile)
  and ResourceSlice devices.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import nvmltestlib  # (its testlib_env would be collected as a test if imported)
from tests.agent.mig_mode_support import (  # the names moved out, for this file's tests
    GPU1_MIG_UUIDS,  # noqa: F401
    OFF,  # noqa: F401
    ON,  # noqa: F401
    Mode,  # noqa: F401
    gpu1,  # noqa: F401
    trace,  # noqa: F401
)
from tests.nvmltestlib import (
    MIG_MIXED,
    ROOT,
    nvml_worker_fixture,  # noqa: F401 - fixture
    testlib_fixture,  # noqa: F401 - fixture
)

P = "omaticaya.io/"
PROFILE = "1g.10gb"







GPU1 = "GPU-e26e8cb2-ee20-51d1-b6bb-da4b063db955"  # GPU 1's UUID in mig-mixed-trace.json

#: GPU 1's static mode, its mode per sample, and what each read says of it: MIG on (with its
#: seven MIG devices) / off, or the GPU's error
CASES = {
    "turned on": (OFF, [OFF, ON, ON], [False, True, True]),
    "turned off": (ON, [ON, OFF, OFF], [True, False, False]),
    "on, off and on again": (OFF, [OFF, ON, OFF, ON], [False, True, False, True]),
    "a pending mode alone changes nothing": (
        OFF, [OFF, (0, 1), (0, 1), ON], [False, False, False, True]
    ),
    "pending, then the reset makes it current": (OFF, [OFF, (0, 1), ON], [False, False, True]),
    "pending off on a GPU with MIG on": (ON, [ON, (1, 0), OFF], [True, True, False]),
    "an unreadable mode keeps the one known": (
        ON, [ON, "NVMLError_Unknown", ON, OFF], [True, True, True, False]
    ),
    "not supported now keeps the one known": (
        ON, [ON, "NVMLError_NotSupported", ON, OFF], [True, True, True, False]
    ),
    "lost while asked: that GPU's error, then read again": (
        OFF, [OFF, "NVMLError_GpuIsLost", ON], [False, "NVMLError_GpuIsLost", True]
    ),
}  # fmt: skip


def said(gpu: dict[str, Any], uuids: list[str]) -> bool | str:
    """What one read says of a GPU: its error, or whether MIG is on (checked against its MIG
    devices, ``uuids`` then, and its utilisation)."""
    if gpu["error"] is not None:
        return str(gpu["error"])
    if gpu["mig_enabled"]:
        assert [m["uuid"] for m in gpu["mig_devices"]] == uuids, gpu["mig_devices"]
        assert [m["profile"] for m in gpu["mig_devices"]] == [PROFILE] * 7
        assert gpu["utilization_pct"] is None
        return True
    assert gpu["mig_devices"] == [] and gpu["utilization_pct"] is not None, gpu
    return False


@pytest.mark.parametrize(("facts", "modes", "expected"), CASES.values(), ids=CASES.keys())
def test_each_read_follows_the_mig_mode(
    nvml_worker, tmp_path: Path, facts: tuple[int, int], modes: list[Mode], expected: list[Any]
) -> None:
    worker = nvml_worker(trace(tmp_path / "t.json", facts, modes), tmp_path / "sample")
    gpu0_migs = [m["uuid"] for m in json.loads(MIG_MIXED.read_text())["devices"][0]["mig_devices"]]
    got = []
    for index in range(len(modes)):
        worker.advance(index)
        snap = worker.read()
        assert snap["error"] is None
        assert said(snap["gpus"][0], gpu0_migs) is True  # GPU 0 keeps its MIG devices
        got.append(said(snap["gpus"][1], GPU1_MIG_UUIDS))
    assert got == expected
    failed = {e for (call, e) in worker.errors() if call == "nvmlDeviceGetMigMode"}
    assert failed == {m for m in modes if m in ("NVMLError_Unknown", "NVMLError_GpuIsLost")}


def test_the_mode_is_asked_once_per_gpu_per_read(nvml_worker, tmp_path: Path) -> None:
    """The cost of the bound: one ``nvmlDeviceGetMigMode`` per GPU per read, and the facts read
    again only on a change (one more call then, from ``read_facts``)."""
    worker = nvml_worker(trace(tmp_path / "t.json", OFF, [OFF, OFF, ON]), tmp_path / "sample")

    def asked() -> int:
        return int(worker.request({"cmd": "calls"})["calls"]["nvmlDeviceGetMigMode"])

    worker.read()  # nvmlInit: the facts (one each) and the first read (one each)
    assert asked() == 2 * 2
    worker.advance(1)
    worker.read()
    assert asked() == 2 * 2 + 2
    worker.advance(2)
    worker.read()
    assert asked() == 2 * 2 + 2 + 2 + 1  # GPU 1 changed: its facts read again


# -- every surface follows the reading ------------------------------------------------------


def surfaces(result: Any, plugins: Any, slices: Any) -> dict[str, Any]:
    """One tick's surfaces, as this module's runner prints them."""
    labels = result.desired.labels
    telemetry = json.loads(result.desired.annotations[P + "telemetry"])
    gpu = next(g for g in telemetry["gpus"] if g["index"] == 1)
    return {
        "labels": {
            k.removeprefix(P): v
            for k, v in labels.items()
            if k.startswith(P + "gpu-1.") or k.startswith(P + "mig") or k == P + "gpu.healthy-count"
        },
        "telemetry": {
            "mig_enabled": gpu.get("mig_enabled", False),
            "mig_devices": [m["uuid"] for m in gpu.get("mig_devices", [])],
        },
        "device_plugin": {
            str(profile): [(d.id, d.healthy) for d in plugin.devices()]
            for profile, plugin in plugins.plugins.items()
        },
        "resource_slice": sorted(  # each device by its UUID attribute (the GPU's or MIG's)
            d.render()["attributes"]["uuid"]["string"]
            for d in slices.desired(result.snapshot, result.health)
        ),
    }


def run(trace_path: Path, sample_file: Path, steps: list[int]) -> list[dict[str, Any]]:
    """In this process (the test library loaded): an ``Agent`` over ``NvmlReader``, the device
    plugins on it and the ResourceSlice writer, all dry; one tick per sample index in ``steps``;
    each tick's ``surfaces``."""
    import os
    import tempfile

    from omaticaya_py.agent import Agent, NodeApi
    from omaticaya_py.agent.resourceslice_writer import ResourceSliceWriter
    from omaticaya_py.deviceplugin import DevicePluginSet
    from omaticaya_py.deviceplugin.config import PluginConfig
    from omaticaya_py.sources.nvml import NvmlReader
    from tests.helpers import settings

    s = settings()
    reader = NvmlReader(watch_xid=False)
    agent = Agent(s, reader, NodeApi(None, dry_run=True, lease=None), attribution=None)
    folder = Path(tempfile.mkdtemp(prefix="mig-mode-"))
    plugins = DevicePluginSet(agent, PluginConfig("example.com/gpu", folder, units={PROFILE: []}))
    slices = ResourceSliceWriter(s, None, agent.cache)
    out = []
    try:
        for index in steps:
            tmp = sample_file.with_suffix(".tmp")
            tmp.write_text(f"{index}\n")
            os.replace(tmp, sample_file)
            out.append(surfaces(agent.tick(), plugins, slices))
    finally:
        reader.close()
    return out


def test_every_surface_follows_a_mig_mode_turned_on_and_off(testlib, tmp_path: Path) -> None:
    """GPU 1 whole, then MIG on (seven 1g.10gb), then off again: the labels, the telemetry
    annotation, the device plugin's inventory and the ResourceSlice follow at the first tick."""
    path = trace(tmp_path / "t.json", OFF, [OFF, ON, OFF])
    sample_file = tmp_path / "sample"
    sample_file.write_text("0\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tests.agent.test_mig_mode", str(path), str(sample_file), "0", "1", "2"],
        cwd=ROOT,
        env=nvmltestlib.testlib_env(path, sample_file),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    ticks = [json.loads(line) for line in proc.stdout.splitlines()]
    gpu0_migs = [m["uuid"] for m in json.loads(MIG_MIXED.read_text())["devices"][0]["mig_devices"]]
    whole = {
        "labels": {"gpu.healthy-count": "8", "gpu-1.health": "Healthy", "mig.strategy": "mixed",
                   "mig-1g.10gb.count": "7", "mig-1g.10gb.healthy-count": "7"},
        "telemetry": {"mig_enabled": False, "mig_devices": []},
        "device_plugin": {"None": [[GPU1, True]],
                          PROFILE: [[u, True] for u in gpu0_migs]},
        "resource_slice": sorted([*gpu0_migs, GPU1]),
    }  # fmt: skip
    split = {
        "labels": {"gpu.healthy-count": "14", "gpu-1.health": "Healthy", "gpu-1.mig.enabled": "true",
                   "mig.strategy": "mixed", "mig-1g.10gb.count": "14",
                   "mig-1g.10gb.healthy-count": "14"},
        "telemetry": {"mig_enabled": True, "mig_devices": GPU1_MIG_UUIDS},
        "device_plugin": {"None": [],
                          PROFILE: [[u, True] for u in gpu0_migs + GPU1_MIG_UUIDS]},
        "resource_slice": sorted(gpu0_migs + GPU1_MIG_UUIDS),
    }  # fmt: skip
    for tick, expected in zip(ticks, [whole, split, whole], strict=True):
        labels = {k: v for k, v in tick["labels"].items() if k in expected["labels"] or
                  k == "gpu-1.mig.enabled"}  # fmt: skip
        assert labels == expected["labels"]
        assert tick["telemetry"] == expected["telemetry"]
        assert tick["device_plugin"] == expected["device_plugin"]
        assert tick["resource_slice"] == expected["resource_slice"]


def test_the_bench_prints_before_and_after_side_by_side(testlib) -> None:
    """``bench/mig_mode.py --testlib --quick`` (the figures are docs/benchmarks.md's, never
    asserted): both cases, the ratio, and one ``nvmlDeviceGetMigMode`` per GPU per tick after."""
    proc = subprocess.run(
        [sys.executable, "bench/mig_mode.py", "--testlib", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[1]: line.split() for line in proc.stdout.splitlines()
            if line.split()[:1] == ["8"] and line.split()[1] in ("before", "after")}  # fmt: skip
    assert set(rows) == {"before", "after"}
    # (8 GPUs: multi-gpu-trace.json's)
    assert (rows["before"][-2], rows["after"][-2]) == ("0.00", "8.00")  # calls per tick
    assert "ratio after / before: CPU " in proc.stdout


if __name__ == "__main__":  # the runner of the test above, in a process with the test library
    from loguru import logger

    logger.remove()
    for tick in run(Path(sys.argv[1]), Path(sys.argv[2]), [int(a) for a in sys.argv[3:]]):
        print(json.dumps(tick), flush=True)

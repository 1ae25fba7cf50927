"""Helpers for tests that run the real ``pynvml`` against the NVML test library (tests/nvml/).

The test library is ``libnvidia-ml.so.1`` built from tests/nvml/nvml_testlib.c; it serves a
recorded trace (docs/trace-format.md) through NVML's C ABI. The dynamic loader reads
``LD_LIBRARY_PATH`` when a process starts, so the library is only ever loaded in a subprocess
(``NvmlWorker``): the pytest process keeps the real NVML of a GPU machine.

- ``build_testlib()`` builds it once per session (``tests/nvml/build``) and returns its folder;
- ``testlib_env(trace, sample_file, speed, faults)`` is the environment of a process that loads
  it (``faults``: NVML calls that fail, ``NVML_TESTLIB_FAULTS``);
- ``scenario(path, sample(...), ...)`` writes a small trace, one fault per sample (``fault``),
  GPM readings with ``gpm(...)``;
- ``topology_scenario(path, [gpu(...), ...])`` writes a format-version-3 trace of whole H100s
  wired as given (``nvlink(...)`` for each link), and ``fake_sysfs(root, trace)`` the sysfs
  tree of its GPUs (PCIe root, NUMA node) for the reader's ``sysfs_root``;
- ``NvmlWorker`` runs ``python -m tests.nvml_worker`` under that environment and talks to it
  with line-based JSON (see tests/nvml_worker.py);
- ``testlib_unavailable_reason()`` / ``requires_testlib``: skip cleanly where ``cc`` or cJSON
  is missing;
- fixtures ``testlib`` (the built folder; skips where it cannot be built) and ``nvml_worker``
  (a factory of workers closed after the test): import ``testlib_fixture`` and
  ``nvml_worker_fixture`` into a test module to use them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "tests" / "nvml" / "build"
_built: Path | None = None
_build_error: str | None = None
_build_lock = threading.Lock()


def _cjson_present() -> bool:
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        return False
    probe = subprocess.run(
        [cc, "-E", "-x", "c", "-"],
        input="#include <cjson/cJSON.h>\n",
        capture_output=True,
        text=True,
        check=False,
    )
    return probe.returncode == 0


def testlib_unavailable_reason() -> str | None:
    """Why the test library cannot be built here, or None when it can."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return "no C compiler (cc) to build the NVML test library"
    if not _cjson_present() and not (os.geteuid() == 0 and shutil.which("apt-get")):
        return "cJSON headers missing (apt-get install libcjson-dev) for the NVML test library"
    return None


def build_testlib() -> Path:
    """Build tests/nvml once per session; the folder holding ``libnvidia-ml.so.1``."""
    global _built, _build_error
    with _build_lock:
        if _built is not None:
            return _built
        if _build_error is not None:
            raise RuntimeError(_build_error)
        proc = subprocess.run(
            ["bash", str(BUILD)], capture_output=True, text=True, check=False, timeout=600
        )
        if proc.returncode != 0:
            _build_error = f"tests/nvml/build failed ({proc.returncode}):\n{proc.stderr}"
            raise RuntimeError(_build_error)
        out = Path(proc.stdout.strip().splitlines()[-1])
        if not (out / "libnvidia-ml.so.1").is_file():
            _build_error = f"tests/nvml/build printed {out}, which has no libnvidia-ml.so.1"
            raise RuntimeError(_build_error)
        _built = out
        return out


def testlib_env(
    trace: Path | None,
    sample_file: Path | None = None,
    speed: float | None = None,
    faults: dict[str, str] | None = None,
) -> dict[str, str]:
    """``os.environ`` for a process that loads the test library and serves ``trace``
    (``None``: no trace, like a machine without a driver). ``faults``: NVML function ->
    ``"NVMLError_X"`` (every call fails) or ``"NVMLError_X@N"`` (after N calls), what no trace
    sample can say (``NVML_TESTLIB_FAULTS``, tests/nvml/README.md)."""
    lib = build_testlib()
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(lib), env.get("LD_LIBRARY_PATH", "")) if p
    )
    env.pop("NVML_TESTLIB_TRACE", None)
    if trace is not None:
        env["NVML_TESTLIB_TRACE"] = str(trace)
    env.pop("NVML_TESTLIB_SAMPLE_FILE", None)
    env.pop("NVML_TESTLIB_SPEED", None)
    env.pop("NVML_TESTLIB_FAULTS", None)
    if faults:
        env["NVML_TESTLIB_FAULTS"] = ",".join(f"{fn}={err}" for fn, err in faults.items())
    if sample_file is not None:
        env["NVML_TESTLIB_SAMPLE_FILE"] = str(sample_file)
    if speed is not None:
        env["NVML_TESTLIB_SPEED"] = repr(float(speed))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


class WorkerError(RuntimeError):
    """The worker died or answered with an error."""


class NvmlWorker:
    """``python -m tests.nvml_worker`` under ``testlib_env``: an ``NvmlReader`` (and raw
    ``pynvml``) in a process that loaded the test library.

    ``read()`` -> the NodeSnapshot as a dict (``errors``: the reader's error counter as a list
    of ``[call, error name, count]``); ``pynvml(fn, *args)`` -> ``{"ok": result}`` or
    ``{"error": "NVMLError_..."}``; ``close()``; ``advance(index)`` writes the sample file.
    """

    def __init__(
        self,
        trace: Path | None,
        sample_file: Path | None = None,
        speed: float | None = None,
        *,
        watch_xid: bool = True,
        reader: bool = True,
        timeout: float = 30.0,
        faults: dict[str, str] | None = None,
        sysfs_root: Path | None = None,
        topology_raises: bool = False,
    ) -> None:
        self.sample_file = sample_file
        self.timeout = timeout
        if sample_file is not None and not sample_file.exists():
            sample_file.write_text("0\n")
        args = [sys.executable, "-m", "tests.nvml_worker"]
        if not watch_xid:
            args.append("--no-watch-xid")
        if not reader:
            args.append("--no-reader")
        if topology_raises:
            args.append("--topology-raises")
        env = testlib_env(trace, sample_file, speed, faults)
        env.pop("OMATICAYA_TEST_SYSFS_ROOT", None)
        if sysfs_root is not None:
            env["OMATICAYA_TEST_SYSFS_ROOT"] = str(sysfs_root)
        self.proc = subprocess.Popen(
            args,
            cwd=str(ROOT),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._stderr: list[str] = []
        self._err_thread = threading.Thread(target=self._drain, daemon=True)
        self._err_thread.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError as exc:
            raise WorkerError(f"worker gone: {''.join(self._stderr)}") from exc
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()))
        reader.start()
        reader.join(self.timeout)
        if not result or not result[0]:
            self.proc.kill()
            raise WorkerError(f"no answer to {message}; stderr:\n{''.join(self._stderr)}")
        answer = json.loads(result[0])
        if "fatal" in answer:
            raise WorkerError(answer["fatal"])
        return answer

    def read(self) -> dict[str, Any]:
        return self.request({"cmd": "read"})["snapshot"]

    def errors(self) -> dict[tuple[str, str], int]:
        return {(c, e): n for c, e, n in self.request({"cmd": "errors"})["errors"]}

    def topology(self) -> dict[str, Any] | None:
        """The reader's ``NodeTopology`` as data (tests/nvml_worker.py ``topology_matrix``):
        ``matrix``, ``islands`` (index as a string -> name), ``gpus``, ``pairs``."""
        return self.request({"cmd": "topology_matrix"})["topology"]

    def calls(self) -> dict[str, int]:
        """``NvmlReader.calls_by_name()``'s counts."""
        return self.request({"cmd": "calls"})["calls"]

    def pynvml(self, fn: str, *args: Any) -> dict[str, Any]:
        """``pynvml.<fn>(*args)``; arguments ``{"handle": i}`` / ``{"mig": [i, slot]}`` /
        ``{"event_set": name}`` name objects the worker keeps."""
        return self.request({"cmd": "pynvml", "fn": fn, "args": list(args)})

    def call(self, fn: str, *args: Any) -> Any:
        """Like ``pynvml`` but the result itself; raise ``WorkerError`` on an NVML error."""
        answer = self.pynvml(fn, *args)
        if "error" in answer:
            raise WorkerError(f"{fn}{tuple(args)}: {answer['error']}")
        return answer["ok"]

    def create_event_set(self, name: str) -> None:
        """``nvmlEventSetCreate()`` kept in the worker as ``{"event_set": name}``."""
        answer = self.request(
            {"cmd": "pynvml", "fn": "nvmlEventSetCreate", "args": [], "keep": name}
        )
        if "error" in answer:
            raise WorkerError(f"nvmlEventSetCreate: {answer['error']}")

    def raw(self, fn: str, handle: Any, **kwargs: Any) -> dict[str, Any]:
        """The C function itself (see tests/nvml_worker.py ``raw``)."""
        return self.request({"cmd": "raw", "fn": fn, "handle": handle, **kwargs})

    def advance(self, index: int) -> None:
        assert self.sample_file is not None, "a worker without a sample file follows the clock"
        tmp = self.sample_file.with_suffix(".tmp")
        tmp.write_text(f"{index}\n")
        os.replace(tmp, self.sample_file)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.request({"cmd": "close"})
            except (WorkerError, OSError, ValueError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> NvmlWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


MIG_MIXED = ROOT / "tests" / "data" / "mig-mixed-trace.json"


def fault(name: str) -> dict[str, str]:
    """What NVML answers instead of a value: ``{"nvml_error": name}`` (trace format)."""
    return {"nvml_error": name, "message": name.removeprefix("NVMLError_")}


def sample(
    *,
    gpu0: dict[str, Any] | None = None,
    gpu1: dict[str, Any] | None = None,
    xids: tuple[tuple[int, int], ...] = (),
    error: str | None = None,
) -> dict[str, Any]:
    """One sample for ``scenario``: the first reading of ``mig-mixed-trace.json`` (GPU 0 in
    seven MIG devices, GPU 1 whole) with ``gpuN``'s fields replaced (``None``: absent, which
    NVML answers NotSupported; ``"mig": {slot: reading}`` replaces MIG readings), or
    ``gpuN=fault(...)``: the whole GPU's error; ``error``: the library's (no ``gpus``);
    ``xids``: ``(gpu index, Xid)`` delivered when the sample becomes current."""
    if error is not None:
        return {"nvml_error": error, "message": error}
    gpus = json.loads(MIG_MIXED.read_text())["samples"][0]["gpus"]
    for index, edit in enumerate((gpu0, gpu1)):
        if edit is None:
            continue
        if "nvml_error" in edit:
            gpus[index] = {"index": index, **edit}
            continue
        for key, new in edit.items():
            if key == "mig":
                for slot, reading in new.items():
                    gpus[index]["mig_devices"][slot] = {"index": slot, **reading}
            elif new is None:
                gpus[index].pop(key, None)
            else:
                gpus[index][key] = new
    out: dict[str, Any] = {"gpus": gpus}
    if xids:
        out["xid_events"] = [{"index": i, "xid": x} for i, x in xids]
    return out


def gpm(supported: bool = True, **pct: float | dict[str, str]) -> dict[str, Any]:
    """A reading's ``gpm`` object (trace format): ``gpm(sm_active_pct=94.9, graphics_pct=98.4,
    sm_occupancy_pct=40.0, tensor_active_pct=92.1, dram_bw_pct=23.5)``; a value may be
    ``fault(...)``; ``supported=False``: the GPU says it has no GPM. Put it in a sample with
    ``sample(gpu1={"gpm": gpm(...)})``; a reading without ``gpm`` has no GPM."""
    return {"supported": supported, **pct}


def scenario(
    path: Path,
    *samples: dict[str, Any],
    devices: Callable[[list[Any]], None] | None = None,
    times: Sequence[float] | None = None,
) -> Path:
    """Write a trace of ``samples`` (``sample(...)``) one second apart (t = 0, 1, ...), or at
    ``times`` (one per sample, increasing), over ``mig-mixed-trace.json``'s static facts, which
    ``devices`` may edit in place; returns ``path``. Serve it with a sample file to step
    through the samples."""
    doc = json.loads(MIG_MIXED.read_text())
    doc.pop("phases", None)
    doc["interval_s"] = 1.0
    if times is None:
        times = range(len(samples))
    assert len(times) == len(samples), "one time per sample"
    doc["samples"] = [{"t": float(t), **s} for t, s in zip(times, samples, strict=True)]
    if devices is not None:
        devices(doc["devices"])
    path.write_text(json.dumps(doc))
    return path


H100 = ROOT / "tests" / "data" / "h100-trace.json"


def nvlink(link: int, remote: str, remote_type: int = 0, state: int = 1) -> dict[str, Any]:
    """One ``devices[].nvlinks[]`` entry (trace format 3): link number ``link``, its far end's
    PCI address ``remote`` (NVML's ``"00000000:07:00.0"`` form), ``remote_type`` 0 a GPU, 2 an
    NVSwitch, ``state`` 1 active, 0 inactive."""
    return {
        "link": link,
        "state": state,
        "remote_pci_bus_id": remote,
        "remote_device_type": remote_type,
    }


def gpu(pci_bus_id: str, **topology: Any) -> dict[str, Any]:
    """One GPU of ``topology_scenario``: its PCI address (NVML's form) and its version 3 keys
    (``topology``, ``numa_node``, ``cpu_affinity``, ``pcie_root``, ``nvlinks``, ``p2p_read``,
    ``fabric``; absent: NVML answers NotSupported)."""
    return {"pci_bus_id": pci_bus_id, **topology}


def topology_scenario(path: Path, gpus: Sequence[dict[str, Any]], samples: int = 1) -> Path:
    """Write a trace of format version 3 with one whole H100 per ``gpus`` entry (``gpu(...)``):
    the static facts of ``h100-trace.json``'s GPU with its own index, UUID
    (``GPU-0000000<i>-...``), serial and the entry's keys, and ``samples`` samples one second
    apart, each the recording's first reading for every GPU; returns ``path``. Topology keys
    that name peers (``topology``, ``p2p_read``) take string indices as the format does."""
    src = json.loads(H100.read_text())
    base, reading = src["devices"][0], src["samples"][0]["gpus"][0]
    devices = []
    for index, entry in enumerate(gpus):
        device = {**base, "index": index, "serial": f"{base['serial']}{index}"}
        device["uuid"] = f"GPU-{index:08d}" + base["uuid"][len("GPU-00000000") :]
        device.update({k: v for k, v in entry.items() if v is not None})
        devices.append(device)
    doc = {k: v for k, v in src.items() if k not in ("samples", "phases", "devices")}
    doc.update(format_version=3, device_count=len(devices), devices=devices, interval_s=1.0)
    doc["samples"] = [
        {"t": float(t), "gpus": [{**reading, "index": i} for i in range(len(devices))]}
        for t in range(samples)
    ]
    path.write_text(json.dumps(doc))
    return path


def fake_sysfs(root: Path, trace: Path, numa_nodes: dict[int, int] | None = None) -> Path:
    """A sysfs tree under ``root`` for the GPUs of ``trace`` (its ``devices[]``), as the reader's
    ``sysfs_root``: per GPU at BDF ``b`` with ``pcie_root`` ``pci<d>:<bus>``, the folder
    ``devices/pci<d>:<bus>/<d>:<bus>:00.0/<b>`` (the root port, then the GPU) holding
    ``numa_node`` (``numa_nodes[index]`` when given, else the trace's value, -1 when absent),
    and the symlink ``bus/pci/devices/<b>`` to it, as Linux links them. A GPU without
    ``pcie_root`` sits under ``devices/virtual`` (a path that names no root). Returns
    ``root``."""
    from omaticaya_py.core.model.topology import pci_bdf

    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True, exist_ok=True)
    for device in json.loads(trace.read_text())["devices"]:
        bdf = pci_bdf(device.get("pci_bus_id"))
        if bdf is None:
            continue
        pcie_root = device.get("pcie_root")
        if pcie_root:
            port = f"{pcie_root.removeprefix('pci')}:00.0"
            folder = root / "devices" / pcie_root / port / bdf
        else:
            folder = root / "devices" / "virtual" / bdf
        folder.mkdir(parents=True, exist_ok=True)
        numa = (numa_nodes or {}).get(device["index"], device.get("numa_node"))
        (folder / "numa_node").write_text(f"{numa if isinstance(numa, int) else -1}\n")
        link = links / bdf
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(folder, links))
    return root


requires_testlib = pytest.mark.skipif(
    testlib_unavailable_reason() is not None, reason=testlib_unavailable_reason() or ""
)


@pytest.fixture(scope="session", name="testlib")
def testlib_fixture() -> Path:
    """The folder holding the built ``libnvidia-ml.so.1`` (skips when it cannot be built)."""
    reason = testlib_unavailable_reason()
    if reason:
        pytest.skip(reason)
    return build_testlib()


@pytest.fixture(name="nvml_worker")
def nvml_worker_fixture(testlib: Path, tmp_path: Path) -> Iterator[Callable[..., NvmlWorker]]:
    """Factory: ``nvml_worker(trace, sample_file=..., speed=..., watch_xid=...)``; every
    worker it starts is closed after the test."""
    workers: list[NvmlWorker] = []

    def start(trace: Path | None, sample_file: Path | None = None, **kwargs: Any) -> NvmlWorker:
        worker = NvmlWorker(trace, sample_file, **kwargs)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        worker.close()

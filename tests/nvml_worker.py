"""A process that loaded the NVML test library: ``python -m tests.nvml_worker``.

Started by ``tests.nvmltestlib.NvmlWorker`` with ``LD_LIBRARY_PATH`` pointing at the test
library. Creates ``omaticaya_py.sources.nvml.NvmlReader(watch_xid=...)`` and answers one JSON object
per line on stdin with one JSON object per line on stdout:

- ``{"cmd": "read"}`` -> ``{"snapshot": {...}}``: ``dataclasses.asdict`` of the NodeSnapshot,
  datetimes as ISO strings, plus ``errors``: the reader's counter as ``[[call, name, n], ...]``;
- ``{"cmd": "errors"}`` -> ``{"errors": [[call, name, n], ...]}``;
- ``{"cmd": "xid_dropped"}`` -> ``{"dropped": NvmlReader.xid_events_dropped}``;
- ``{"cmd": "calls"}`` -> ``{"calls": {call: n}}``: ``NvmlReader.calls_by_name()``'s counts;
- ``{"cmd": "topology", "a": uuid, "b": uuid}`` -> ``{"level": n}``: the common-ancestor level
  of the two GPUs' pair in the reader's topology (``NodeTopology.link``), ``null`` when either
  GPU or the pair is unknown;
- ``{"cmd": "topology_matrix"}`` -> ``{"topology": null}`` before a read (or while NVML is down),
  else ``{"topology": {"matrix": NodeTopology.matrix(), "islands": {index: name},
  "gpus": [GpuTopology as a dict], "pairs": [[a, b, PairLink as a dict], ...]}}`` of the
  reader's topology (``topology_data``);
- ``{"cmd": "pynvml", "fn": "nvmlDeviceGetName", "args": [...]}`` -> ``{"ok": result}`` or
  ``{"error": "NVMLError_..."}`` (the pynvml exception class name). Arguments may name objects
  kept here: ``{"handle": i}`` (nvmlDeviceGetHandleByIndex(i)), ``{"mig": [i, slot]}``,
  ``{"event_set": name}`` (created by ``nvmlEventSetCreate`` with ``"keep": name``). ctypes
  results are converted: structures to dicts of their fields, device handles to
  ``{"address": pointer value}``, bytes to str;
- ``{"cmd": "raw", "fn": "nvmlDeviceGetName", "handle": i, "length": n}`` calls the C function
  itself with a buffer of ``n`` bytes -> ``{"ret": code, "value": str}`` (the short-buffer
  checks pynvml's fixed buffers never reach); ``"fn": "nvmlDeviceGetComputeRunningProcesses_v3"``
  with ``"count": n`` (``null``: a NULL array) -> ``{"ret": code, "count": n}``;
  ``"fn": "nvmlDeviceGetGpuFabricInfoV"`` with ``"version": 2 | 3 | n`` (pynvml's
  ``c_nvmlGpuFabricInfo_v2_t`` / ``_v3_t`` with that struct version, or the v2 struct with the
  raw version ``n``) -> ``{"ret": code, "info": the struct's fields}``;
- ``{"cmd": "wake", "how": "free" | "shutdown"}``: a thread waits in ``nvmlEventSetWait_v2``
  (30 s) on a new set while this one frees the set or shuts NVML down (after one
  ``nvmlInit`` of its own) -> ``{"waiter": "NVMLError_..." | "event", "waited_s": s}``;
- ``{"cmd": "record", "t": s}``: one ``omaticaya_py.sources.record.Recorder.sample(t)`` (the
  recorder is made at the first one, interval 1 s) -> ``{"sample": {...}}``;
  ``{"cmd": "record_close"}`` closes it -> ``{"doc": the trace document, "readings": n}``;
- ``{"cmd": "reinit"}``: ``NvmlReader.close()``; the next read initialises NVML again;
- ``{"cmd": "close"}`` -> ``{"ok": true}``, then the process exits.
Startup options: ``--no-watch-xid`` (no Xid thread), ``--no-reader`` (raw pynvml only),
``--topology-raises`` (the reader's ``read_topology`` raises ``RuntimeError``: a bug in the
topology model, beside the real NVML calls).
Environment read here only: ``OMATICAYA_TEST_SYSFS_ROOT``, the ``sysfs_root`` of the reader and
the recorder (a fake sysfs tree: ``tests.nvmltestlib.fake_sysfs``; unset: ``/sys``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pynvml


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if (
        isinstance(value, pynvml.c_nvmlDevice_t)
        or type(value).__name__ == "LP_struct_c_nvmlDevice_t"
    ):
        return {"address": ctypes.cast(value, ctypes.c_void_p).value}
    if isinstance(value, ctypes.Array):
        return [_plain(v) for v in value]
    if isinstance(value, ctypes.Structure):
        return {name: _plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, ctypes.Union):
        return {name: _plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, pynvml.nvmlFriendlyObject):
        return {k: _plain(v) for k, v in vars(value).items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, ctypes._SimpleCData):
        return value.value
    return value


def topology_data(topology: Any) -> dict[str, Any] | None:
    """A ``NodeTopology`` as JSON data: its ``matrix()``, ``islands()`` (keys as strings), its
    GPUs and its pairs; ``None`` for ``None``."""
    if topology is None:
        return None
    return {
        "matrix": topology.matrix(),
        "islands": {str(k): v for k, v in topology.islands().items()},
        "gpus": [dataclasses.asdict(g) for g in topology.gpus],
        "pairs": [
            [a, b, dataclasses.asdict(link)] for (a, b), link in sorted(topology.pairs.items())
        ],
    }


def pair_level(topology: Any, uuid_a: str, uuid_b: str) -> int | None:
    """The ``PairLink.level`` of two GPUs named by UUID in ``topology``; ``None`` when either
    is not in it or their pair is unknown."""
    if topology is None:
        return None
    index = {g.uuid: g.index for g in topology.gpus if g.uuid}
    if uuid_a not in index or uuid_b not in index:
        return None
    link = topology.link(index[uuid_a], index[uuid_b])
    return link.level if link is not None else None


def _sysfs_root() -> Path:
    return Path(os.environ.get("OMATICAYA_TEST_SYSFS_ROOT") or "/sys")


class Worker:
    def __init__(self, watch_xid: bool, with_reader: bool) -> None:
        self.reader = None
        if with_reader:
            from omaticaya_py.sources.nvml import NvmlReader

            self.reader = NvmlReader(watch_xid=watch_xid, sysfs_root=_sysfs_root())
        self.event_sets: dict[str, Any] = {}
        self.recorder: Any = None

    def _arg(self, arg: Any) -> Any:
        if isinstance(arg, dict):
            if "handle" in arg:
                return pynvml.nvmlDeviceGetHandleByIndex(arg["handle"])
            if "mig" in arg:
                parent = pynvml.nvmlDeviceGetHandleByIndex(arg["mig"][0])
                return pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, arg["mig"][1])
            if "event_set" in arg:
                return self.event_sets[arg["event_set"]]
        return arg

    def raw(self, message: dict[str, Any]) -> dict[str, Any]:
        fn = pynvml._nvmlGetFunctionPointer(message["fn"])
        handle = (
            self._arg(message["handle"])
            if isinstance(message["handle"], dict)
            else (pynvml.nvmlDeviceGetHandleByIndex(message["handle"]))
        )
        if message["fn"] == "nvmlDeviceGetGpuFabricInfoV":
            version = message["version"]
            info = (
                pynvml.c_nvmlGpuFabricInfo_v3_t()
                if version == 3
                else pynvml.c_nvmlGpuFabricInfo_v2_t()
            )
            if version not in (2, 3):
                info.version = version
            ret = fn(handle, ctypes.byref(info))
            return {"ret": ret, "info": _plain(info)}
        if message["fn"] == "nvmlDeviceGetComputeRunningProcesses_v3":
            count = ctypes.c_uint(message["count"] or 0)
            infos = (pynvml.c_nvmlProcessInfo_v3_t * max(1, count.value))()
            ret = fn(handle, ctypes.byref(count), infos if message["count"] is not None else None)
            return {"ret": ret, "count": count.value}
        buf = ctypes.create_string_buffer(max(1, message["length"]))
        ret = fn(handle, buf, ctypes.c_uint(message["length"]))
        return {"ret": ret, "value": buf.value.decode(errors="replace")}

    def wake(self, how: str) -> dict[str, Any]:
        import threading
        import time

        pynvml.nvmlInit()
        event_set = pynvml.nvmlEventSetCreate()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, event_set)
        result: dict[str, Any] = {}
        entered = threading.Event()

        def wait() -> None:
            start = time.monotonic()
            entered.set()
            try:
                pynvml.nvmlEventSetWait_v2(event_set, 30000)
                result["waiter"] = "event"
            except pynvml.NVMLError as exc:
                result["waiter"] = type(exc).__name__
            result["waited_s"] = time.monotonic() - start

        waiter = threading.Thread(target=wait)
        waiter.start()
        entered.wait()
        time.sleep(0.2)  # let it block inside the library
        if how == "free":
            pynvml.nvmlEventSetFree(event_set)
            waiter.join(60)
            pynvml.nvmlShutdown()
        else:
            pynvml.nvmlShutdown()
            waiter.join(60)
        return result

    def errors(self) -> list[list[Any]]:
        if self.reader is None:
            return []
        return [[call, name, n] for (call, name), n in sorted(self.reader.errors.items())]

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        cmd = message.get("cmd")
        if cmd == "read":
            assert self.reader is not None, "started with --no-reader"
            snapshot = dataclasses.asdict(self.reader.read())
            snapshot["errors"] = self.errors()
            return {"snapshot": _plain(snapshot)}
        if cmd == "topology":
            assert self.reader is not None
            return {"level": pair_level(self.reader.topology, message["a"], message["b"])}
        if cmd == "topology_matrix":
            assert self.reader is not None
            return {"topology": topology_data(self.reader.topology)}
        if cmd == "errors":
            return {"errors": self.errors()}
        if cmd == "xid_dropped":
            assert self.reader is not None
            return {"dropped": self.reader.xid_events_dropped}
        if cmd == "calls":
            assert self.reader is not None
            return {"calls": {k: n for k, (n, _) in self.reader.calls_by_name().items()}}
        if cmd == "reinit":
            assert self.reader is not None
            self.reader.close()
            return {"ok": True}
        if cmd == "wake":
            return self.wake(message["how"])
        if cmd == "raw":
            return self.raw(message)
        if cmd == "record":
            if self.recorder is None:
                from omaticaya_py.sources.record.recorder import Recorder

                self.recorder = Recorder(1.0, sysfs_root=_sysfs_root())
            return {"sample": self.recorder.sample(message["t"])}
        if cmd == "record_close":
            self.recorder.close()
            return {"doc": self.recorder.doc, "readings": self.recorder.readings}
        if cmd == "pynvml":
            fn = getattr(pynvml, message["fn"])
            try:
                args = [self._arg(a) for a in message.get("args", [])]
                result = fn(*args)
            except pynvml.NVMLError as exc:
                return {"error": type(exc).__name__}
            if message["fn"] == "nvmlEventSetCreate" and "keep" in message:
                self.event_sets[message["keep"]] = result
                return {"ok": message["keep"]}
            return {"ok": _plain(result)}
        raise ValueError(f"unknown command {cmd!r}")


def _topology_raises() -> None:
    import importlib

    reader = importlib.import_module("omaticaya_py.sources.nvml.reader")

    def read_topology(*_: Any, **__: Any) -> Any:
        raise RuntimeError("a made-up bug in the topology model")

    reader.read_topology = read_topology


def main() -> int:
    if "--topology-raises" in sys.argv:
        _topology_raises()
    worker = Worker("--no-watch-xid" not in sys.argv, "--no-reader" not in sys.argv)
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if message.get("cmd") == "close":
            if worker.reader is not None:
                worker.reader.close()
            print(json.dumps({"ok": True}), flush=True)
            return 0
        try:
            answer = worker.handle(message)
        except Exception as exc:  # noqa: BLE001  (reported to the test, which fails on it)
            answer = {"fatal": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    if worker.reader is not None:
        worker.reader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

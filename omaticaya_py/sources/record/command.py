"""The ``omaticaya record`` loop: sample every interval for a duration (or until stopped) and
write the trace atomically."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .recorder import Recorder

__all__ = ["RecordError", "record"]


class RecordError(RuntimeError):
    """NVML never produced a reading: ``str()`` is one line naming the NVML error."""


def _write(doc: dict[str, Any], output: Path) -> None:
    """Write ``doc`` to ``output`` atomically (a temporary file in the same folder, renamed)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, output)


def record(
    output: Path,
    *,
    duration_s: float,
    interval_s: float,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, Any]:
    """Sample NVML every ``interval_s`` for ``duration_s`` seconds (or until ``stop`` is set, or
    SIGINT/SIGTERM in the main thread) and write the trace to ``output``. Returns the document.

    Raises ``RecordError`` when no sample could read the GPUs (the trace of errors is written
    all the same, for a bug report); ``OSError`` when ``output`` cannot be written.
    """
    stop = stop or threading.Event()
    restore: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            restore[sig] = signal.signal(sig, lambda *_: stop.set())
    recorder = Recorder(interval_s)
    start = clock()
    try:
        n = 0
        while not stop.is_set():
            due = start + n * interval_s
            if due - start > duration_s + 1e-9:
                break
            if stop.wait(max(due - clock(), 0.0)):
                break
            recorder.sample(clock() - start)
            n += 1
    finally:
        recorder.close()
        for sig, handler in restore.items():
            signal.signal(sig, handler)
    _write(recorder.doc, output)
    if recorder.readings == 0:
        errors = {s.get("nvml_error") for s in recorder.doc["samples"]} - {None}
        raise RecordError(
            f"NVML gave no reading ({', '.join(sorted(errors)) or 'no sample taken'}); "
            f"the errors are in {output}"
        )
    return recorder.doc

"""The NVML library as the reader calls it: its error classes, one counted call, and strings.

Every NVML error other than NotSupported that a ``Calls`` sees is counted in ``Calls.errors`` by
``(call, error name)``; NotSupported is an absent value (``None``), never an error.
"""

from __future__ import annotations

import ctypes
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from ...core.model.snapshot import GpuProcess

__all__ = [
    "LIBRARY_GONE",
    "LOST",
    "MIB",
    "Calls",
    "decode",
    "error_name",
    "handle_address",
    "nvml_available",
]

T = TypeVar("T")
#: bytes in one MiB (NVML reports memory in bytes)
MIB = 1024 * 1024
#: the NVML error of one GPU off the bus (that GPU's error, never the whole node's)
LOST = (pynvml.NVMLError_GpuIsLost,)
#: NVML errors that mean the library itself is unusable (re-initialise; nothing per GPU)
LIBRARY_GONE = (
    pynvml.NVMLError_Uninitialized,
    pynvml.NVMLError_DriverNotLoaded,
    pynvml.NVMLError_LibraryNotFound,
    pynvml.NVMLError_LibRmVersionMismatch,
)


def nvml_available() -> bool:
    """True when NVML initialises here (a GPU and its driver are present)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


def handle_address(handle: Any) -> int | None:
    """An NVML device handle's pointer value: NVML hands out one handle per GPU per session, so
    it names the GPU when ``nvmlDeviceGetUUID`` cannot (a GPU off the bus, Xid 79)."""
    return ctypes.cast(handle, ctypes.c_void_p).value


def error_name(exc: BaseException) -> str:
    """The name an NVML error is counted and reported under: its pynvml class name
    (``NVMLError_GpuIsLost``, ...)."""
    return type(exc).__name__


def decode(value: Any) -> Any:
    """NVML strings as ``str`` (older pynvml returns ``bytes``); anything else unchanged."""
    return value.decode() if isinstance(value, bytes) else value


class Calls:
    """NVML calls, counted.

    ``errors``: NVML errors by ``(call, error name)`` (NotSupported never counted);
    ``call_s``: seconds spent inside NVML calls made through ``call``/``field`` (bench);
    ``by_call``: per call name, ``[calls, seconds]`` (bench/tick.py --nvml: each call's share).
    """

    def __init__(self) -> None:
        self.errors: Counter[tuple[str, str]] = Counter()
        self.call_s = 0.0
        self.by_call: dict[str, list[float]] = {}

    def call(
        self,
        call: str,
        fn: Callable[..., T],
        *args: Any,
        expected: tuple[type[BaseException], ...] = (),
    ) -> T | None:
        """``fn(*args)``; NotSupported -> None; other NVML errors counted and re-raised
        (those in ``expected`` re-raised uncounted: an empty MIG slot is NotFound)."""
        start = time.perf_counter()
        try:
            return fn(*args)
        except pynvml.NVMLError_NotSupported:
            return None
        except expected:
            raise
        except pynvml.NVMLError as exc:
            self.errors[(call, error_name(exc))] += 1
            raise
        finally:
            spent = time.perf_counter() - start
            self.call_s += spent
            tally = self.by_call.get(call)
            if tally is None:
                tally = self.by_call[call] = [0, 0.0]
            tally[0] += 1
            tally[1] += spent

    def field(
        self,
        call: str,
        fn: Callable[..., T],
        *args: Any,
        expected: tuple[type[BaseException], ...] = (),
    ) -> T | None:
        """Like ``call`` but a non-fatal error of one field is absent (``None``), not a GPU
        failure; a lost GPU (``LOST``) or a gone library (``LIBRARY_GONE``) is re-raised.
        ``expected``: errors that are absent too, uncounted (as NotSupported)."""
        try:
            return self.call(call, fn, *args, expected=expected)
        except LOST + LIBRARY_GONE:
            raise
        except pynvml.NVMLError:
            return None


def processes(procs: Any) -> tuple[GpuProcess, ...]:
    """``nvmlDeviceGetComputeRunningProcesses``'s answer as processes: each one's ``pid`` (the
    host's PID namespace) and ``usedGpuMemory`` (bytes -> MiB; pynvml gives ``None`` for
    NVML_VALUE_NOT_AVAILABLE). ``None`` (the call failed) gives ``()``."""
    out = []
    for p in procs or ():
        used = getattr(p, "usedGpuMemory", None)
        out.append(GpuProcess(int(p.pid), int(used) // MIB if used is not None else None))
    return tuple(out)

"""A kernel on a real GPU from the tests, with nothing but the standard library: ``libcuda``
through ``ctypes``, a PTX module loaded with ``cuModuleLoadData`` (the driver JIT-compiles it).

``spin`` keeps each of its threads in an FMA loop until the SM's ``%clock64`` has advanced by
``cycles``: launched with many blocks it keeps every SM busy (SM activity near 100 %); with one
block of one thread it is a resident kernel that leaves the GPU otherwise idle (classic
utilisation near 100 %, SM activity below 1 % on an H100).

``Cuda.open()`` returns ``None`` (say why with ``Cuda.why``) where there is no driver or GPU, so
the tests that use it skip cleanly.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time

__all__ = ["SPIN_PTX", "Cuda"]

SPIN_PTX = r"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin(.param .u64 cycles, .param .u64 out)
{
    .reg .u64 %start, %now, %end, %c, %o;
    .reg .pred %p, %q;
    .reg .f32 %a, %b;
    ld.param.u64 %c, [cycles];
    ld.param.u64 %o, [out];
    mov.u64 %start, %clock64;
    add.u64 %end, %start, %c;
    mov.f32 %a, 0f3F800000;
    mov.f32 %b, 0f3F000000;
LOOP:
    fma.rn.f32 %a, %a, %b, %b;
    fma.rn.f32 %a, %a, %b, %b;
    fma.rn.f32 %a, %a, %b, %b;
    fma.rn.f32 %a, %a, %b, %b;
    fma.rn.f32 %a, %a, %b, %b;
    fma.rn.f32 %a, %a, %b, %b;
    fma.rn.f32 %a, %a, %b, %b;
    fma.rn.f32 %a, %a, %b, %b;
    mov.u64 %now, %clock64;
    setp.lt.u64 %p, %now, %end;
    @%p bra LOOP;
    setp.eq.f32 %q, %a, 0f7F7FFFFF;
    @%q st.global.f32 [%o], %a;
    ret;
}
"""

_CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13  # kHz
_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16


class Cuda:
    """One CUDA device's primary context and the ``spin`` kernel."""

    why = ""

    def __init__(self, lib: ctypes.CDLL, device: int) -> None:
        self.lib = lib
        self.device = ctypes.c_int()
        self._check(lib.cuDeviceGet(ctypes.byref(self.device), device), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self._check(
            lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.device),
            "cuDevicePrimaryCtxRetain",
        )
        self._check(lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        self.module = ctypes.c_void_p()
        self._check(
            lib.cuModuleLoadData(ctypes.byref(self.module), ctypes.c_char_p(SPIN_PTX.encode())),
            "cuModuleLoadData",
        )
        self.fn = ctypes.c_void_p()
        self._check(
            lib.cuModuleGetFunction(ctypes.byref(self.fn), self.module, b"spin"),
            "cuModuleGetFunction",
        )
        self.sm_count = self._attr(_CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.clock_hz = self._attr(_CU_DEVICE_ATTRIBUTE_CLOCK_RATE) * 1000

    @classmethod
    def open(cls, device: int = 0) -> Cuda | None:
        """The device's context with ``spin`` loaded, or ``None`` (``Cuda.why`` says why)."""
        name = ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            cls.why = f"no CUDA driver library here ({exc})"
            return None
        rc = lib.cuInit(0)
        if rc != 0:
            cls.why = f"cuInit failed: CUresult {rc}"
            return None
        try:
            return cls(lib, device)
        except RuntimeError as exc:
            cls.why = str(exc)
            return None

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUresult {rc}")

    def _attr(self, attr: int) -> int:
        value = ctypes.c_int()
        self._check(
            self.lib.cuDeviceGetAttribute(ctypes.byref(value), attr, self.device),
            "cuDeviceGetAttribute",
        )
        return value.value

    def uuid(self) -> str:
        """The device's UUID as NVML spells it (``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``)."""
        raw = (ctypes.c_ubyte * 16)()
        self._check(self.lib.cuDeviceGetUuid(raw, self.device), "cuDeviceGetUuid")
        h = bytes(raw).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def spin(self, seconds: float, blocks: int, threads: int = 1) -> float:
        """Launch ``spin`` for about ``seconds`` on ``blocks`` x ``threads`` (asynchronous);
        returns the launch time (``time.monotonic()``). ``synchronize()`` waits for it."""
        cycles = ctypes.c_uint64(int(seconds * self.clock_hz))
        out = ctypes.c_uint64(0)
        params = (ctypes.c_void_p * 2)(
            ctypes.cast(ctypes.byref(cycles), ctypes.c_void_p),
            ctypes.cast(ctypes.byref(out), ctypes.c_void_p),
        )
        self._check(
            self.lib.cuLaunchKernel(self.fn, blocks, 1, 1, threads, 1, 1, 0, None, params, None),
            "cuLaunchKernel",
        )
        return time.monotonic()

    def synchronize(self) -> None:
        self._check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def close(self) -> None:
        try:
            self.synchronize()
        finally:
            self.lib.cuModuleUnload(self.module)
            self.lib.cuDevicePrimaryCtxRelease(self.device)

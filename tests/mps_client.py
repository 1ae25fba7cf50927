"""A minimal CUDA client for tests/mps/test_mps_nvml.py: stdlib and ctypes only (no CUDA toolkit, no
PyTorch), so that it runs in any environment that has the driver's ``libcuda.so.1``.

    python tests/mps_client.py [--hold MIB] [--ready PATH] [--go PATH] [--wait-s S]
                               [--hold-s S] SIZE_MIB...

It loads ``libcuda.so.1``, ``cuInit(0)``, ``cuDeviceGet(0)``, retains the device's primary
context and makes it current (under MPS, connecting to the server is part of this), reads
``cuMemGetInfo`` (a fresh context's view), then:

1. ``--hold MIB``: allocates that much (``cuMemAlloc_v2``, written with ``cuMemsetD8_v2`` so it
   is backed) and keeps it to the end;
2. ``--ready PATH``: writes PATH (the test knows the hold is in place);
3. ``--go PATH``: waits for PATH to exist (at most ``--wait-s`` seconds, 120 by default);
4. tries each SIZE_MIB in order: ``cuMemAlloc_v2``, and ``cuMemFree_v2`` at once when it worked;
5. prints ONE JSON line on stdout (see ``main``): each size -> ``"ok"`` or ``{"code": N,
   "name": "CUDA_ERROR_..."}`` (2 is CUDA_ERROR_OUT_OF_MEMORY), what ``cuMemGetInfo`` said,
   the times, the environment's MPS variables;
6. ``--hold-s S``: keeps the held memory S more seconds (another client tries meanwhile), then
   frees it and exits 0.

Exit 0 when it could run at all (a refused allocation is a result, not a failure); 1 with one
line on stderr when the driver cannot be loaded or the device or context cannot be had; 2 for
bad arguments.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

MIB = 1 << 20
CUDA_SUCCESS = 0


class CudaFailure(Exception):
    """A CUDA call that the client cannot go on without failed: the message says which."""


def _load() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise CudaFailure(f"cannot load libcuda.so.1 (no NVIDIA driver here?): {exc}") from None


def _name(cuda: ctypes.CDLL, code: int) -> str:
    text = ctypes.c_char_p()
    if cuda.cuGetErrorName(code, ctypes.byref(text)) != CUDA_SUCCESS or not text.value:
        return f"CUresult {code}"
    return text.value.decode(errors="replace")


def _check(cuda: ctypes.CDLL, code: int, what: str) -> None:
    if code != CUDA_SUCCESS:
        raise CudaFailure(f"{what} failed: {code} {_name(cuda, code)}")


def _result(cuda: ctypes.CDLL, code: int) -> str | dict[str, object]:
    return "ok" if code == CUDA_SUCCESS else {"code": code, "name": _name(cuda, code)}


def _uuid(cuda: ctypes.CDLL, dev: ctypes.c_int) -> str | None:
    raw = (ctypes.c_ubyte * 16)()
    if cuda.cuDeviceGetUuid(raw, dev) != CUDA_SUCCESS:
        return None
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _mem_info(cuda: ctypes.CDLL) -> dict[str, int]:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _check(cuda, cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
    return {"free_mib": free.value // MIB, "total_mib": total.value // MIB}


def _alloc(cuda: ctypes.CDLL, mib: int, *, touch: bool = False) -> tuple[int, ctypes.c_uint64]:
    ptr = ctypes.c_uint64()
    code = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib * MIB))
    if code == CUDA_SUCCESS and touch:
        _check(cuda, cuda.cuMemsetD8_v2(ptr, ctypes.c_ubyte(0x5A), ctypes.c_size_t(mib * MIB)),
               "cuMemsetD8_v2")  # fmt: skip
        _check(cuda, cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    return code, ptr


def run(args: argparse.Namespace) -> dict[str, object]:
    t0 = time.monotonic()
    cuda = _load()
    _check(cuda, cuda.cuInit(0), "cuInit(0)")
    init_s = time.monotonic() - t0
    dev = ctypes.c_int()
    _check(cuda, cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet(0)")
    name = ctypes.create_string_buffer(256)
    _check(cuda, cuda.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
    t1 = time.monotonic()
    ctx = ctypes.c_void_p()
    _check(cuda, cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    _check(cuda, cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    fresh = _mem_info(cuda)  # the first call on the context: it is really made by now
    ctx_s = time.monotonic() - t1
    out: dict[str, object] = {
        "pid": os.getpid(),
        "device": name.value.decode(errors="replace"),
        "uuid": _uuid(cuda, dev),
        "env": {
            k: v for k, v in sorted(os.environ.items()) if k.startswith(("CUDA_", "OMATICAYA_"))
        },
        "init_s": round(init_s, 3),
        "context_s": round(ctx_s, 3),
        "fresh_mem_info": fresh,
    }
    held = None
    if args.hold:
        code, ptr = _alloc(cuda, args.hold, touch=True)
        out["hold"] = {"mib": args.hold, "result": _result(cuda, code)}
        held = ptr if code == CUDA_SUCCESS else None
        out["held_mem_info"] = _mem_info(cuda)
    if args.ready:
        tmp = f"{args.ready}.tmp"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, args.ready)
    if args.go:
        deadline = time.monotonic() + args.wait_s
        while not os.path.exists(args.go):
            if time.monotonic() > deadline:
                out["go"] = f"timed out after {args.wait_s:g}s waiting for {args.go}"
                break
            time.sleep(0.02)
    tries: dict[str, object] = {}
    for mib in args.sizes:
        code, ptr = _alloc(cuda, mib)
        if code == CUDA_SUCCESS:
            _check(cuda, cuda.cuMemFree_v2(ptr), "cuMemFree_v2")
        tries[str(mib)] = _result(cuda, code)
    out["tries"] = tries
    out["end_mem_info"] = _mem_info(cuda)
    print(json.dumps(out), flush=True)
    if held is not None:
        time.sleep(args.hold_s)
        _check(cuda, cuda.cuMemFree_v2(held), "cuMemFree_v2")
    cuda.cuDevicePrimaryCtxRelease_v2(dev)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mps_client.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="*", type=int, metavar="SIZE_MIB")
    parser.add_argument("--hold", type=int, default=0, metavar="MIB")
    parser.add_argument("--ready", metavar="PATH")
    parser.add_argument("--go", metavar="PATH")
    parser.add_argument("--wait-s", type=float, default=120.0)
    parser.add_argument("--hold-s", type=float, default=0.0)
    args = parser.parse_args(argv)
    if any(s < 1 for s in args.sizes) or args.hold < 0:
        parser.error("sizes are MiB, at least 1")
    try:
        run(args)
    except CudaFailure as exc:
        print(f"mps_client: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

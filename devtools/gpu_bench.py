"""The NVML path's cost on a real GPU, before and after GPM, in one process (devtools/gpu-check.sh).

    python devtools/gpu_bench.py [--budget-s S] [--calls N]

1. ``bench/tick.py --nvml``'s measurement as the agent runs today (utilisation from GPM where
   the GPU has it): the tick's CPU and wall time, the time inside NVML and each call's cost.
2. The same with GPM turned off in the reader (``gpm._supported`` answers False), so that
   utilisation comes from ``nvmlDeviceGetSamples`` as before issue 40: the "before" figure, on
   the same GPU in the same run.
3. Each utilisation call timed on its own, ``--calls`` times, on GPU 0 idle and then under a
   kernel on every SM (tests/gpu_kernels.py): ``nvmlDeviceGetSamples`` (since the last sample),
   ``nvmlDeviceGetUtilizationRates``, ``nvmlGpmSampleGet``, ``nvmlGpmMetricsGet`` for SM
   activity alone and for the reader's three metrics; with what GPM reports.

Exit 1 with one line when NVML cannot be read here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _stats(fn: Callable[[], Any], n: int) -> tuple[float, float, float]:
    """Median, p90 and min of ``fn``'s wall time over ``n`` calls, in µs."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))], times[0]


def per_call(n: int, label: str) -> list[list[Any]]:
    """GPU 0's utilisation calls timed one by one (rows for ``bench.common.table``)."""
    import pynvml

    from omaticaya_py.sources.nvml.gpm import GPM_FIELDS

    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    rows: list[list[Any]] = []
    last = [0]

    def samples() -> None:
        try:
            _, got = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last[0])
        except pynvml.NVMLError_NotFound:
            return
        if got:
            last[0] = max(s.timeStamp for s in got)

    samples()
    rows.append([label, "nvmlDeviceGetSamples (since the last)", *_stats(samples, n)])
    rows.append([label, "nvmlDeviceGetUtilizationRates",
                 *_stats(lambda: pynvml.nvmlDeviceGetUtilizationRates(h), n)])  # fmt: skip
    support = pynvml.nvmlGpmQueryDeviceSupport(h)
    if not support.isSupportedDevice:
        rows.append([label, "GPM", "not supported", "", ""])
        return rows
    a, b = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    try:
        pynvml.nvmlGpmSampleGet(h, a)
        time.sleep(0.2)
        rows.append([label, "nvmlGpmSampleGet", *_stats(lambda: pynvml.nvmlGpmSampleGet(h, b), n)])

        def request(metrics: list[int]) -> Any:
            r = pynvml.c_nvmlGpmMetricsGet_t()
            r.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            r.numMetrics = len(metrics)
            for i, m in enumerate(metrics):
                r.metrics[i].metricId = m
            r.sample1, r.sample2 = a, b
            return r

        sm_only = request([pynvml.NVML_GPM_METRIC_SM_UTIL])
        three = request([m for _, m in GPM_FIELDS])
        rows.append([label, "nvmlGpmMetricsGet (SM activity)",
                     *_stats(lambda: pynvml.nvmlGpmMetricsGet(sm_only), n)])  # fmt: skip
        rows.append([label, "nvmlGpmMetricsGet (SM, tensor, DRAM: the reader's)",
                     *_stats(lambda: pynvml.nvmlGpmMetricsGet(three), n)])  # fmt: skip
        pynvml.nvmlGpmMetricsGet(three)
        values = ", ".join(
            f"{name}={three.metrics[i].value:.2f}"
            if three.metrics[i].nvmlReturn == pynvml.NVML_SUCCESS
            else f"{name}=error {three.metrics[i].nvmlReturn}"
            for i, (name, _) in enumerate(GPM_FIELDS)
        )
        rates = pynvml.nvmlDeviceGetUtilizationRates(h)
        rows.append([label, f"GPM over the timing: {values}; utilisation rates gpu={rates.gpu}",
                     "", "", ""])  # fmt: skip
    finally:
        pynvml.nvmlGpmSampleFree(a)
        pynvml.nvmlGpmSampleFree(b)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-s", type=float, default=5.0, help="wall seconds per tick case")
    ap.add_argument("--iterations", type=int, default=5000, help="ticks per case at most")
    ap.add_argument("--calls", type=int, default=300, help="timings per NVML call")
    args = ap.parse_args(argv)
    from loguru import logger

    logger.remove()
    from bench import tick
    from bench.common import emit, header, table
    from omaticaya_py.sources.nvml import gpm

    out, rc = tick.run_nvml(args.iterations, args.budget_s, 50)
    if rc:
        print(f"devtools/gpu_bench.py: {out}", file=sys.stderr)
        return rc
    emit(header("1. tick on real NVML as the agent runs (GPM where supported)"), out)

    real_supported = gpm._supported  # noqa: SLF001

    def no_gpm(calls: Any, device: Any) -> bool:
        device.gpm_supported = False
        return False

    gpm._supported = no_gpm  # type: ignore[assignment]  # noqa: SLF001
    try:
        out, rc = tick.run_nvml(args.iterations, args.budget_s, 50)
    finally:
        gpm._supported = real_supported  # type: ignore[assignment]  # noqa: SLF001
    emit(header("2. the same with GPM off in the reader (nvmlDeviceGetSamples: before issue 40)"),
         out)  # fmt: skip

    import pynvml

    pynvml.nvmlInit()
    try:
        rows = per_call(args.calls, "idle")
        from tests.gpu_kernels import Cuda

        cuda = Cuda.open(0)
        if cuda is None:
            rows.append(["busy", f"not measured: {Cuda.why}", "", "", ""])
        else:
            try:
                cuda.spin(6.0, blocks=cuda.sm_count * 8, threads=256)
                time.sleep(0.5)
                rows += per_call(args.calls, "all SMs busy")
                cuda.synchronize()
            finally:
                cuda.close()
    finally:
        pynvml.nvmlShutdown()
    emit(header(f"3. GPU 0's utilisation calls one by one ({args.calls} calls each, µs)"),
         table(["GPU 0", "call", "median µs", "p90 µs", "min µs"], rows))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""ResourceSlice writes per node-hour (issue 41): what publishing live free memory through DRA
costs the API server, side by side with the Node label patches of the same readings.

Replays recorded traces (looped over an hour of trace time) through the agent's own pure
stages at the default settings, with no API server: ``bench.label_churn.readings`` (the trace
on a hand-driven clock, one schedule period per tick, assessed with the Xid ledger), then
``agent.slice_writer.SliceWriter`` (no client: it counts the server-side applies it would
send; the same rule as in the agent: change-only, worse at once, better once the budget
allows) and, beside it, ``bench.label_churn``'s Node side (the labels' rule) on the same
ticks. One row per trace and write budget (``min_patch_interval_s``; 0: no budget).

Traces: the recorded H100 load looped (idle, 30 GiB allocated, busy, released, every 26 s: a
busy node, the worst case), its idle phase alone (a steady node, with the recording's noise),
the 8-GPU trace (a steady mixed load, GPUs 0 and 1 shared), and the fault trace (a GPU
tainted and cleared, a GPU lost and back, the driver gone and back, every 40 s).

    .venv/bin/python bench/dra_writes.py            # 1 h of each trace, budgets 0 and 30: ~10 s
    .venv/bin/python bench/dra_writes.py --quick    # 6 min of trace time
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, bench_settings, emit, header, table  # noqa: E402
from bench.label_churn import HOUR_S, NodeSide, readings, whole  # noqa: E402
from bench.label_churn import traces as churn_traces  # noqa: E402
from omaticaya_py.agent.slice_writer import SliceWriter  # noqa: E402
from omaticaya_py.agent.state import SnapshotCache  # noqa: E402
from omaticaya_py.core.render import render  # noqa: E402
from omaticaya_py.core.render_telemetry import telemetry_marks  # noqa: E402

FAULTS = ROOT / "tests" / "data" / "faults-trace.json"


def replay(path: Path, budgets: Sequence[float], duration_s: float) -> list[dict[str, Any]]:
    """Per budget: ResourceSlice applies, held ticks and Node patches over ``duration_s`` of
    the trace at ``path`` (the start-up write of each is not counted)."""
    sides = []
    for budget in budgets:
        settings = bench_settings(node_name="dra", dra=True, shared_gpus="0,1",
                                  min_patch_interval_s=budget)  # fmt: skip
        cache = SnapshotCache(lambda: 0.0)
        writer = SliceWriter(settings, None, cache, wall=lambda: 0.0)
        node = NodeSide(budget, settings.telemetry_free_drop_mib)
        ticks = 0
        previous: dict[str, str] | None = None
        # each reading once: the slice from it, and the Node's labels rendered from it
        for t, snapshot, health in readings(path, settings, duration_s):
            writer.write(snapshot, health, None, t)
            labels = render(snapshot, health, settings, previous, with_telemetry=False).labels
            node.tick(t, labels, telemetry_marks(snapshot))
            previous = labels
            ticks += 1
        sides.append({
            "budget_s": budget, "ticks": ticks, "slice_writes": cache.slice_writes - 1,
            "slice_held": cache.slice_held, "node_patches": node.patches,
            "devices": len(writer.published or []),
        })  # fmt: skip
    return sides


def run(traces: dict[str, Path], budgets: Sequence[float], duration_s: float) -> str:
    """The table: per trace and budget, writes per node-hour of the slice and of the Node."""

    def per_hour(count: float) -> float | int:
        return whole(round(count * HOUR_S / duration_s, 1))

    rows = []
    for name, path in traces.items():
        for side in replay(path, budgets, duration_s):
            writes, patches = per_hour(side["slice_writes"]), per_hour(side["node_patches"])
            rows.append([
                name, side["devices"], whole(side["budget_s"]), writes, per_hour(side["slice_held"]),
                patches, f"{writes / patches:.2f}" if patches else "-",
            ])  # fmt: skip
    return table(
        ["trace", "devices", "budget s", "ResourceSlice applies/h", "held ticks/h",
         "Node patches/h (labels)", "slice/Node"],
        rows,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="6 minutes of trace time (CI smoke)")
    ap.add_argument("--hours", type=float, default=1.0, help="trace time covered, h")
    ap.add_argument(
        "--budgets", type=float, nargs="+", default=[0.0, 30.0], help="min_patch_interval_s"
    )
    args = ap.parse_args(argv)
    duration_s = 0.1 * HOUR_S if args.quick else args.hours * HOUR_S
    period_s = bench_settings().schedule.interval_s
    emit(
        header(
            f"ResourceSlice writes: recorded traces looped over {duration_s / HOUR_S:g} h, "
            f"default settings ({period_s:g} s schedule, 1 GiB step, hysteresis), no API server",
            argv,
        ),
        run({**churn_traces(), "faults": FAULTS}, args.budgets, duration_s),
        "applies: server-side applies of the Node's one ResourceSlice (change-only; worse at\n"
        "once, better once the budget allows); Node patches: the labels' rule on the same ticks\n"
        "(the start-up write of each not counted); heartbeat read-backs are GETs, not counted",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""ResourceSlice writes per node-hour (issue 41): what publishing live free memory through DRA
costs the API server, side by side with the Node label patches of the same readings.

Replays recorded traces (looped over an hour of trace time) through the agent's own pure
stages at the default settings, with no API server: ``bench.label_churn.readings`` (the trace
on a hand-driven clock, one schedule period per tick, assessed with the Xid ledger), then
``agent.resourceslice_writer.ResourceSliceWriter`` (no client: it counts the server-side applies it would
send; the same rule as in the agent: change-only, worse at once, better once the budget
allows) and, beside it, ``bench.label_churn``'s Node side (the labels' rule) on the same
ticks. One row per trace and write budget (``min_patch_interval_s``; 0: no budget).

Traces: the recorded H100 load looped (idle, 30 GiB allocated, busy, released, every 26 s: a
busy node, the worst case), its idle phase alone (a steady node, with the recording's noise),
the 8-GPU trace (a steady mixed load, GPUs 0 and 1 shared), the fault trace (a GPU
tainted and cleared, a GPU lost and back, the driver gone and back, every 40 s), and issue 48's
churning neighbours (``bench.label_churn.neighbour_traces``: GPU 0's memory dipping every 20 s
beside GPU 1 with rows pending 300 s of every 600 s; 8 GPUs dipping every 120 s, 15 s apart).

Issue 48: each row runs the rule twice, the agent's now (each part of each device on its own
calm clock, ``core.publish.budget.held_keys``) and the node-wide calm clock of 7078aa3
(``NodeWideResourceSliceWriter``, the before column), with the longest a device's taint stayed on the
slice after the reading cleared it.

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
from bench.label_churn import HOUR_S, NodeSide, neighbour_traces, readings, whole  # noqa: E402
from bench.label_churn import traces as churn_traces  # noqa: E402
from omaticaya_py.agent.resourceslice_writer import ResourceSliceWriter  # noqa: E402
from omaticaya_py.agent.state import SnapshotCache  # noqa: E402
from omaticaya_py.core.publish.budget import hold_back  # noqa: E402
from omaticaya_py.core.publish.render import render  # noqa: E402
from omaticaya_py.core.publish.render_telemetry import telemetry_marks  # noqa: E402
from omaticaya_py.core.publish.slice_budget import held_devices, worse_devices  # noqa: E402
from omaticaya_py.core.publish.slice_device import SliceDevice  # noqa: E402

FAULTS = ROOT / "tests" / "data" / "faults-trace.json"


class NodeWideResourceSliceWriter(ResourceSliceWriter):
    """The slice's write budget of 7078aa3 (before issue 48), for the before column: one calm
    clock for the whole Node (``calm_since_s``: the last tick whose devices were worse than
    the tick's before), every change for the better held while it or the last write is under
    an interval old, a change for the worse sending the whole reading."""

    calm_since_s: float | None = None

    def note(self, desired: list[SliceDevice], now_s: float) -> None:
        if self.last_desired is not None and worse_devices(self.last_desired, desired):
            self.calm_since_s = now_s

    def within_budget(
        self, before: list[SliceDevice], desired: list[SliceDevice], now_s: float
    ) -> list[SliceDevice]:
        interval_s = self.settings.min_patch_interval_s
        if not worse_devices(before, desired) and hold_back(
            now_s, self.last_write_s, interval_s, False, self.calm_since_s
        ):
            return held_devices(before, desired)
        return desired


def taints_held_s(writer: ResourceSliceWriter, since: dict[str, float], now_s: float) -> float:
    """The longest any device's published taints have been more than the reading's, as of
    ``now_s`` (``since``: device name -> when that began, updated in place)."""
    def keys(d: SliceDevice) -> set[tuple[Any, ...]]:
        return {(t.key, t.value) for t in d.taints}

    wanted = {d.name: keys(d) for d in writer.last_desired or []}
    longest = 0.0
    for d in writer.published_devices or []:
        if keys(d) - wanted.get(d.name, keys(d)):
            longest = now_s - since.setdefault(d.name, now_s)
        else:
            since.pop(d.name, None)
    return longest


def replay(
    path: Path, budgets: Sequence[float], duration_s: float, node_wide: bool = False
) -> list[dict[str, Any]]:
    """Per budget: ResourceSlice applies, held ticks, Node patches over ``duration_s`` of the
    trace at ``path`` (the start-up write of each is not counted), and the longest a taint
    the reading had cleared stayed published (s). ``node_wide``: the rule of 7078aa3 on both
    (``NodeWideResourceSliceWriter``, ``NodeSide(per_key=False)``)."""
    sides = []
    for budget in budgets:
        settings = bench_settings(node_name="dra", dra=True, shared_gpus="0,1",
                                  min_patch_interval_s=budget)  # fmt: skip
        cache = SnapshotCache(lambda: 0.0)
        kind = NodeWideResourceSliceWriter if node_wide else ResourceSliceWriter
        writer = kind(settings, None, cache, wall=lambda: 0.0)
        node = NodeSide(budget, settings.telemetry_free_drop_mib, per_key=not node_wide)
        ticks, held_s, since = 0, 0.0, {}
        previous: dict[str, str] | None = None
        # each reading once: the slice from it, and the Node's labels rendered from it
        for t, snapshot, health in readings(path, settings, duration_s):
            writer.write(snapshot, health, None, t)
            held_s = max(held_s, taints_held_s(writer, since, t))
            labels = render(snapshot, health, settings, previous, with_telemetry=False).labels
            node.tick(t, labels, telemetry_marks(snapshot))
            previous = labels
            ticks += 1
        sides.append({
            "budget_s": budget, "ticks": ticks, "slice_writes": cache.slice_writes - 1,
            "slice_held": cache.slice_held, "node_patches": node.patches,
            "devices": len(writer.published_devices or []), "taint_held_s": held_s,
        })  # fmt: skip
    return sides


def run(traces: dict[str, Path], budgets: Sequence[float], duration_s: float) -> str:
    """The table: per trace and budget, writes per node-hour of the slice and of the Node."""

    def per_hour(count: float) -> float | int:
        return whole(round(count * HOUR_S / duration_s, 1))

    rows, calm_rows = [], []
    for name, path in traces.items():
        before = replay(path, budgets, duration_s, node_wide=True)
        for old, side in zip(before, replay(path, budgets, duration_s), strict=True):
            writes, patches = per_hour(side["slice_writes"]), per_hour(side["node_patches"])
            rows.append([
                name, side["devices"], whole(side["budget_s"]), writes, per_hour(side["slice_held"]),
                patches, f"{writes / patches:.2f}" if patches else "-",
            ])  # fmt: skip
            calm_rows.append([
                name, whole(side["budget_s"]), per_hour(old["slice_writes"]), writes,
                per_hour(old["node_patches"]), patches, whole(old["taint_held_s"]),
                whole(side["taint_held_s"]),
            ])  # fmt: skip
    return table(
        ["trace", "devices", "budget s", "ResourceSlice applies/h", "held ticks/h",
         "Node patches/h (labels)", "slice/Node"],
        rows,
    ) + "\n\n" + table(
        ["trace", "budget s", "applies/h node-wide calm (before)", "per part (after)",
         "Node patches/h before", "after", "cleared taint held s before", "after"],
        calm_rows,
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
        run({**churn_traces(), "faults": FAULTS, **neighbour_traces()}, args.budgets, duration_s),
        "applies: server-side applies of the Node's one ResourceSlice (change-only; worse at\n"
        "once, better once the budget allows); Node patches: the labels' rule on the same ticks\n"
        "(the start-up write of each not counted); heartbeat read-backs are GETs, not counted",
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Label churn: which labels change with load, how often, and the Node patches that causes.

Replays recorded traces (looped, so that an hour of trace time is covered) through the agent's
pure stages at the default settings, with no API server: ``TraceReader`` on a hand-driven
clock that advances one schedule period per tick, ``core.health.assess`` (with the Xid
ledger), ``core.render.render`` with the previous tick's labels (hysteresis, as the agent
passes them). Per label name (``gpu-N.*``: every GPU together), the value changes per hour of
trace time after start-up, as a Node watcher would see them, for each write budget
(``min_patch_interval_s``): a patch is held back the way ``agent/node_writer.py`` does it
(``core.budget.urgent`` on the Node's labels and the desired ones, ``core.budget.hold_back``),
so a change that is undone before the interval has passed never reaches the Node. Budget 0
is the rendered churn itself.

The telemetry annotation is followed too (issue 24): a GPU's exact free memory down by more than
``telemetry_free_drop_mib`` (256 MiB) rewrites it at once though no label changed, the same rise
once the budget lets a change for the better go (``core.budget.telemetry_change``, as
``agent/node_writer.py`` applies it). The last table sets the Node patches per hour side by side with
that rule off (``OMATICAYA_TELEMETRY_FREE_DROP_MIB=0``: the telemetry moved only with a label,
as before) and on at its default; the traces hold no pods, so a change of holders costs nothing
here.

Heartbeats are not counted: in a cluster the agent's liveness is its Lease, and the Node is
written only with a label change. The opt-in ``gpu-N.temperature-c`` is measured in a second
replay with ``temperature_labels`` on (its row only; the patch counts are at the defaults).
GPM's ``gpu.sm-active-pct`` and the opt-in ``gpu-N.sm-active-pct`` (issue 40) are measured on
the readings as a GPM reader gives them (``with_gpm``: ``sm_active_pct`` is the trace's
utilisation, which is what ``utilization_pct`` is where GPM is), with and without the per-GPU
label: the notes compare the Node patches.
Traces: the recorded H100 load looped (idle, 30 GiB allocated, busy, released, every 26 s:
a worst case, a real node is idle or steady most of the hour), its idle phase alone (a quiet
node, with the recording's noise), and the 8-GPU trace (a steady mixed load).

    .venv/bin/python bench/label_churn.py            # 1 h of each trace, budgets 0 and 30: ~5 s
    .venv/bin/python bench/label_churn.py --quick    # 6 min of trace time
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    ROOT,
    FakeClock,
    bench_settings,
    emit,
    header,
    load_raw,
    phase_samples,
    table,
    write_trace,
)
from omaticaya_py.core.budget import (  # noqa: E402
    BETTER,
    WORSE,
    hold_back,
    name_of,
    safe_part,
    telemetry_change,
    urgent,
)
from omaticaya_py.core.health import NodeHealth, XidLedger, XidPolicy, assess  # noqa: E402
from omaticaya_py.core.render import render  # noqa: E402
from omaticaya_py.core.render_telemetry import telemetry_marks  # noqa: E402
from omaticaya_py.core.snapshot import NodeSnapshot  # noqa: E402
from omaticaya_py.sources.replay import TraceReader  # noqa: E402

H100 = ROOT / "tests" / "data" / "h100-trace.json"
MULTI = ROOT / "tests" / "data" / "multi-gpu-trace.json"
HOUR_S = 3600.0
_GPU_N = re.compile(r"^gpu-\d+\.")


def whole(value: float) -> float | int:
    """An int when ``value`` is whole (the table prints ``360``, not ``360.00``)."""
    return int(value) if value == int(value) else value


def family(key: str) -> str:
    """``omaticaya.io/gpu-3.memory.free-mib`` -> ``gpu-N.memory.free-mib``."""
    return _GPU_N.sub("gpu-N.", name_of(key))


def with_gpm(snapshot: NodeSnapshot) -> NodeSnapshot:
    """``snapshot`` as a GPM reader gives it: each whole GPU without ``sm_active_pct`` gets its
    ``utilization_pct`` there (where GPM is, ``utilization_pct`` is ``sm_active_pct``:
    ``core.snapshot.GpuReading``), for traces recorded before GPM."""
    gpus = tuple(
        replace(g, sm_active_pct=g.utilization_pct)
        if g.sm_active_pct is None and g.error is None and not g.mig_enabled
        else g
        for g in snapshot.gpus
    )
    return replace(snapshot, gpus=gpus)


def readings(
    path: Path, settings: Any, duration_s: float, gpm: bool = False
) -> Iterator[tuple[float, NodeSnapshot, NodeHealth]]:
    """``(trace seconds, reading, its health)`` at each tick of ``settings.schedule`` over
    ``duration_s`` of looped trace time: the agent's read -> assess, no API (``gpm``: the
    readings as a GPM reader gives them, ``with_gpm``)."""
    period_s = settings.schedule.interval_s
    clock = FakeClock(0.0)
    reader = TraceReader(path, window_s=period_s, loop=True, clock=clock)
    policy = XidPolicy(
        ignore=settings.xid_ignore, all_fatal=settings.xid_all_fatal, quiet_s=settings.xid_quiet_s
    )
    ledger = XidLedger(policy)
    t = 0.0
    while t <= duration_s:
        clock.now = t
        snapshot = reader.read()
        if gpm:
            snapshot = with_gpm(snapshot)
        ledger.record(snapshot.xid_events)
        yield t, snapshot, assess(snapshot, ledger.recent(snapshot.clock_s), policy)
        t += period_s


def rendered_labels(
    path: Path, settings: Any, duration_s: float, gpm: bool = False
) -> Iterator[tuple[float, dict, dict]]:
    """``(trace seconds, desired labels, telemetry marks)`` at each tick of ``readings``: the
    agent's render with the previous tick's labels (hysteresis), no API."""
    previous: dict[str, str] | None = None
    for t, snapshot, health in readings(path, settings, duration_s, gpm):
        labels = render(snapshot, health, settings, previous, with_telemetry=False).labels
        yield t, labels, telemetry_marks(snapshot)
        previous = labels


@dataclass
class NodeSide:
    """What a Node watcher sees under one write budget: the labels on the Node, its patches
    (after the start-up one), the urgent ones among them, held-back ticks, per label family
    the value changes, and the patches that carry the telemetry alone (``telemetry_only``:
    free memory moved by more than ``drop_mib`` with no label; ``drop_mib`` 0: not followed)."""

    budget_s: float
    drop_mib: int = 256
    labels: dict[str, str] = field(default_factory=dict)
    published: dict | None = None
    marks: dict | None = None
    telemetry_only: int = 0
    last_patch_s: float | None = None
    calm_since_s: float | None = None
    previous: dict[str, str] | None = None
    patches: int = 0
    urgent_patches: int = 0
    held: int = 0
    changes: Counter[str] = field(default_factory=Counter)

    def tick(self, now_s: float, desired: dict[str, str], marks: dict | None = None) -> None:
        """``agent/node_writer.py``'s rule: a label change is patched unless the budget holds it;
        the telemetry alone when its free memory is behind (``core.budget.telemetry_change``)."""
        marks = marks or {}
        if self.previous is not None and urgent(self.previous, desired):
            self.calm_since_s = now_s  # the reading got worse: a rise waits for calm
        elif self.marks is not None and telemetry_change(self.marks, marks, self.drop_mib) == WORSE:
            self.calm_since_s = now_s
        self.previous, self.marks = dict(desired), marks
        if hold_back(now_s, self.last_patch_s, self.budget_s, False, self.calm_since_s):
            safe = safe_part(self.labels, desired)  # changes for the better wait
            self.held += safe != desired
            desired = safe
        behind = False
        if desired == self.labels and self.published is not None:
            change = telemetry_change(self.published, marks, self.drop_mib)
            behind = change == WORSE or change == BETTER and not hold_back(
                now_s, self.last_patch_s, self.budget_s, False, self.calm_since_s
            )
        if desired == self.labels and not behind:
            return
        self.published = marks
        is_urgent = urgent(self.labels, desired)
        if self.last_patch_s is not None:  # the start-up patch is not churn
            self.patches += 1
            self.telemetry_only += desired == self.labels
            self.urgent_patches += is_urgent
            for key in self.labels.keys() | desired.keys():
                if self.labels.get(key) != desired.get(key):
                    self.changes[family(key)] += 1
        self.labels, self.last_patch_s = dict(desired), now_s


def replay(
    path: Path, budgets: Sequence[float], duration_s: float, drop_mib: int | None = None,
    gpm: bool = False, **overrides: Any,
) -> list:  # fmt: skip
    """One ``NodeSide`` per budget after ``duration_s`` of the trace at ``path``
    (``drop_mib``: the telemetry's free-memory threshold; ``None``: the setting's default;
    ``gpm``: the readings as a GPM reader gives them)."""
    settings = bench_settings(node_name="churn", **overrides)
    drop = settings.telemetry_free_drop_mib if drop_mib is None else drop_mib
    sides = [NodeSide(b, drop) for b in budgets]
    for now_s, labels, marks in rendered_labels(path, settings, duration_s, gpm):
        for side in sides:
            side.tick(now_s, labels, marks)
    return sides


def traces() -> dict[str, Path]:
    """The recorded H100 load (idle, 30 GiB, busy, released: 26 s, looped), its idle phase
    alone (a quiet node, with the recording's noise) and the steady 8-GPU trace."""
    idle = write_trace(phase_samples(load_raw(H100), "idle"), "churn-h100-idle")
    return {"h100": H100, "h100-idle": idle, "8-gpu": MULTI}


def run(traces: dict[str, Path], budgets: Sequence[float], duration_s: float) -> str:
    """The two tables: label changes per hour per trace and budget; Node patches per hour."""

    def per_hour(count: float) -> float | int:
        return whole(count * HOUR_S / duration_s)

    results = {name: replay(path, budgets, duration_s) for name, path in traces.items()}
    temps = {
        name: replay(path, budgets, duration_s, temperature_labels=True)
        for name, path in traces.items()
    }
    # GPM (issue 40): the node's gpu.sm-active-pct, without and with gpu-N.sm-active-pct
    gpm_off = {name: replay(path, budgets, duration_s, gpm=True) for name, path in traces.items()}
    gpm_on = {
        name: replay(path, budgets, duration_s, gpm=True, sm_active_labels=True)
        for name, path in traces.items()
    }
    cols = [(name, i) for name in traces for i in range(len(budgets))]
    head = ["label: changes/h on the Node"] + [
        f"{name} b={budgets[i]:g}" for name, i in cols
    ]
    families = sorted({f for sides in results.values() for s in sides for f in s.changes})
    rows: list[list[Any]] = [
        [f] + [per_hour(results[name][i].changes[f]) for name, i in cols] for f in families
    ]
    temp = "gpu-N.temperature-c"
    rows.append([f"{temp} (opt-in)"] + [per_hour(temps[name][i].changes[temp]) for name, i in cols])
    for sm in ("gpu.sm-active-pct", "gpu-N.sm-active-pct"):
        rows.append(
            [f"{sm} (GPM)"] + [per_hour(gpm_on[name][i].changes[sm]) for name, i in cols]
        )
    labels_table = table(head, rows)
    patch_rows = []
    for name in traces:
        for side in results[name]:
            patch_rows.append([
                name, whole(side.budget_s), per_hour(side.patches),
                per_hour(side.urgent_patches), per_hour(side.held),
                sum(side.changes.values()) / side.patches if side.patches else 0.0,
            ])  # fmt: skip
    patches_table = table(
        ["trace", "budget s", "Node patches/h", "urgent/h", "held ticks/h", "labels/patch"],
        patch_rows,
    )
    before = {name: replay(path, budgets, duration_s, drop_mib=0) for name, path in traces.items()}
    cost_rows = [
        [name, whole(after.budget_s), per_hour(old.patches), per_hour(after.patches),
         per_hour(after.telemetry_only)]
        for name in traces
        for old, after in zip(before[name], results[name], strict=True)
    ]  # fmt: skip
    drop = results[next(iter(traces))][0].drop_mib
    cost_table = table(
        ["trace", "budget s", "Node patches/h: telemetry with labels only (before)",
         f"free drop > {drop} MiB rewrites it (after)", "of which telemetry alone"],
        cost_rows,
    )  # fmt: skip
    with_temp = ", ".join(
        f"{name} " + "/".join(str(per_hour(side.patches)) for side in temps[name]) for name in traces
    )
    def patches(sides: dict) -> str:
        return ", ".join(
            f"{name} " + "/".join(str(per_hour(side.patches)) for side in sides[name])
            for name in traces
        )

    notes = (
        f"Node patches/h with gpu-N.temperature-c on (b={'/'.join(f'{b:g}' for b in budgets)}): "
        f"{with_temp}\n"
        f"GPM readings (sm_active_pct = utilization_pct, as a GPM reader gives them): Node "
        f"patches/h without gpu-N.sm-active-pct {patches(gpm_off)}; with it {patches(gpm_on)}\n"
        "labels not listed (hardware facts, health, healthy-count) did not change; urgent: a\n"
        "patch with a less attractive change, which the budget never holds"
    )
    return "\n\n".join([labels_table, patches_table, notes, cost_table])


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
            f"label churn: recorded traces looped over {duration_s / HOUR_S:g} h, default "
            f"settings ({period_s:g} s schedule, hysteresis, steps), no API server"
        ),
        run(traces(), args.budgets, duration_s),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

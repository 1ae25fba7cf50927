"""Label churn: which labels change with load, how often, and the Node patches that causes.

Replays recorded traces (looped, so that an hour of trace time is covered) through the agent's
pure stages at the default settings, with no API server: ``TraceReader`` on a hand-driven
clock that advances one schedule period per tick, ``core.rules.health.assess`` (with the Xid
ledger), ``core.publish.render.render`` with the previous tick's labels (hysteresis, as the agent
passes them). Per label name (``gpu-N.*``: every GPU together), the value changes per hour of
trace time after start-up, as a Node watcher would see them, for each write budget
(``min_patch_interval_s``): a patch is held back the way ``agent/node_writer.py`` does it
(``core.publish.budget.urgent`` on the Node's labels and the desired ones, ``core.publish.budget.hold_back``),
so a change that is undone before the interval has passed never reaches the Node. Budget 0
is the rendered churn itself.

The telemetry annotation is followed too (issue 24): a GPU's exact free memory down by more than
``telemetry_free_drop_mib`` (256 MiB) rewrites it at once though no label changed, the same rise
once the budget lets a change for the better go (``core.publish.budget.telemetry_change``, as
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

The calm window per key (issue 48): the last table replays the agent's rule now (each label's
own calm clock, ``core.publish.publisher.Publisher``) beside the node-wide clock it replaced
(``NodeSide(per_key=False)``, the rule of 7078aa3), on the traces above and on churning
neighbours built from the recording's idle sample (``neighbour_traces``): the issue's node (GPU
0's free memory dips for a tick every 20 s, GPU 1's rows pending for 300 s of every 600 s), and
8 GPUs each dipping once every 120 s, 15 s apart (the rule's worst case: each GPU calm for an
interval between its dips, the node never). Per row: Node patches per hour under each rule, and
the longest a GPU's health label stayed worse on the Node than the reading (seconds; a hold
still running at the end counts to the end).

    .venv/bin/python bench/label_churn.py            # 1 h of each trace, budgets 0 and 30: ~5 s
    .venv/bin/python bench/label_churn.py --quick    # 6 min of trace time
"""

from __future__ import annotations

import argparse
import copy
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
    replicate,
    table,
    write_trace,
)
from omaticaya_py.core.model.snapshot import NodeSnapshot  # noqa: E402
from omaticaya_py.core.publish.budget import (  # noqa: E402
    BETTER,
    HEALTH_RANK,
    WORSE,
    hold_back,
    name_of,
    safe_part,
    telemetry_change,
    urgent,
)
from omaticaya_py.core.publish.node_budget import (  # noqa: E402
    calm_changes,
    labels_within_budget,
    telemetry_behind,
)
from omaticaya_py.core.publish.publisher import Publisher  # noqa: E402
from omaticaya_py.core.publish.render import render  # noqa: E402
from omaticaya_py.core.publish.render_telemetry import telemetry_marks  # noqa: E402
from omaticaya_py.core.rules.health import NodeHealth, XidLedger, XidPolicy, assess  # noqa: E402
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
    ``core.model.snapshot.GpuReading``), for traces recorded before GPM."""
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
    free memory moved by more than ``drop_mib`` with no label; ``drop_mib`` 0: not followed).
    ``per_key``: the agent's rule now, each label and telemetry unit on its own calm clock
    (issue 48); ``False``: the one node-wide clock of 7078aa3, for the before column.
    ``health_held_s``: the longest a ``gpu-N.health`` label stayed worse on the Node than in
    the reading (s)."""

    budget_s: float
    drop_mib: int = 256
    per_key: bool = True
    #: each label key's and telemetry unit's calm clock (``core.publish.budget.Calm``)
    label_calm: dict = field(default_factory=dict)
    health_since: dict = field(default_factory=dict)
    health_held_s: float = 0.0
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
        the telemetry alone when its free memory is behind (``core.publish.budget.telemetry_change``)."""
        marks = marks or {}
        if self.per_key:
            self._tick_per_key(now_s, desired, marks)
        else:
            self._tick_node_wide(now_s, desired, marks)
        self._follow_health(now_s, desired)

    def _follow_health(self, now_s: float, desired: dict[str, str]) -> None:
        """How long each GPU's health label has been worse on the Node than in the reading."""
        for key, value in desired.items():
            if not name_of(key).endswith(".health") or name_of(key).startswith("gpu."):
                continue
            on_node = self.labels.get(key)
            if on_node is not None and HEALTH_RANK.get(on_node, 9) > HEALTH_RANK.get(value, 9):
                since = self.health_since.setdefault(key, now_s)
                self.health_held_s = max(self.health_held_s, now_s - since)
            else:
                self.health_since.pop(key, None)

    def _tick_per_key(self, now_s: float, desired: dict[str, str], marks: dict) -> None:
        """``agent/node_writer.py``'s rule now, by the same pure decision
        (``core.publish.node_budget`` over ``core.publish.publisher.Publisher``): each label and
        each GPU's telemetry on its own calm clock; a calm change for the better rides on a
        write that goes anyway, or goes alone once the last patch is an interval old."""
        publisher = Publisher(self.budget_s, self.label_calm, self.last_patch_s).noted(
            calm_changes(self.previous, desired, self.marks, marks, self.drop_mib), now_s
        )
        self.label_calm = dict(publisher.calm)
        self.previous, self.marks = dict(desired), marks
        behind = self.published is not None and telemetry_behind(
            self.published, marks, publisher, now_s, self.drop_mib
        )
        safe = labels_within_budget(self.labels, desired, publisher, now_s, going=behind)
        if safe is not None:
            self.held += safe != desired
            desired = safe
        if desired == self.labels and not behind:
            return
        self._patch(now_s, desired, marks)

    def _tick_node_wide(self, now_s: float, desired: dict[str, str], marks: dict) -> None:
        """The rule of 7078aa3 (before issue 48): one calm clock for the whole Node."""
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
        self._patch(now_s, desired, marks)

    def _patch(self, now_s: float, desired: dict[str, str], marks: dict) -> None:
        """One Node patch: ``desired`` labels with the telemetry of ``marks``."""
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
    gpm: bool = False, per_key: bool = True, **overrides: Any,
) -> list:  # fmt: skip
    """One ``NodeSide`` per budget after ``duration_s`` of the trace at ``path``
    (``drop_mib``: the telemetry's free-memory threshold; ``None``: the setting's default;
    ``gpm``: the readings as a GPM reader gives them)."""
    settings = bench_settings(node_name="churn", **overrides)
    drop = settings.telemetry_free_drop_mib if drop_mib is None else drop_mib
    sides = [NodeSide(b, drop, per_key) for b in budgets]
    for now_s, labels, marks in rendered_labels(path, settings, duration_s, gpm):
        for side in sides:
            side.tick(now_s, labels, marks)
    return sides


def traces() -> dict[str, Path]:
    """The recorded H100 load (idle, 30 GiB, busy, released: 26 s, looped), its idle phase
    alone (a quiet node, with the recording's noise) and the steady 8-GPU trace."""
    idle = write_trace(phase_samples(load_raw(H100), "idle"), "churn-h100-idle")
    return {"h100": H100, "h100-idle": idle, "8-gpu": MULTI}


def neighbour_trace(
    name: str, n_gpus: int, dip_every_s: float, stagger_s: float, loop_s: float,
    sick_gpu: int | None = None, sick_s: float = 0.0,
) -> Path:  # fmt: skip
    """The recording's idle sample on ``n_gpus`` GPUs, a sample every 10 s over ``loop_s``:
    GPU i's free memory 40 GiB lower for one sample every ``dip_every_s``, starting at
    ``i * stagger_s``; GPU ``sick_gpu`` (if any) untouched by the dips, with remapped rows
    pending for the first ``sick_s`` of the loop."""
    raw = replicate(phase_samples(load_raw(H100), "idle"), n_gpus)
    first = raw["samples"][0]
    mib = 1024 * 1024
    samples = []
    for k in range(int(loop_s // 10)):
        t = k * 10.0
        sample = {**copy.deepcopy(first), "t": t}
        for i, g in enumerate(sample["gpus"]):
            g.pop("memory_v2_bytes", None)
            total, free = g["memory_bytes"]["total"], g["memory_bytes"]["free"]
            if i != sick_gpu and t >= i * stagger_s and (t - i * stagger_s) % dip_every_s == 0:
                free -= 40 * 1024 * mib
            g["memory_bytes"] = {"total": total, "used": total - free, "free": free}
            if i == sick_gpu:
                pending = int(t < sick_s)
                g["remapped_rows"] = {"correctable": 0, "uncorrectable": pending,
                                      "pending": pending, "failure": 0}  # fmt: skip
        samples.append(sample)
    raw.update(samples=samples, phases=[], interval_s=10.0)
    return write_trace(raw, name)


def neighbour_traces() -> dict[str, Path]:
    """Issue 48's churning neighbours: the issue's node (GPU 0 dips every 20 s, GPU 1's rows
    pending 300 s of every 600 s) and 8 GPUs dipping every 120 s, 15 s apart."""
    return {
        "neighbour-2gpu": neighbour_trace("neighbour-2gpu", 2, 20.0, 0.0, 600.0, 1, 300.0),
        "stagger-8gpu": neighbour_trace("stagger-8gpu", 8, 120.0, 15.0, 120.0),
    }


def calm_table(traces: dict[str, Path], budgets: Sequence[float], duration_s: float) -> str:
    """Node patches per hour and the longest a GPU's health stayed held, with the calm window
    node-wide (7078aa3, before) and per key (after), side by side."""

    def per_hour(count: float) -> float | int:
        return whole(round(count * HOUR_S / duration_s, 1))

    rows = []
    for name, path in traces.items():
        before = replay(path, budgets, duration_s, per_key=False)
        after = replay(path, budgets, duration_s, per_key=True)
        for old, new in zip(before, after, strict=True):
            rows.append([
                name, whole(new.budget_s), per_hour(old.patches), per_hour(new.patches),
                per_hour(old.urgent_patches), per_hour(new.urgent_patches),
                whole(old.health_held_s), whole(new.health_held_s),
            ])  # fmt: skip
    return table(
        ["trace", "budget s", "Node patches/h node-wide (before)", "per key (after)",
         "urgent/h before", "after", "GPU health held s before", "after"],
        rows,
    )  # fmt: skip


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
    calm = calm_table({**traces, **neighbour_traces()}, budgets, duration_s)
    return "\n\n".join([labels_table, patches_table, notes, cost_table, calm])


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

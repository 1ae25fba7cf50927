"""Topology: our placement vs NVIDIA's best-effort policy, on the same request sequences
(issue 50, item 5).

For each topology trace of tests/data (``*-topo-trace.json``), deterministic sequences of pods
of 1, 2, 4 and 8 whole GPUs (8 only on an 8-GPU node) arrive one per step and leave at a drawn
later step, fragmenting the node. Two allocators each keep their own state of which GPUs are
held and place every pod:

- **ours**: ``omaticaya_py.deviceplugin.allocation.preferred(states, available, (), size,
  topology)``, exactly as the device plugin's ``GetPreferredAllocation`` calls it: one
  ``DeviceState`` per GPU (its UUID, index, healthy, ``free_mib`` from the scenario),
  ``available`` the GPUs it does not hold, the trace's ``NodeTopology``.
- **NVIDIA**: a reference implementation of NVIDIA go-gpuallocator's best-effort policy, below
  (``nvidia_best_effort``), over the GPUs it does not hold in NVML index order (the order
  go-gpuallocator's own ``Allocator.Allocate`` passes them in).

Step order: the pods whose leave step has come leave, then one pod arrives. A pod that finds
fewer than its size of GPUs free is skipped (dropped, never queued): both allocators hold the
same number of GPUs at every step (each placed the same pods), so both skip the same pods.

Scenarios, per trace:

- ``uniform``: every GPU idle with the same free memory (the trace's first sample's most free),
  pods without a memory need: every allocation fits.
- ``live``: the free memory of the trace's sample with the least free in all (one or two GPUs
  carry a neighbour's memory), fixed for the sequence; each pod needs 30 or 60 GiB (drawn) on
  each of its GPUs. An allocation *fits* when every GPU it got has the need free. The device
  plugin API gives no memory need, so neither allocator refuses a GPU for it: a pod that does
  not fit is placed all the same and counted.

Both allocations are judged on ONE scale, ``NodeTopology.set_score`` (the sum of
``pair_score``: go-gpuallocator's scale, counting the NVLinks GPUs reach each other by through
NVSwitches), with NVIDIA's own-scale score beside it for reference (on the HGX board it counts
no NVSwitch link: equal for every pair there). Per trace and scenario: the summed scores and
their ratio ours/NVIDIA, how many allocations ours was below/equal/above NVIDIA's, the same
against NVIDIA's policy run on OUR free GPUs at that step (``same free``: the two rules on one
state, apart from where earlier choices left each node), the ratio over the allocations where
both fit, and the memory fits. Every allocation where ours scored below is printed in full with
its reason. Figures only: nothing is asserted on the ratios.

    .venv/bin/python bench/topology.py            # 3 traces x 2 scenarios x 5 seeds x 60 steps
    .venv/bin/python bench/topology.py --quick    # 1 seed, 12 steps (CI smoke)
    .venv/bin/python bench/topology.py --every    # every allocation, not the first --first
    .venv/bin/python bench/topology.py --json     # machine-readable
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, emit, header, table  # noqa: E402
from omaticaya_py.core.allocation.connected import MEMORY_GRAIN_MIB, roomy_floor  # noqa: E402
from omaticaya_py.core.model.topology import NodeTopology, pci_bdf  # noqa: E402
from omaticaya_py.deviceplugin.allocation import DeviceState, preferred  # noqa: E402
from omaticaya_py.sources.replay import TraceReader  # noqa: E402

TRACES = sorted((ROOT / "tests" / "data").glob("*-topo-trace.json"))
GIB = 1024
SCENARIOS = ("uniform", "live")
#: a pod's memory need per GPU in the ``live`` scenario, drawn evenly
NEEDS_MIB = (30 * GIB, 60 * GIB)
#: a pod leaves 1 .. this many steps after it arrives (drawn evenly)
MAX_LIFE_STEPS = 6
#: pod sizes and how often each is drawn: (size, weight); 8 only on a node with 8 GPUs
SIZE_WEIGHTS = ((1, 4), (2, 3), (4, 2), (8, 1))


# ----------------------------------------------------------------------------------------------
# NVIDIA go-gpuallocator's best-effort policy: a REFERENCE, written from the rules
# go-gpuallocator's public source states; not NVIDIA's code.
# Read (facts only): https://github.com/NVIDIA/go-gpuallocator at 876e7b7 (2026-08-14),
# gpuallocator/besteffort_policy.go, gpuallocator/device.go, gpuallocator/allocator.go,
# internal/links/device.go.
# ----------------------------------------------------------------------------------------------

#: PCIe common ancestor (NVML_TOPOLOGY_*) -> its points: same board 60, one switch 50,
#: several switches 40, host bridge 30, one NUMA node 20, across CPUs 10
NV_LEVEL_SCORE: Mapping[int, int] = {0: 60, 10: 50, 20: 40, 30: 30, 40: 20, 50: 10}
#: points per NVLink joining a pair
NV_LINK_SCORE = 100
#: the most NVLinks a pair's score counts: its link count stops there. 18 since
#: go-gpuallocator b7e889c (2023-11-16, "Extend policy to 18 NVLinks"); releases before it
#: stop at 12 and score a count of 13 or more as nothing. The traces here have at most 12
#: direct links per pair, so both read alike on them
NV_MAX_LINKS = 18


@dataclass(frozen=True)
class NvidiaView:
    """The pair facts go-gpuallocator scores, by NVML index: ``level[(a, b)]`` the PCIe common
    ancestor (``nvmlDeviceGetTopologyCommonAncestor``) as ``a`` reads it (absent when the trace
    lacks it: scored 0 here, where go-gpuallocator fails to build its device list);
    ``nvlinks[(a, b)]`` the active NVLinks of ``a`` whose remote PCI address
    (``nvmlDeviceGetNvLinkRemotePciInfo``) is ``b``'s, whatever the far end's device type: links
    to an NVSwitch name the switch's address, so GPUs joined through NVSwitches get none
    (its source leaves NVSwitch as a TODO)."""

    level: Mapping[tuple[int, int], int]
    nvlinks: Mapping[tuple[int, int], int]

    def pair_score(self, a: int | None, b: int | None) -> int:
        """The pair's points from ``a``'s view: its PCIe level's points plus 100 per NVLink
        (a count over ``NV_MAX_LINKS`` counts as that many); 0 with padding (``None``) or
        itself. Raises ``ValueError`` where the two GPUs' views disagree on whether an NVLink
        joins them (go-gpuallocator panics there: its links must be bidirectional)."""
        if a is None or b is None or a == b:
            return 0
        counts = [((x, y) in self.level) + (self.nvlinks.get((x, y), 0) > 0)
                  for x, y in ((a, b), (b, a))]  # fmt: skip
        if counts[0] != counts[1]:
            raise ValueError(f"GPUs {a} and {b}: links not bidirectional (NVIDIA panics)")
        score = NV_LEVEL_SCORE.get(self.level.get((a, b), -1), 0)
        return score + NV_LINK_SCORE * min(self.nvlinks.get((a, b), 0), NV_MAX_LINKS)

    def set_score(self, group: Sequence[int | None]) -> int:
        """The sum of the set's pair scores, each pair in the set's order."""
        return sum(self.pair_score(a, b) for a, b in combinations(group, 2))


def nvidia_view(raw: Mapping[str, Any]) -> NvidiaView:
    """``NvidiaView`` from a version 3 trace's raw ``devices[]`` (docs/trace-format.md): each
    device's ``topology`` (peer index -> level) and its ``nvlinks`` with ``state`` 1 whose
    ``remote_pci_bus_id`` is a GPU's ``pci_bus_id`` (both read in BDF form, as the allocator
    compares two addresses formatted alike)."""
    devices = raw["devices"]
    by_bus = {pci_bdf(d.get("pci_bus_id")): int(d["index"]) for d in devices}
    level: dict[tuple[int, int], int] = {}
    nvlinks: dict[tuple[int, int], int] = {}
    for d in devices:
        a = int(d["index"])
        for peer, lvl in (d.get("topology") or {}).items():
            if int(peer) != a:
                level[(a, int(peer))] = int(lvl)
        for link in d.get("nvlinks") or []:
            b = by_bus.get(pci_bdf(link.get("remote_pci_bus_id")))
            if link.get("state") == 1 and b is not None and b != a:
                nvlinks[(a, b)] = nvlinks.get((a, b), 0) + 1
    return NvidiaView(level, nvlinks)


def nvidia_partitions(devices: Sequence[int], size: int
                      ) -> Iterator[list[tuple[int | None, ...]]]:  # fmt: skip
    """Every partition of ``devices`` into sets of ``size``, in the policy's order: for
    ``size`` 1 each device alone, in order; else the list padded with ``None`` to a multiple
    of ``size``, each partition's sets led by the first device left, the rest of each set in
    lexicographic order, and only sets with no padding or all of it."""
    if size <= 0 or size > len(devices):
        return
    if size == 1:
        for d in devices:
            yield [(d,)]
        return
    padded: list[int | None] = [*devices, *([None] * (-len(devices) % size))]
    padding = padded.count(None)

    def walk(rest: list[int | None], accum: list[tuple[int | None, ...]]
             ) -> Iterator[list[tuple[int | None, ...]]]:  # fmt: skip
        if len(rest) == size:
            yield [*accum, tuple(rest)]
            return
        for tail in combinations(rest[1:], size - 1):
            group = (rest[0], *tail)
            if group.count(None) not in (0, padding):
                continue
            yield from walk([d for d in rest if d not in group], [*accum, group])

    yield from walk(padded, [])


def nvidia_best_effort(view: NvidiaView, available: Sequence[int], size: int
                       ) -> tuple[int | None, ...]:  # fmt: skip
    """The policy's ``size`` GPUs out of ``available`` (NVML indices, in the order given), no
    GPU required: of the partitions with a set without padding, the one with the highest sum
    of set scores (the first found on a tie); in it, the highest scoring set (the first on a
    tie). ``()`` when fewer than ``size`` are available. The set may hold padding (``None``)
    where a padded set outscores every full one: the policy returns it as it is."""
    if size <= 0 or len(available) < size:
        return ()
    best: list[tuple[int | None, ...]] | None = None
    best_score = 0
    for part in nvidia_partitions(list(available), size):
        if not any(None not in group for group in part):
            continue
        score = sum(view.set_score(group) for group in part)
        if best is None or score > best_score:
            best, best_score = part, score
    if not best:
        return ()
    chosen = best[0]
    for group in best[1:]:
        if view.set_score(group) > view.set_score(chosen):
            chosen = group
    return chosen


# ----------------------------------------------------------------------------------------------
# The sequences and the two allocators
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    """One request: arrives at ``step``, leaves at ``leave`` (a later step), ``size`` whole
    GPUs, ``need_mib`` free on each in the ``live`` scenario."""

    step: int
    size: int
    leave: int
    need_mib: int


def sequence(seed: int, steps: int, n_gpus: int) -> list[Pod]:
    """``steps`` pods, one per step, drawn from ``random.Random(seed)``: the size by
    ``SIZE_WEIGHTS`` (those up to ``n_gpus``), the life 1 .. ``MAX_LIFE_STEPS`` steps, the need
    of ``NEEDS_MIB``."""
    rng = random.Random(seed)
    sizes = [(s, w) for s, w in SIZE_WEIGHTS if s <= n_gpus]
    pods = []
    for step in range(steps):
        size = rng.choices([s for s, _ in sizes], weights=[w for _, w in sizes])[0]
        life = rng.randint(1, MAX_LIFE_STEPS)
        pods.append(Pod(step, size, step + life, rng.choice(NEEDS_MIB)))
    return pods


@dataclass(frozen=True)
class Node:
    """One trace: its name, GPUs (index -> UUID), our ``NodeTopology``, NVIDIA's view, and the
    free MiB per GPU of each scenario."""

    name: str
    uuids: Mapping[int, str]
    topology: NodeTopology
    view: NvidiaView
    free_mib: Mapping[str, Mapping[int, int]]


def load_node(path: Path) -> Node:
    """A trace replayed (``TraceReader(path, at_s=t).read()``): the topology and GPUs of its
    first sample, ``uniform`` free memory (the first sample's most free, on every GPU) and
    ``live`` (the sample with the least free memory in all, as read)."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    first = TraceReader(path, at_s=0).read()
    if first.topology is None:
        raise SystemExit(f"bench/topology.py: {path.name} has no topology (trace format 3)")
    uuids = {g.index: g.uuid or f"GPU-{g.index}" for g in first.gpus}
    idle = max(g.memory_free_mib or 0 for g in first.gpus)
    readings = [TraceReader(path, at_s=float(s["t"])).read() for s in raw["samples"]]
    loaded = min(readings, key=lambda r: sum(g.memory_free_mib or 0 for g in r.gpus))
    live = {g.index: g.memory_free_mib or 0 for g in loaded.gpus}
    name = path.name.removesuffix("-topo-trace.json")
    return Node(name, uuids, first.topology, nvidia_view(raw),
                {"uniform": dict.fromkeys(uuids, idle), "live": live})  # fmt: skip


@dataclass
class Allocation:
    """One pod placed by both, side by side: each set (NVML indices), its score on our scale
    (``NodeTopology.set_score``) and on NVIDIA's (``NvidiaView.set_score``), whether it fit;
    ``nvidia_same``: the set NVIDIA's policy takes from OUR free GPUs (the rules compared on
    one state), with its score on our scale."""

    seed: int
    step: int
    size: int
    need_gib: int
    ours: list[int]
    ours_score: int
    ours_nv_score: int
    ours_fit: bool
    nvidia: list[int]
    nvidia_score: int
    nvidia_nv_score: int
    nvidia_fit: bool
    nvidia_padded: bool = False
    nvidia_same: list[int] = field(default_factory=list)
    nvidia_same_score: int = 0
    why: str = ""
    free_ours: list[int] = field(default_factory=list)
    free_nvidia: list[int] = field(default_factory=list)

    @property
    def cmp(self) -> str:
        """``below``, ``equal`` or ``above``: ours against NVIDIA's on our scale."""
        return _cmp(self.ours_score, self.nvidia_score)

    @property
    def cmp_same(self) -> str:
        """Ours against NVIDIA's policy on ours' free GPUs, on our scale."""
        return _cmp(self.ours_score, self.nvidia_same_score)


def _cmp(ours: int, theirs: int) -> str:
    return "equal" if ours == theirs else "below" if ours < theirs else "above"


def ours_pick(node: Node, free: Mapping[int, int], idle: Sequence[int], size: int) -> list[int]:
    """Our ``size`` GPUs out of ``idle`` (NVML indices) as the device plugin chooses them."""
    states = {node.uuids[i]: DeviceState(node.uuids[i], i, True, free_mib=free[i])
              for i in node.uuids}  # fmt: skip
    by_id = {s.id: s.index for s in states.values()}
    ids = preferred(states, [node.uuids[i] for i in idle], [], size, node.topology)
    return [by_id[d] for d in ids]


def nvidia_pick(node: Node, idle: Sequence[int], size: int) -> tuple[list[int], bool]:
    """NVIDIA's ``size`` GPUs out of ``idle``, and whether the policy returned a padded set
    (then the best full set of its best partition stands in, to keep the sequence going)."""
    got = nvidia_best_effort(node.view, sorted(idle), size)
    if None not in got:
        return [g for g in got if g is not None], False
    full = [group for part in nvidia_partitions(sorted(idle), size) for group in part
            if None not in group]  # fmt: skip
    stand_in = max(full, key=node.view.set_score)
    return [g for g in stand_in if g is not None], True


def why_below(node: Node, free: Mapping[int, int], a: Allocation) -> str:
    """Why our set scores below NVIDIA's: the free GPUs differ after earlier choices (then what
    NVIDIA's policy takes from ours' free GPUs), memory first (NVIDIA's set holds a GPU with
    fewer whole GiB free than the floor of our candidates, ``core.allocation.connected``), or
    neither: ``unexpected``, a case to look at."""
    said = []
    if a.free_ours != a.free_nvidia:
        said.append(f"the free GPUs differ after earlier choices (ours {a.free_ours}, NVIDIA's "
                    f"{a.free_nvidia}); on ours' free GPUs NVIDIA's policy takes "
                    f"{a.nvidia_same} scoring {a.nvidia_same_score}")  # fmt: skip
        if a.nvidia_same_score <= a.ours_score:
            return said[0]
    gib = {i: free[i] // MEMORY_GRAIN_MIB for i in a.free_ours}
    floor = roomy_floor(sorted(gib.values(), reverse=True)[a.size - 1])
    short = [i for i in a.nvidia_same if gib[i] < floor]
    if short:
        shown = ", ".join(f"GPU {i} {gib[i]} GiB" for i in short)
        said.append(f"memory first: that set holds {shown} free, below ours' floor of "
                    f"{floor} GiB")  # fmt: skip
    else:
        said.append("unexpected: NVIDIA's set was among ours' candidates")
    return "; ".join(said)


def run_sequence(node: Node, scenario: str, seed: int, pods: Sequence[Pod]
                 ) -> tuple[list[Allocation], int]:  # fmt: skip
    """One sequence through both allocators: the allocations and the pods skipped."""
    free = node.free_mib[scenario]
    held: dict[str, dict[int, list[int]]] = {"ours": {}, "nvidia": {}}
    leave = {p.step: p.leave for p in pods}
    out: list[Allocation] = []
    skipped = 0
    for pod in pods:
        for side in held.values():
            for k in [k for k in side if leave[k] <= pod.step]:
                del side[k]
        idle = {s: sorted(set(node.uuids) - {g for gs in held[s].values() for g in gs})
                for s in held}  # fmt: skip
        if len(idle["ours"]) != len(idle["nvidia"]):
            raise RuntimeError("the two allocators hold different numbers of GPUs")
        if len(idle["ours"]) < pod.size:
            skipped += 1
            continue
        ours = ours_pick(node, free, idle["ours"], pod.size)
        theirs, padded = nvidia_pick(node, idle["nvidia"], pod.size)
        held["ours"][pod.step], held["nvidia"][pod.step] = ours, theirs
        need = pod.need_mib if scenario == "live" else 0
        a = Allocation(
            seed, pod.step, pod.size, need // GIB,
            sorted(ours), node.topology.set_score(ours), node.view.set_score(sorted(ours)),
            all(free[i] >= need for i in ours),
            sorted(theirs), node.topology.set_score(theirs), node.view.set_score(sorted(theirs)),
            all(free[i] >= need for i in theirs), padded,
            free_ours=idle["ours"], free_nvidia=idle["nvidia"],
        )  # fmt: skip
        a.nvidia_same = sorted(nvidia_pick(node, idle["ours"], pod.size)[0])
        a.nvidia_same_score = node.topology.set_score(a.nvidia_same)
        if a.cmp == "below":
            a.why = why_below(node, free, a)
        out.append(a)
    return out, skipped


# ----------------------------------------------------------------------------------------------
# Figures
# ----------------------------------------------------------------------------------------------


def summarise(name: str, scenario: str, allocs: Sequence[Allocation], skipped: int
              ) -> dict[str, Any]:  # fmt: skip
    """One trace and scenario over all its seeds: totals on both scales, the ratio ours/NVIDIA
    of the summed link score, how many allocations ours was below/equal/above, memory fits."""
    ours = sum(a.ours_score for a in allocs)
    theirs = sum(a.nvidia_score for a in allocs)
    ours_nv = sum(a.ours_nv_score for a in allocs)
    theirs_nv = sum(a.nvidia_nv_score for a in allocs)
    cmp = [a.cmp for a in allocs]
    same = [a.cmp_same for a in allocs]
    both = [a for a in allocs if a.ours_fit and a.nvidia_fit]
    both_theirs = sum(a.nvidia_score for a in both)
    return {
        "trace": name, "scenario": scenario, "allocations": len(allocs),
        "multi_gpu": sum(a.size > 1 for a in allocs), "skipped": skipped,
        "ours_score": ours, "nvidia_score": theirs,
        "ratio": ours / theirs if theirs else None,
        "ours_nv_score": ours_nv, "nvidia_nv_score": theirs_nv,
        "ratio_nv_scale": ours_nv / theirs_nv if theirs_nv else None,
        "below": cmp.count("below"), "equal": cmp.count("equal"), "above": cmp.count("above"),
        "same_free": {k: same.count(k) for k in ("below", "equal", "above")},
        "both_fit": len(both),
        "ratio_both_fit": sum(a.ours_score for a in both) / both_theirs if both_theirs else None,
        "ours_fits": sum(a.ours_fit for a in allocs),
        "nvidia_fits": sum(a.nvidia_fit for a in allocs),
        "nvidia_padded": sum(a.nvidia_padded for a in allocs),
    }  # fmt: skip


def alloc_rows(allocs: Sequence[Allocation]) -> str:
    """The allocations side by side."""
    yes = {True: "yes", False: "NO"}
    rows = [[a.seed, a.step, a.size, a.need_gib, ",".join(map(str, a.ours)), a.ours_score,
             a.ours_nv_score, yes[a.ours_fit], ",".join(map(str, a.nvidia)), a.nvidia_score,
             a.nvidia_nv_score, yes[a.nvidia_fit], a.cmp + (" (padded)" * a.nvidia_padded)]
            for a in allocs]  # fmt: skip
    return table(["seed", "step", "GPUs", "need GiB", "ours", "score", "(NV scale)", "fits",
                  "NVIDIA", "score", "(NV scale)", "fits", "ours vs NVIDIA"], rows)  # fmt: skip


def view_check(node: Node) -> str:
    """Where NVIDIA's own-scale pair score differs from ``NodeTopology.pair_score``, and by how
    much (the NVLinks through NVSwitches it does not count)."""
    gaps: dict[int, int] = {}
    for a, b in combinations(sorted(node.uuids), 2):
        gap = node.topology.pair_score(a, b) - node.view.pair_score(a, b)
        if gap:
            gaps[gap] = gaps.get(gap, 0) + 1
    said = ", ".join(f"{n} pairs by {gap:+}" for gap, n in sorted(gaps.items())) or "none"
    return f"{node.name}: pairs where NVIDIA's own scale differs from ours: {said}"


def case(node: Node, scenario: str, a: Allocation) -> str:
    """One allocation where ours scored below NVIDIA's, in full."""
    free = node.free_mib[scenario]
    gib = "  ".join(f"{i}:{free[i] // GIB}" for i in a.free_ours)
    return (f"{node.name} {scenario} seed {a.seed} step {a.step}: {a.size} GPUs, need "
            f"{a.need_gib} GiB; ours {a.ours} score {a.ours_score} (fits: {a.ours_fit}), "
            f"NVIDIA {a.nvidia} score {a.nvidia_score} (fits: {a.nvidia_fit})\n"
            f"  ours' free GPUs (GiB free): {gib}; NVIDIA's free: {a.free_nvidia}\n"
            f"  why: {a.why}")  # fmt: skip


SUMMARY_HEAD = ["trace", "scenario", "allocs", "multi-GPU", "skipped", "ours", "NVIDIA",
                "ratio", "ratio (NV scale)", "below", "equal", "above", "same free b/e/a",
                "ratio, both fit", "ours fit", "NVIDIA fit"]  # fmt: skip


def summary_rows(summaries: Sequence[dict[str, Any]]) -> str:
    """The summary table."""
    rows = [[s["trace"], s["scenario"], s["allocations"], s["multi_gpu"], s["skipped"],
             s["ours_score"], s["nvidia_score"], _ratio(s["ratio"]),
             _ratio(s["ratio_nv_scale"]), s["below"], s["equal"], s["above"],
             "/".join(str(v) for v in s["same_free"].values()),
             f"{_ratio(s['ratio_both_fit'])} ({s['both_fit']})",
             f"{s['ours_fits']}/{s['allocations']}",
             f"{s['nvidia_fits']}/{s['allocations']}"] for s in summaries]  # fmt: skip
    return table(SUMMARY_HEAD, rows)


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def run_all(paths: Sequence[Path], seeds: Sequence[int], steps: int
            ) -> list[tuple[Node, str, list[Allocation], int]]:  # fmt: skip
    """Every trace x scenario x seed: ``(node, scenario, allocations, skipped)`` per trace and
    scenario, the seeds' allocations in seed order."""
    results = []
    for path in paths:
        node = load_node(path)
        for scenario in SCENARIOS:
            allocs: list[Allocation] = []
            skipped = 0
            for seed in seeds:
                got, skip = run_sequence(node, scenario, seed,
                                         sequence(seed, steps, len(node.uuids)))  # fmt: skip
                allocs += got
                skipped += skip
            results.append((node, scenario, allocs, skipped))
    return results


def report(results: Sequence[tuple[Node, str, list[Allocation], int]], first: int | None,
           title: str) -> str:  # fmt: skip
    """The plain-text report: the scales' check, each run's allocations (the first ``first``;
    all when ``None``), every case where ours scored below NVIDIA's, the summary."""
    parts = [title]
    nodes = list({id(n): n for n, _, _, _ in results}.values())
    parts.append("reference view (from the traces' raw devices[]) vs NodeTopology.pair_score:\n"
                 + "\n".join(view_check(n) for n in nodes))  # fmt: skip
    below: list[str] = []
    padded = 0
    for node, scenario, allocs, _ in results:
        shown = allocs if first is None else allocs[:first]
        more = "" if len(shown) == len(allocs) else f" (first {len(shown)} of {len(allocs)})"
        parts.append(f"-- {node.name}, {scenario}{more}\n{alloc_rows(shown)}")
        below += [case(node, scenario, a) for a in allocs if a.cmp == "below"]
        padded += sum(a.nvidia_padded for a in allocs)
    parts.append(f"ours below NVIDIA: {len(below)} allocation(s)"
                 + ("".join("\n" + c for c in below)))  # fmt: skip
    if padded:
        parts.append(f"NVIDIA's policy returned a set with padding {padded} time(s) (its "
                     "best full set stood in)")  # fmt: skip
    summaries = [summarise(n.name, s, a, k) for n, s, a, k in results]
    parts.append("summary: link score on our scale (NodeTopology.set_score), ratio ours/NVIDIA\n"
                 + summary_rows(summaries))  # fmt: skip
    return "\n\n".join(parts)


def as_json(results: Sequence[tuple[Node, str, list[Allocation], int]], seeds: Sequence[int],
            steps: int) -> str:  # fmt: skip
    """The allocations and summaries as JSON."""
    runs = [{"trace": n.name, "scenario": s, "skipped": k,
             "allocations": [{**asdict(a), "cmp": a.cmp} for a in allocs]}
            for n, s, allocs, k in results]  # fmt: skip
    summaries = [summarise(n.name, s, a, k) for n, s, a, k in results]
    return json.dumps({"seeds": list(seeds), "steps": steps, "runs": runs,
                       "summary": summaries}, indent=1)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, action="append",
                    help="a version 3 trace (repeatable); default: the topology traces")  # fmt: skip
    ap.add_argument("--seeds", type=int, default=5, help="sequences per trace (seeds 0 .. n-1)")
    ap.add_argument("--steps", type=int, default=60, help="pods per sequence, one per step")
    ap.add_argument("--first", type=int, default=12, help="allocations printed per run")
    ap.add_argument("--every", action="store_true", help="print every allocation")
    ap.add_argument("--quick", action="store_true", help="1 seed, 12 steps (CI smoke)")
    ap.add_argument("--json", action="store_true", help="machine-readable output only")
    args = ap.parse_args(argv)
    seeds = range(1 if args.quick else max(1, args.seeds))
    steps = 12 if args.quick else max(1, args.steps)
    paths = args.trace or TRACES
    if not paths:
        print("bench/topology.py: no *-topo-trace.json in tests/data", file=sys.stderr)
        return 1
    results = run_all(paths, list(seeds), steps)
    if args.json:
        print(as_json(results, list(seeds), steps))
        return 0
    title = header("topology: our placement vs NVIDIA's best-effort policy (reference)")
    emit(report(results, None if args.every else args.first, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())

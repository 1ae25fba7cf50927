"""DRA: binpack by live memory without the extender (issue 51, item 2), simulated.

docs/dra.md ("Binpack and spread by live memory, without the extender") gives a claim whose
request is a ``firstAvailable`` list of up to 8 subrequests, each a range of the device
attribute ``freeMemoryMiB`` (tightest first). kube-scheduler v1.37.2 scores each node by the
subrequest its allocator satisfied there (``computeScore`` in
pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go, lines 1414-1459:
``FirstAvailableDeviceRequestMaxSize - i``, i.e. 8 - i), normalized over the nodes
(``DefaultNormalizeScore``, line 1469); the allocator tries the subrequests in order and, within
one, the devices in slice order (staging/.../dynamic-resource-allocation/structured/internal/
incubating/allocator_incubating.go, ``allocateOne``, lines 977-1011 and 1085-1197). The highest
total wins (a max-heap, pkg/scheduler/framework/sorted_nodes.go lines 60-64). Equal totals: with
an extender, drawn at random (``Randomizer = rand.Int()``, schedule_one.go lines 1039-1047, set
only for nodes an extender scored); without one, whichever equal node the heap holds at its
root, decided by the order the filters found the nodes in (the scan starts where the previous
pod's stopped): a rotating choice. Here every tie is drawn at random from the seed (the
extender's as kube-scheduler does; the recipe's and the stock scheduler's standing in for the
rotation).

The same pod sequence (memory needs drawn from fixed seeds, arriving and leaving) is placed on
N simulated nodes of 8 GPUs by:

- **extender**: our scheduler extender's binpack and the device plugin's choice, by the product
  code: ``core.allocation.placement.place`` on each node's ``NodeGpuState`` (what the fit rule
  ``scheduler.fit.room`` calls), the nodes scored by ``scheduler.fit.scores`` (1..10 linear
  between the least and the most room), the highest score taken, a tie drawn at random as
  kube-scheduler does for extender scores; the GPU is ``Taken``'s (for a whole GPU the device
  plugin's choice, the node's roomiest: it is not told the need);
- **recipe (doubling)** and **recipe (even)**: the docs' claim as the scheduler's rule scores it
  (above): per node the first satisfiable subrequest ``i`` and its first device in index (slice)
  order; the nodes with the least ``i`` (score 8 - i, the highest) tie, one drawn at random
  (see above).
  ``doubling`` cuts the ranges at 1, 2, 4 ... 64 GiB above the need (the docs' choice);
  ``even`` cuts [need, GPU memory] into 8 equal ranges;
- **stock**: the stock scheduler with the docs' plain claim (``freeMemoryMiB >= need``, one
  ``exactly`` request): every fitting node scores the same for DRA (0), one is drawn at random
  (see above), and on it the first fitting device in index order (first fit).

Other score plugins are taken as equal on every node (they are not: NodeResourcesFit's
LeastAllocated and BalancedAllocation lean to the emptier node, docs/dra.md says by how much).

Two kinds of pods, each its own run:

- ``slices``: every GPU shared (1 GiB units, capacity 79 GiB: an H100 80GB's), a pod takes a
  slice of its need; a GPU takes it when its live free memory has it (what ``freeMemoryMiB``
  publishes: the GPU's memory less what processes outside the pods hold, less the slices placed,
  which use all their memory at once) and its capacity left does (the scheduler's consumable
  capacity; the extender's ``units_left``);
- ``whole``: a pod takes a whole GPU that has its need free (exclusive); a GPU's free memory is
  its memory less what processes outside the pods hold (another tenant, a daemon).

Each GPU starts with such outside use drawn from the seed (``background``), the same for every
placement. Per seed, two phases, each from the empty cluster:

- **fill**: pods arrive and never leave (twice what the cluster holds; a refused pod is
  dropped, the next one tried): the pods placed before the first refusal and, as that refusal
  finds the cluster, the GPUs left empty (no pod), the GPUs with the typical need free and the
  free memory stranded (in pieces smaller than the typical need, as a share of the free memory
  pods can use); at the end, the share of the cluster filled (slices: of the memory the outside
  use leaves; whole: of the GPUs);
- **churn**: one pod arrives each step and leaves after a drawn lifetime (``--load``: the
  offered load, 0.9 x what the cluster holds at the mean need): the pods refused, the stranded
  share and the empty GPUs averaged over the steps after a warm-up (one mean lifetime).

Figures only, averaged over the seeds, with each placement's ratio to the extender's; nothing
is asserted on them. Timings are not measured (a pure simulation).

    .venv/bin/python bench/dra_binpack.py                 # 32 nodes x 8 GPUs, 3 seeds
    .venv/bin/python bench/dra_binpack.py --quick         # 4 nodes, 1 seed (CI smoke)
    .venv/bin/python bench/dra_binpack.py --claim 20 --gpu-gib 80 [--spread] [--shared]
                                                          # print the docs' claim for a need
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import emit, header, table  # noqa: E402
from omaticaya_py.core.allocation.placement import Need, place  # noqa: E402
from omaticaya_py.core.schema import GpuInfo, NodeGpuState  # noqa: E402
from omaticaya_py.scheduler.fit import scores  # noqa: E402

GIB = 1024
#: ``resourceapi.FirstAvailableDeviceRequestMaxSize`` (k8s.io/api resource/v1 types.go, v0.37.2):
#: the most subrequests a request may list, and the score of the first
MAX_SUBREQUESTS = 8
#: the driver, its attribute and its DeviceClasses (docs/dra.md)
DRIVER = "gpu.omaticaya.io"
ATTR = f'device.attributes["{DRIVER}"].freeMemoryMiB'
WHOLE_CLASS, SHARED_CLASS = DRIVER, f"shared.{DRIVER}"
#: an H100 80GB's memory capacity as the driver publishes it (1 GiB units: 79 GiB)
GPU_TOTAL_MIB = 79 * GIB
GPUS_PER_NODE = 8
KINDS = ("slices", "whole")
SPACINGS = ("doubling", "even")
PLACERS = ("extender", "recipe (doubling)", "recipe (even)", "stock")
#: memory needs drawn evenly, GiB, and the typical need (the median) stranding is judged by
NEEDS_GIB = {
    "slices": (4, 8, 8, 12, 16, 16, 24, 32, 48, 64),
    "whole": (8, 16, 24, 32, 40, 48, 60, 70),
}
TYPICAL_GIB = {"slices": 16, "whole": 36}


def background(kind: str, rng: random.Random) -> int:
    """One GPU's memory held outside the pods, MiB: for slices none on half the GPUs, else 1 to
    40 GiB; for whole GPUs 0 to 60 GiB, evenly (whole GiB)."""
    if kind == "slices":
        return 0 if rng.random() < 0.5 else rng.randint(1, 40) * GIB
    return rng.randint(0, 60) * GIB


# ---------------------------------------------------------------------- the recipe ----


Range = tuple[int, int | None]


def ranges(need_mib: int, total_mib: int, spacing: str = "doubling", step_mib: int = GIB,
           n: int = MAX_SUBREQUESTS) -> tuple[Range, ...]:  # fmt: skip
    """The ``freeMemoryMiB`` ranges ``[lo, hi)`` of the docs' binpack claim for a need of
    ``need_mib`` on GPUs of ``total_mib``, tightest first (``hi`` ``None``: no upper bound, the
    last one, so the claim fits wherever the need does). At most ``n`` (8, the API's limit).

    ``doubling``: cut at 1, 2, 4 ... step(s) above the need (fine where a GPU is nearly full,
    coarse where it is nearly empty); cuts at or above ``total_mib`` are dropped (fewer ranges).
    ``even``: ``[need, total]`` in ``n`` equal ranges, each a whole number of steps. Raises
    ``ValueError`` for a need not below the total or not positive."""
    if not 0 < need_mib < total_mib:
        raise ValueError(f"need {need_mib} MiB must be above 0 and below the GPU's {total_mib}")
    if spacing == "doubling":
        cuts = [need_mib + step_mib * 2**k for k in range(n - 1)]
    elif spacing == "even":
        width = max(step_mib, math.ceil((total_mib - need_mib) / n / step_mib) * step_mib)
        cuts = [need_mib + width * k for k in range(1, n)]
    else:
        raise ValueError(f"spacing {spacing!r}: doubling or even")
    cuts = [c for c in cuts if c < total_mib]
    bounds: list[int | None] = [need_mib, *cuts, None]
    return tuple((lo, hi) for lo, hi in zip(bounds, bounds[1:], strict=False))  # type: ignore[misc]


def ordered(rs: Sequence[Range], policy: str) -> list[Range]:
    """The ranges in the claim's order: ``binpack`` tightest first, ``spread`` most free first."""
    if policy not in ("binpack", "spread"):
        raise ValueError(f"policy {policy!r}: binpack or spread")
    return list(rs) if policy == "binpack" else list(reversed(rs))


def cel(r: Range) -> str:
    """The CEL selector of one range."""
    lo, hi = r
    low = f"{ATTR} >= {lo}"
    return low if hi is None else f"{low} && {ATTR} < {hi}"


def claim_template(name: str, need_mib: int, total_mib: int, *, policy: str = "binpack",
                   spacing: str = "doubling", shared: bool = False) -> dict[str, Any]:  # fmt: skip
    """The docs' ResourceClaimTemplate ``name``: one request ``gpu`` whose ``firstAvailable``
    subrequests (``r0``, ``r1`` ...) are ``ranges`` in ``policy``'s order; a whole GPU of the
    DeviceClass ``gpu.omaticaya.io``, or with ``shared`` a slice of ``need_mib`` (capacity
    ``memory``) of one of ``shared.gpu.omaticaya.io``."""
    subs = []
    for k, r in enumerate(ordered(ranges(need_mib, total_mib, spacing), policy)):
        sub: dict[str, Any] = {"name": f"r{k}",
                               "deviceClassName": SHARED_CLASS if shared else WHOLE_CLASS,
                               "selectors": [{"cel": {"expression": cel(r)}}]}  # fmt: skip
        if shared:
            size = f"{need_mib // GIB}Gi" if need_mib % GIB == 0 else f"{need_mib}Mi"
            sub["capacity"] = {"requests": {"memory": size}}
        subs.append(sub)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": subs}]}}},
    }


def claim_yaml(body: dict[str, Any]) -> str:
    """``claim_template``'s object as docs/dra.md prints it: one line per field of each
    subrequest, its selector on one line (YAML that ``yaml.safe_load`` reads back as ``body``)."""
    lines = [f"apiVersion: {body['apiVersion']}", f"kind: {body['kind']}",
             f"metadata: {{name: {body['metadata']['name']}}}", "spec:", "  spec:",
             "    devices:", "      requests:"]  # fmt: skip
    for req in body["spec"]["spec"]["devices"]["requests"]:
        lines += [f"      - name: {req['name']}", "        firstAvailable:"]
        for sub in req["firstAvailable"]:
            expr = sub["selectors"][0]["cel"]["expression"]
            lines += [f"        - name: {sub['name']}",
                      f"          deviceClassName: {sub['deviceClassName']}",
                      f"          selectors: [{{cel: {{expression: '{expr}'}}}}]"]  # fmt: skip
            if "capacity" in sub:
                memory = sub["capacity"]["requests"]["memory"]
                lines.append(f"          capacity: {{requests: {{memory: {memory}}}}}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- the cluster ----


@dataclass
class Gpu:
    """One simulated GPU: ``background_mib`` held outside the pods, ``claimed_mib`` by slices
    placed here (they use it all at once), ``held`` by a whole-GPU pod."""

    background_mib: int
    claimed_mib: int = 0
    held: bool = False

    @property
    def free_mib(self) -> int:
        """Live free memory, as ``freeMemoryMiB`` publishes it (whole GiB here)."""
        return GPU_TOTAL_MIB - self.background_mib - self.claimed_mib

    def takes(self, kind: str, need_mib: int) -> bool:
        """Whether a pod of ``need_mib`` fits here: a slice where the live free memory and the
        capacity left have it; a whole GPU when it is not held and has it free."""
        if kind == "slices":
            return self.free_mib >= need_mib and GPU_TOTAL_MIB - self.claimed_mib >= need_mib
        return not self.held and self.free_mib >= need_mib


@dataclass
class Cluster:
    """N nodes of 8 GPUs; ``version`` per node, bumped at each change (the extender's states
    are rebuilt only for nodes that changed)."""

    nodes: list[list[Gpu]]
    version: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, backgrounds: Sequence[Sequence[int]]) -> Cluster:
        nodes = [[Gpu(b) for b in row] for row in backgrounds]
        return cls(nodes, [0] * len(nodes))

    def put(self, kind: str, node: int, gpu: int, need_mib: int) -> None:
        g = self.nodes[node][gpu]
        if kind == "slices":
            g.claimed_mib += need_mib
        else:
            g.held = True
        self.version[node] += 1

    def remove(self, kind: str, node: int, gpu: int, need_mib: int) -> None:
        g = self.nodes[node][gpu]
        if kind == "slices":
            g.claimed_mib -= need_mib
        else:
            g.held = False
        self.version[node] += 1

    def rooms(self, kind: str) -> list[int]:
        """What each GPU can still give a pod, MiB (0 for a held one)."""
        out = []
        for row in self.nodes:
            for g in row:
                if kind == "slices":
                    out.append(max(0, min(g.free_mib, GPU_TOTAL_MIB - g.claimed_mib)))
                else:
                    out.append(0 if g.held else g.free_mib)
        return out

    def empty_gpus(self, kind: str) -> int:
        return sum(1 for row in self.nodes for g in row
                   if (g.claimed_mib == 0 if kind == "slices" else not g.held))  # fmt: skip


#: a placement: (cluster, kind, need MiB, rng) -> (node, GPU) or None (refused)
Placer = Callable[[Cluster, str, int, random.Random], "tuple[int, int] | None"]


def recipe_placer(spacing: str) -> Placer:
    """The docs' claim (binpack ranges of ``spacing``) as kube-scheduler v1.37.2 scores it."""
    cache: dict[int, tuple[Range, ...]] = {}

    def choose(c: Cluster, kind: str, need: int, rng: random.Random) -> tuple[int, int] | None:
        rs = cache.get(need) or cache.setdefault(need, ranges(need, GPU_TOTAL_MIB, spacing))
        best: list[tuple[int, int]] = []
        best_i = len(rs)
        for n, row in enumerate(c.nodes):
            fits = [(k, g.free_mib) for k, g in enumerate(row) if g.takes(kind, need)]
            if not fits:
                continue
            # the allocator: subrequests in order, devices in slice order within one
            for i, (lo, hi) in enumerate(rs[: best_i + 1]):
                k = next((k for k, f in fits if f >= lo and (hi is None or f < hi)), None)
                if k is not None:
                    if i < best_i:
                        best_i, best = i, []
                    best.append((n, k))
                    break
        return rng.choice(best) if best else None

    return choose


def stock_placer(c: Cluster, kind: str, need: int, rng: random.Random) -> tuple[int, int] | None:
    """The stock scheduler, plain claim: a fitting node at random, its first fitting GPU."""
    fitting = []
    for n, row in enumerate(c.nodes):
        k = next((k for k, g in enumerate(row) if g.takes(kind, need)), None)
        if k is not None:
            fitting.append((n, k))
    return rng.choice(fitting) if fitting else None


def extender_placer() -> Placer:
    """Our extender's binpack, by the product code (``placement.place``, ``fit.scores``)."""
    states: dict[tuple[str, int], tuple[int, NodeGpuState]] = {}

    def state(c: Cluster, kind: str, n: int) -> NodeGpuState:
        key = (kind, n)
        kept = states.get(key)
        if kept is not None and kept[0] == c.version[n]:
            return kept[1]
        row = c.nodes[n]
        name = f"node-{n}"
        if kind == "slices":
            shared = tuple(GpuInfo(k, g.free_mib, True, total_mib=GPU_TOTAL_MIB,
                                   units_left=(GPU_TOTAL_MIB - g.claimed_mib) // GIB)
                           for k, g in enumerate(row))  # fmt: skip
            s = NodeGpuState(name, known=True, health="Healthy", shared=shared,
                             share_unit_mib=GIB)  # fmt: skip
        else:
            gpus = tuple(GpuInfo(k, 0 if g.held else g.free_mib, True, total_mib=GPU_TOTAL_MIB,
                                 assigned=g.held, assigned_free_mib=g.free_mib if g.held else None)
                         for k, g in enumerate(row))  # fmt: skip
            s = NodeGpuState(name, known=True, health="Healthy", gpus=gpus,
                             free_total_mib=sum(g.free_mib for g in gpus))  # fmt: skip
        states[key] = (c.version[n], s)
        return s

    def choose(c: Cluster, kind: str, need: int, rng: random.Random) -> tuple[int, int] | None:
        want = (Need(0, 1, slices=(need // GIB,)) if kind == "slices"
                else Need(need, 1, exclusive=True))  # fmt: skip
        room: dict[str, int] = {}
        where: dict[str, int] = {}
        for n in range(len(c.nodes)):
            taken = place(state(c, kind, n), want, "binpack")
            if taken is None:
                continue
            name = f"node-{n}"
            room[name] = taken.room_mib
            where[name] = taken.slices[0] if kind == "slices" else taken.gpus[0]
        if not room:
            return None
        ranked = scores(room, "binpack")
        top = max(ranked.values())
        name = rng.choice([m for m, s in ranked.items() if s == top])
        return int(name.split("-")[1]), where[name]

    return choose


# ---------------------------------------------------------------------- the runs ----


@dataclass
class Result:
    """One placement's figures on one seed and kind (see the module's docstring)."""

    before_refusal: int = 0
    placed: int = 0
    placed_mib: int = 0
    fill_pct: float = 0.0
    offered: int = 0
    fill_empty_gpus: int = 0
    fill_roomy_gpus: int = 0
    fill_stranded_pct: float = 0.0
    churn_refused_pct: float = 0.0
    churn_stranded_pct: float = 0.0
    churn_empty_gpus: float = 0.0


def stranded_pct(rooms: Sequence[int], typical_mib: int) -> float:
    """The share of the usable free memory in pieces smaller than the typical need, %."""
    total = sum(rooms)
    if total == 0:
        return 0.0
    return 100.0 * sum(r for r in rooms if 0 < r < typical_mib) / total


def fill(placer: Placer, backgrounds: Sequence[Sequence[int]], kind: str,
         needs: Sequence[int], seed: int, r: Result) -> None:  # fmt: skip
    c = Cluster.of(backgrounds)
    rng = random.Random(seed * 7919 + 1)
    refused = False
    typical = TYPICAL_GIB[kind] * GIB
    for need in needs:
        got = placer(c, kind, need, rng)
        if got is None:
            if not refused:  # the cluster as the first refusal finds it
                rooms = c.rooms(kind)
                r.fill_empty_gpus = c.empty_gpus(kind)
                r.fill_roomy_gpus = sum(1 for m in rooms if m >= typical)
                r.fill_stranded_pct = stranded_pct(rooms, typical)
            refused = True
            continue
        c.put(kind, *got, need)
        r.placed += 1
        r.placed_mib += need
        r.before_refusal += 0 if refused else 1
    r.offered = len(needs)
    usable = sum(GPU_TOTAL_MIB - g.background_mib for row in c.nodes for g in row)
    r.fill_pct = (
        100.0 * r.placed_mib / usable
        if kind == "slices"
        else 100.0 * r.placed / (len(c.nodes) * GPUS_PER_NODE)
    )


def churn(placer: Placer, backgrounds: Sequence[Sequence[int]], kind: str,
          arrivals: Sequence[tuple[int, int]], warmup: int, r: Result, seed: int) -> None:  # fmt: skip
    c = Cluster.of(backgrounds)
    rng = random.Random(seed * 7919 + 2)
    leaving: dict[int, list[tuple[int, int, int]]] = {}
    refused = counted = 0
    stranded = empty = 0.0
    for step, (need, life) in enumerate(arrivals):
        for node, gpu, mib in leaving.pop(step, ()):
            c.remove(kind, node, gpu, mib)
        got = placer(c, kind, need, rng)
        if got is not None:
            c.put(kind, *got, need)
            leaving.setdefault(step + life, []).append((*got, need))
        if step >= warmup:
            counted += 1
            refused += got is None
            stranded += stranded_pct(c.rooms(kind), TYPICAL_GIB[kind] * GIB)
            empty += c.empty_gpus(kind)
    r.churn_refused_pct = 100.0 * refused / max(1, counted)
    r.churn_stranded_pct = stranded / max(1, counted)
    r.churn_empty_gpus = empty / max(1, counted)


def workload(kind: str, nodes: int, seed: int, churn_steps: int | None, load: float = 0.9
             ) -> tuple[list[list[int]], list[int], list[tuple[int, int]], int]:  # fmt: skip
    """The seed's cluster and pods: each GPU's outside use, the fill phase's needs (twice what
    the cluster's memory holds at the mean need), the churn phase's (need, lifetime) and its
    warm-up steps."""
    rng = random.Random(f"{kind}-{seed}")
    backgrounds = [[background(kind, rng) for _ in range(GPUS_PER_NODE)] for _ in range(nodes)]
    needs = NEEDS_GIB[kind]
    mean_mib = sum(needs) / len(needs) * GIB
    if kind == "slices":
        holds = sum(GPU_TOTAL_MIB - b for row in backgrounds for b in row) / mean_mib
    else:
        holds = nodes * GPUS_PER_NODE
    fill_needs = [rng.choice(needs) * GIB for _ in range(int(2 * holds))]
    life = max(2, int(load * holds))  # mean lifetime: the offered load, x what fits
    steps = churn_steps if churn_steps is not None else 4 * life
    arrivals = [(rng.choice(needs) * GIB, rng.randint(1, 2 * life - 1)) for _ in range(steps)]
    return backgrounds, fill_needs, arrivals, min(life, steps // 2)


def placers() -> dict[str, Placer]:
    return {
        "extender": extender_placer(),
        "recipe (doubling)": recipe_placer("doubling"),
        "recipe (even)": recipe_placer("even"),
        "stock": stock_placer,
    }


def run(kinds: Sequence[str], nodes: int, seeds: Sequence[int], churn_steps: int | None,
        load: float = 0.9) -> dict[str, dict[str, list[Result]]]:  # fmt: skip
    out: dict[str, dict[str, list[Result]]] = {k: {p: [] for p in PLACERS} for k in kinds}
    for kind in kinds:
        for seed in seeds:
            backgrounds, fill_needs, arrivals, warmup = workload(
                kind, nodes, seed, churn_steps, load
            )
            for name, placer in placers().items():
                r = Result()
                fill(placer, backgrounds, kind, fill_needs, seed, r)
                churn(placer, backgrounds, kind, arrivals, warmup, r, seed)
                out[kind][name].append(r)
    return out


def mean(rs: Sequence[Result], attr: str) -> float:
    return sum(float(getattr(r, attr)) for r in rs) / max(1, len(rs))


METRICS = (
    ("placed before the first refusal", "before_refusal", True),
    ("filled % at the end (fill)", "fill_pct", True),
    ("GPUs left empty at it", "fill_empty_gpus", True),
    ("GPUs with the typical need free at it", "fill_roomy_gpus", True),
    ("stranded free % at it", "fill_stranded_pct", False),
    ("refused % (churn)", "churn_refused_pct", False),
    ("stranded free % (churn)", "churn_stranded_pct", False),
    ("GPUs empty, mean (churn)", "churn_empty_gpus", True),
)


def ratio(value: float, base: float) -> float:
    return float("nan") if base == 0 else value / base


def report(results: dict[str, dict[str, list[Result]]], nodes: int, seeds: int) -> str:
    parts = []
    for kind, by in results.items():
        base = by["extender"]
        rows = []
        for label, attr, _ in METRICS:
            b = mean(base, attr)
            row: list[Any] = [label]
            for p in PLACERS[1:]:
                row.append(ratio(mean(by[p], attr), b))
            row += [mean(by[p], attr) for p in PLACERS]
            rows.append(row)
        heads = ["", "recipe(dbl)/ext", "recipe(even)/ext", "stock/ext",
                 "extender", "recipe(dbl)", "recipe(even)", "stock"]  # fmt: skip
        offered = int(mean(base, "offered"))
        parts.append(
            f"{kind}: {nodes} nodes x {GPUS_PER_NODE} GPUs, {seeds} seed(s), {offered} pods "
            f"offered in the fill phase; needs {NEEDS_GIB[kind]} GiB (typical "
            f"{TYPICAL_GIB[kind]}); ratios first (higher is better for placed and empty GPUs, "
            "lower for refused and stranded)\n" + table(heads, rows)
        )
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=32, help="nodes of 8 GPUs")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0 .. n-1")
    ap.add_argument("--kind", choices=KINDS, action="append", help="default: both")
    ap.add_argument("--churn-steps", type=int, help="default: 4 mean lifetimes")
    ap.add_argument("--load", type=float, default=0.9,
                    help="churn: the pods' memory offered, x what the cluster holds")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="4 nodes, 1 seed (CI smoke)")
    ap.add_argument("--claim", type=int, metavar="GIB",
                    help="print the docs' claim for this need (GiB) and exit")  # fmt: skip
    ap.add_argument("--gpu-gib", type=int, default=80, help="with --claim: the GPUs' memory")
    ap.add_argument("--spread", action="store_true", help="with --claim: the spread order")
    ap.add_argument("--shared", action="store_true", help="with --claim: a slice of a shared GPU")
    ap.add_argument("--spacing", choices=SPACINGS, default="doubling", help="with --claim")
    args = ap.parse_args(argv)
    if args.claim is not None:
        policy = "spread" if args.spread else "binpack"
        name = f"gpu-{args.claim}gib-{policy}" + ("-slice" if args.shared else "")
        body = claim_template(name, args.claim * GIB, args.gpu_gib * GIB, policy=policy,
                              spacing=args.spacing, shared=args.shared)  # fmt: skip
        print(claim_yaml(body), end="")
        return 0
    nodes = 4 if args.quick else max(1, args.nodes)
    seeds = list(range(1 if args.quick else max(1, args.seeds)))
    kinds = args.kind or list(KINDS)
    results = run(kinds, nodes, seeds, 200 if args.quick else args.churn_steps, args.load)
    title = header("DRA: binpack by live memory without the extender (simulated)")
    emit(title, report(results, nodes, len(seeds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pods the extender passes and the device plugin then refuses, in process, before vs after.

Random mixes of whole-GPU and slice pods (``--mixes``, seeded) arrive on one node of the recorded
8-GPU trace (GPUs 0-3 shared in 1 GiB units), through kube-scheduler's own count, the real
extender (``Extender.filter`` and its ledger) and the device plugin's own rules
(``tests/seam.py``); the pods use no memory, so only the kubelet's books show them. Prints, per
tree, the pods admitted, left Pending and refused at the seam (passed by the extender, then
refused by the plugin or handed a whole GPU without the pod's memory free: a pod that would fail
admission with UnexpectedAdmissionError, or run without room).

``--before-rev REV`` runs the same mixes on a ``git worktree`` of REV (with this tree's
``tests/seam.py``) in a subprocess, side by side with the working tree.

    .venv/bin/python bench/seam.py --mixes 300 --before-rev 74c5603
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/seam.py


def mixes(n: int, seed: int) -> list[list[tuple[Any, ...]]]:
    """``n`` mixes of 1-14 pods: ``("whole", GiB, count)`` or ``("slice", units...)``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        pods: list[tuple[Any, ...]] = []
        for _ in range(rng.randint(1, 14)):
            if rng.random() < 0.4:
                pods.append(("whole", rng.randint(1, 80), rng.randint(1, 2)))
            else:
                pods.append(("slice", *(rng.randint(1, 80) for _ in range(rng.randint(1, 3)))))
        out.append(pods)
    return out


def run(n: int, seed: int) -> dict[str, int]:
    """The outcomes over ``mixes(n, seed)`` in this interpreter's tree."""
    from loguru import logger

    logger.remove()
    from tests import seam

    counts: Counter[str] = Counter()
    for m in mixes(n, seed):
        node = seam.Seam()
        for i, pod in enumerate(m):
            doc = (seam.whole_pod(f"w{i}", pod[1] * 1024, pod[2]) if pod[0] == "whole"
                   else seam.slice_pod(f"s{i}", *pod[1:]))  # fmt: skip
            counts[node.arrive(doc)] += 1
    return dict(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mixes", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--before-rev", default="")
    ap.add_argument("--json", action="store_true", help="print this tree's counts as JSON")
    a = ap.parse_args()
    if a.json:
        import omaticaya_py

        print(f"tree: {Path(omaticaya_py.__file__).parent}", file=sys.stderr)
        print(json.dumps(run(a.mixes, a.seed)))
        return
    rows = {"after (working tree)": run(a.mixes, a.seed)}
    if a.before_rev:
        with tempfile.TemporaryDirectory() as tmp:
            wt = Path(tmp) / "before"
            subprocess.run(["git", "worktree", "add", "--detach", str(wt), a.before_rev],
                           cwd=ROOT, check=True, capture_output=True)  # fmt: skip
            try:
                for f in ("tests/seam.py", "bench/seam.py"):
                    (wt / f).write_text((ROOT / f).read_text())
                out = subprocess.run([sys.executable, "bench/seam.py", "--json", "--mixes",
                                      str(a.mixes), "--seed", str(a.seed)], cwd=wt, check=True,
                                     capture_output=True, text=True)  # fmt: skip
                print(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "",
                      file=sys.stderr)
                rows = {f"before ({a.before_rev})": json.loads(out.stdout.splitlines()[-1]), **rows}
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(wt)], cwd=ROOT,
                               check=False, capture_output=True)  # fmt: skip
    print(f"{a.mixes} mixes (seed {a.seed}), one node of the 8-GPU trace, GPUs 0-3 shared")
    print(f"{'tree':<28} {'pods':>6} {'admitted':>9} {'pending':>8} {'refused at the seam':>20}")
    for name, c in rows.items():
        total = sum(c.values())
        print(f"{name:<28} {total:>6} {c.get('admitted', 0):>9} {c.get('pending', 0):>8} "
              f"{c.get('refused', 0):>20}")


if __name__ == "__main__":
    main()

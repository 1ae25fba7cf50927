"""A soak of the installed product: whole-GPU and slice pods arriving and leaving on the real
kubelet, through the chart's scheduler (kube-scheduler + the extender) and through the stock
kube-scheduler, with the same device plugin.

The cluster is ``scripts/dev-cluster up --full`` (the dev cluster's release, v1.37.2 by default; one kubelet); the chart is installed
once with ``examples/install/whole-stack.yaml`` replaying ``multi-gpu-trace.json`` (8 H100s;
GPUs 0-3 shared in 1 GiB units, 4-7 whole; free MiB 81,079 / 50,359 / 70,839 / 9,399 |
81,079 / 34,999 / 75,959 / 3,255). Each variant then runs ``--duration-s``: a pod is created
every ``--every-s`` (seeded: the same pods for both variants), 40 % whole (``nvidia.com/gpu: 1``
and ``omaticaya.io/gpu-memory-mib`` 20-70 GiB) and 60 % slices (1-2 containers of 10-50 units);
each pod is deleted ``--lifetime-s`` after it runs. Pods are busybox: they use no GPU memory, so
only the kubelet's books show them.

Figures per variant (polled every second from the API and the agent's telemetry):

- ``placed``: pods bound to the node; ``admitted``: pods that ran; ``failed at admission``: pods
  the kubelet failed (``UnexpectedAdmissionError``: the device plugin refused what the scheduler
  promised);
- ``pending with room``: pods Pending at the end of the variant whose need fits now by the
  device plugin's rules (``core.model.sharing``) on the kubelet's books (the telemetry's holders) and
  the live reading less the slices of running pods younger than ``settleS`` (which the plugin
  counts until the reading shows them), i.e. pods a scheduler left waiting needlessly;
- ``promised above live, MiB``: the most, over the polls, of the GPU memory promised to running
  pods (whole pods: their annotation; slices: their units) above each GPU's live free memory,
  summed over GPUs: memory a pod was told it has and does not.

    .venv/bin/python bench/product.py --duration-s 120
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import emit, header, table  # noqa: E402

U = 1024
NS = "soak"
RELEASE = "omaticaya"
TRACE_FREE = {0: 81079, 1: 50359, 2: 70839, 3: 9399, 4: 81079, 5: 34999, 6: 75959, 7: 3255}
SHARED = (0, 1, 2, 3)
DEV_TAINT = {"key": "omaticaya.io/dev-kubelet", "operator": "Exists", "effect": "NoSchedule"}


class Kube:
    """helm and kubectl on the dev cluster."""

    def __init__(self, env: dict[str, str], helm: Path, kubectl: Path) -> None:
        self.env, self.helm_bin, self.kubectl_bin = env, helm, kubectl

    def run(self, *args: Any, check: bool = True) -> str:
        p = subprocess.run([str(a) for a in args], env=self.env, capture_output=True, text=True,
                           check=False, timeout=600)  # fmt: skip
        if check and p.returncode:
            raise RuntimeError(f"{' '.join(map(str, args))}: {p.stderr.strip()[-2000:]}")
        return p.stdout

    def kubectl(self, *args: Any, check: bool = True) -> str:
        return self.run(self.kubectl_bin, *args, check=check)

    def json(self, *args: Any) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))


def pods_for(seed: int, count: int) -> list[tuple[Any, ...]]:
    """``("whole", GiB)`` or ``("slice", units...)``, seeded."""
    rng = random.Random(seed)
    return [("whole", rng.choice((20, 40, 60, 70))) if rng.random() < 0.4
            else ("slice", *(rng.choice((10, 20, 30, 40, 50)) for _ in range(rng.randint(1, 2))))
            for _ in range(count)]  # fmt: skip


def pod_doc(name: str, kind: tuple[Any, ...], scheduler: str, image: str) -> dict[str, Any]:
    if kind[0] == "whole":
        containers = [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        annotations = {"omaticaya.io/gpu-memory-mib": f"{kind[1]}Gi"}
    else:
        containers = [{"name": f"c{k}", "resources": {"limits": {"omaticaya.io/gpu-memory": str(n)}}}
                      for k, n in enumerate(kind[1:])]  # fmt: skip
        annotations = {}
    for c in containers:
        c.update(image=image, imagePullPolicy="Never", command=["sleep", "3600"])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations},
            "spec": {"schedulerName": scheduler, "tolerations": [DEV_TAINT],
                     "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False,
                     "containers": containers}}  # fmt: skip


def promised_mib(doc: dict[str, Any]) -> int:
    ann = doc["metadata"].get("annotations") or {}
    if "omaticaya.io/gpu-memory-mib" in ann:
        return int(ann["omaticaya.io/gpu-memory-mib"].removesuffix("Gi")) * U
    return 0


def fits_now(kind: tuple[Any, ...], telemetry: dict[str, Any], young: dict[int, int]) -> bool:
    """The pod's need by the device plugin's rules: the kubelet's books (the telemetry's
    holders) and the live reading less the slices handed out in the last ``settleS`` that the
    reading does not show (``young``: GPU index -> MiB; the pods use no memory)."""
    from omaticaya_py.core.model.sharing import gpu_room_mib

    gpus = {g["index"]: g for g in telemetry["gpus"]}
    if kind[0] == "whole":
        return any(not g.get("pods") and (g.get("memory_free_mib") or 0) >= kind[1] * U
                   for i, g in gpus.items() if i not in SHARED)  # fmt: skip
    rooms = {}
    for i in SHARED:
        g = gpus[i]
        held = sum((p.get("limit_mib") or 0) for p in g.get("pods") or []) // U
        rooms[i] = [(g.get("memory_free_mib") or 0) - young.get(i, 0),
                    (g.get("share_units") or 0) - held]
    for n in kind[1:]:
        fit = [i for i, (f, left) in rooms.items() if gpu_room_mib(f, left, U) >= n * U]
        if not fit:
            return False
        i = min(fit, key=lambda i: gpu_room_mib(*rooms[i], U))
        rooms[i][0] -= n * U
        rooms[i][1] -= n
    return True


def soak(kube: Kube, node: str, scheduler: str, kinds: list[tuple[Any, ...]], image: str,
         args: argparse.Namespace, tmp: Path) -> dict[str, Any]:  # fmt: skip
    kube.kubectl("create", "namespace", NS)
    docs: dict[str, dict[str, Any]] = {}
    kind_of: dict[str, tuple[Any, ...]] = {}
    placed: set[str] = set()
    ran_at: dict[str, float] = {}
    failed: set[str] = set()
    why: dict[str, str] = {}
    deleted: set[str] = set()
    over_max = 0
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < args.duration_s:
        now = time.monotonic()
        if i < len(kinds) and now - t0 >= i * args.every_s:
            name = f"p{i}"
            docs[name] = pod_doc(name, kinds[i], scheduler, image)
            kind_of[name] = kinds[i]
            path = tmp / f"{name}.json"
            path.write_text(json.dumps(docs[name]))
            kube.kubectl("create", "-f", path)
            i += 1
        pods = {p["metadata"]["name"]: p for p in kube.json("-n", NS, "get", "pods")["items"]}
        for name, p in pods.items():
            if p["spec"].get("nodeName"):
                placed.add(name)
            if p["status"].get("phase") == "Failed":
                if name not in failed:
                    why[name] = f"{kind_of[name]}: {p['status'].get('message', '')[:300]}"
                failed.add(name)
            if any(c.get("state", {}).get("running") for c in p["status"].get("containerStatuses") or []):
                ran_at.setdefault(name, now)
        gone = [n for n, at in ran_at.items() if n not in deleted and now - at >= args.lifetime_s]
        gone += [n for n in failed if n not in deleted]
        if gone:
            kube.kubectl("-n", NS, "delete", "pod", *gone, "--wait=false", check=False)
            deleted.update(gone)
        telemetry = json.loads(kube.json("get", "node", node)["metadata"]["annotations"]
                               ["omaticaya.io/telemetry"])  # fmt: skip
        promised: dict[int, int] = {}
        for g in telemetry["gpus"]:
            for h in g.get("pods") or []:
                name = h.get("pod")
                if h.get("namespace") != NS or name not in docs or name in deleted:
                    continue
                mib = h.get("limit_mib") or promised_mib(docs[name])
                promised[g["index"]] = promised.get(g["index"], 0) + mib
        over = sum(max(0, mib - TRACE_FREE[i]) for i, mib in promised.items())
        if over > over_max:
            on = {g["index"]: [(h.get("pod"), h.get("limit_mib")) for h in g.get("pods") or []
                               if h.get("pod") in docs and h.get("pod") not in deleted]
                  for g in telemetry["gpus"]}  # fmt: skip
            why["over"] = (f"{over} MiB at {now - t0:.0f} s: "
                           + "; ".join(f"GPU {i}: {on[i]}" for i, mib in promised.items()
                                       if mib > TRACE_FREE[i]))  # fmt: skip
        over_max = max(over_max, over)
        time.sleep(1.0)
    time.sleep(args.quiet_s)  # no arrival, no departure: the scheduler retries what waits
    pods = {p["metadata"]["name"]: p for p in kube.json("-n", NS, "get", "pods")["items"]}
    telemetry = json.loads(kube.json("get", "node", node)["metadata"]["annotations"]
                           ["omaticaya.io/telemetry"])  # fmt: skip
    young: dict[int, int] = {}
    end = time.monotonic()
    for g in telemetry["gpus"]:
        for h in g.get("pods") or []:
            name = h.get("pod")
            if h.get("limit_mib") and name in ran_at and end - ran_at[name] < args.settle_s:
                young[g["index"]] = young.get(g["index"], 0) + h["limit_mib"]
    roomy = [n for n, p in pods.items()
             if not p["spec"].get("nodeName") and fits_now(kind_of[n], telemetry, young)]  # fmt: skip
    for n in roomy[:5]:
        cond = [c for c in pods[n]["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
        why[f"pending {n}"] = f"{kind_of[n]}: {(cond[0].get('message') if cond else '')[:300]}"
    pending_room = len(roomy)
    kube.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=180s", check=False)
    return {"pods": i, "placed": len(placed), "admitted": len(ran_at), "failed": len(failed),
            "pending_room": pending_room, "over_mib": over_max, "why": why}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=120)
    ap.add_argument("--every-s", type=float, default=1.5)
    ap.add_argument("--lifetime-s", type=float, default=20)
    ap.add_argument("--seed", type=int, default=30)
    ap.add_argument("--settle-s", type=float, default=60, help="the chart's placement.settleS")
    ap.add_argument("--quiet-s", type=float, default=90,
                    help="after the soak, no arrival or departure this long before the count "
                    "(kube-scheduler 1.20 retries a pod it found no room for on a cluster event, "
                    "or after 60 s; a slice's memory that stops counting by age is no event)")
    ap.add_argument("--only", default="", help="run the variant whose schedulerName has this")
    a = ap.parse_args()
    from tests.devcluster import start_dev_cluster
    from tests.kubelet import IMAGE
    from tests.tools import helm_path, kubectl_path

    state = Path(tempfile.mkdtemp(prefix="omaticaya-soak-"))
    dev = start_dev_cluster(state, full=True)
    try:
        node = dev.start_full()
        env = dict(dev.env(), HELM_CACHE_HOME=str(state / "h"), HELM_CONFIG_HOME=str(state / "h"),
                   HELM_DATA_HOME=str(state / "h"))  # fmt: skip
        kube = Kube(env, helm_path(), kubectl_path())
        repo, tag = dev.agent_image.rsplit(":", 1)
        socket = state / "kubelet" / "root" / "pod-resources" / "kubelet.sock"
        values = {
            "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
            "trace": "multi-gpu-trace.json", "schedule": "@every 2s",
            "nodeSelector": {"nvidia.com/gpu.present": None, "kubernetes.io/hostname": node},
            "tolerations": [DEV_TAINT], "podResourcesSocket": str(socket),
            "scheduler": {"enabled": True, "tolerations": [DEV_TAINT]},
        }  # fmt: skip
        (state / "dev.yaml").write_text(json.dumps(values))
        kube.run(kube.helm_bin, "install", RELEASE, ROOT / "charts" / "omaticaya", "-n", "omaticaya",
                 "--create-namespace", "-f", ROOT / "examples" / "install" / "whole-stack.yaml",
                 "-f", state / "dev.yaml", "--wait", "--timeout", "300s")  # fmt: skip
        kinds = pods_for(a.seed, int(a.duration_s / a.every_s) + 1)
        rows = []
        variants = (("stock kube-scheduler", "default-scheduler"),
                    ("omaticaya (extender)", "omaticaya-scheduler"))
        whys = []
        for label, scheduler in variants:
            if a.only and a.only not in scheduler:
                continue
            r = soak(kube, node, scheduler, kinds, IMAGE, a, state)
            whys += [f"{label}: {n}: {w}" for n, w in sorted(r["why"].items())][:10]
            rows.append([label, r["pods"], r["placed"], r["admitted"], r["failed"],
                         r["pending_room"], r["over_mib"]])  # fmt: skip
        emit(header("bench/product.py: the installed product under arrivals and departures"),
             table(["scheduler", "pods", "placed", "admitted", "failed at admission",
                    "pending with room", "promised above live, MiB"], rows),
             "failed at admission, and pending with room (the first of each variant):\n"
             + "\n".join(whys))  # fmt: skip
    finally:
        dev.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

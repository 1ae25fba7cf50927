"""Kubernetes releases side by side (issue 37 item 5): the design's API server figures
re-measured on each release the dev cluster builds from Go modules, in one run.

The machine is shared and noisy, so the releases alternate round by round (round 1 in the
order of ``--releases``, round 2 reversed, ...: a drift of the machine's load falls on every
release alike), and each figure is printed as min / median / max over the rounds with the
ratio of its median to the first release's.

Per round and release, from a fresh state dir (``OMATICAYA_DEV_DIR``, a new temporary dir;
``OMATICAYA_KUBERNETES_VERSION=<release>``):

- ``up``: wall time of ``scripts/dev-cluster up`` (the supervisor's start, certificates,
  etcd, kube-apiserver, until its /readyz answers ``ok``): what a test session pays;
- ``apiserver spawn -> /readyz``: from kube-apiserver's start (its start time in
  ``/proc/<pid>/stat``, 10 ms ticks, recorded in ``state.json``) to the first ``ok`` of this
  script's own /readyz poll (every 20 ms over one keep-alive TLS connection, admin
  certificate): finer than the supervisor's ``apiserver ready ... after N s`` (whole seconds,
  its poll every 100 ms; shown per round as ``sup. s``);
- ``up start -> etcd spawn``: the supervisor's start, the build check, the certificates
  (``openssl``, four RSA keys: their generation time varies, whatever the release) and the
  supervisor's ``etcd --help`` (its flag probe);
- ``etcd spawn -> apiserver spawn``: etcd's start up to its /health (the supervisor polls it
  every 100 ms: +-0.1 s);
- ``patch``: on that running cluster, the agent's own client (``omaticaya_py.kube.NodeClient``,
  ``patch_node``: a JSON merge patch, as the agent sends it) on one Node made to look like an
  agent's 8-GPU H100 Node (the labels and the telemetry annotation ``core.publish.render`` gives for the
  recorded trace, set once untimed); each timed patch changes one label
  (``gpu-0.memory.free-mib``) and the telemetry annotation (~4 KB), so every one is a real
  write; ``--patches`` of them after 10 warm-up patches and a 2 s settle; median and p95 ms of
  the round. The dev cluster's audit log is on (Metadata level, blocking mode), as in every
  other bench;
- ``down``: wall time of ``scripts/dev-cluster down``.

Each release's binary is read once before the first round (so that neither starts from a cold
page cache). ``bench/extender.py`` is not run per release: it runs the extender in its own
process on LIST bodies it encodes itself (no API server, no kubeconfig flag), so the release
does not enter its figures.

    .venv/bin/python bench/kube_versions.py          # v1.37.2 vs v1.31.0, 3 rounds, 200 patches
    .venv/bin/python bench/kube_versions.py --rounds 5 --patches 500
    .venv/bin/python bench/kube_versions.py --quick  # 1 round, 20 patches (~20 s)
"""

from __future__ import annotations

import argparse
import gc
import http.client
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    CLK_TCK,
    ROOT,
    FakeClock,
    admin_api,
    bench_settings,
    create_nodes,
    emit,
    header,
    load_raw,
    median,
    pct,
    replicate,
    table,
    write_trace,
)

SCRIPT = ROOT / "scripts" / "dev-cluster"
DEFAULT_RELEASES = "v1.37.2,v1.31.0"
NODE = "bench-kube-versions"
WARMUP_PATCHES = 10
SETTLE_S = 2.0
READYZ_POLL_S = 0.02
UP_TIMEOUT_S = 600.0

#: (key, unit, what) of each figure, in the order of the table
FIGURES = [
    ("up", "s", "scripts/dev-cluster up, fresh state dir"),
    ("prep", "s", "up start -> etcd spawn"),
    ("ready", "s", "apiserver spawn -> /readyz"),
    ("etcd", "s", "etcd spawn -> apiserver spawn"),
    ("down", "s", "scripts/dev-cluster down"),
    ("patch_p50", "ms", "Node merge patch, median"),
    ("patch_p95", "ms", "Node merge patch, p95"),
]


def release_name(value: str) -> str:
    v = value.strip()
    return v if v.startswith("v") else f"v{v}"


def bin_dir(release: str) -> Path:
    from devtools.devcluster.cluster import cache_dir

    return cache_dir() / f"k8s-{release}" / "bin"


def boot_s() -> float:
    """Seconds since boot, the clock of ``/proc/<pid>/stat``'s start time."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def version_line(release: str) -> str:
    """``v1.37.2: kube-apiserver Kubernetes v1.37.2, etcd 3.7.0`` from the binaries."""
    d = bin_dir(release)
    out = []
    for name, arg in (("kube-apiserver", "--version"), ("etcd", "--version")):
        try:
            res = subprocess.run([str(d / name), arg], capture_output=True, text=True, timeout=30,
                                 check=False)  # fmt: skip
            first = (res.stdout or res.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            first = "?"
        out.append(f"{name} {first.removeprefix('etcd Version: ')}")
    return f"{release}: " + ", ".join(out) + f" ({d})"


def warm_page_cache(release: str) -> None:
    """Read the release's binary once (``kube-apiserver`` and ``etcd`` are links to it)."""
    for name in ("kube-apiserver", "etcd"):
        with open((bin_dir(release) / name).resolve(), "rb") as f:
            while f.read(1 << 20):
                pass


# -- the dev cluster ---------------------------------------------------------------------------


def dev_cluster(state_dir: Path, release: str, *args: str) -> tuple[float, str]:
    """Run ``scripts/dev-cluster <args>`` for ``release`` in ``state_dir``; (wall s, stderr).
    Raises ``RuntimeError`` with its output when it fails."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    env.update(OMATICAYA_DEV_DIR=str(state_dir), OMATICAYA_KUBERNETES_VERSION=release)
    t0 = time.perf_counter()
    res = subprocess.run([str(SCRIPT), *args], env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=UP_TIMEOUT_S,
                         check=False)  # fmt: skip
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(
            f"scripts/dev-cluster {' '.join(args)} ({release}, {state_dir}) exited "
            f"{res.returncode}\n{res.stdout}\n" + "\n".join(res.stderr.splitlines()[-40:])
        )
    return took, res.stderr


class ReadyzWatch(threading.Thread):
    """Waits for ``state.json`` to name the API server, then GETs its /readyz every
    ``READYZ_POLL_S`` over one keep-alive connection (a new one after any failure);
    ``ready_boot_s``: when it first answered ``ok`` (seconds since boot)."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(daemon=True, name="readyz-watch")
        self.state_dir = state_dir
        self.ready_boot_s: float | None = None
        self.done = threading.Event()

    def _port(self) -> int | None:
        from devtools.devcluster import DevClusterError, load_state

        while not self.done.is_set():
            try:
                st = load_state(self.state_dir)
            except (DevClusterError, OSError):
                st = None
            if st is not None and "apiserver" in st.procs:
                return st.ports.apiserver
            time.sleep(READYZ_POLL_S)
        return None

    def run(self) -> None:
        port = self._port()
        if port is None:
            return
        pki = self.state_dir / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        conn: http.client.HTTPSConnection | None = None
        while not self.done.is_set():
            try:
                if conn is None:
                    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=2)
                conn.request("GET", "/readyz", headers={"User-Agent": "omaticaya-bench"})
                resp = conn.getresponse()
                body = resp.read()
                if resp.status == 200 and body.strip() == b"ok":
                    self.ready_boot_s = boot_s()
                    break
            except (OSError, http.client.HTTPException):
                if conn is not None:
                    conn.close()
                conn = None
            time.sleep(READYZ_POLL_S)
        if conn is not None:
            conn.close()


# -- the Node merge patch ----------------------------------------------------------------------


@dataclass
class Payloads:
    """The agent's first patch of an 8-GPU H100 Node (all labels and the telemetry
    annotation), and ``n`` patches that each change one label and the annotation."""

    first: dict[str, Any]
    patches: list[dict[str, Any]] = field(default_factory=list)


def payloads(n: int) -> Payloads:
    from omaticaya_py.core.publish.render import render
    from omaticaya_py.core.rules.health import assess
    from omaticaya_py.sources.replay import TraceReader

    settings = bench_settings(node_name=NODE)
    path = write_trace(replicate(load_raw(), 8), "kube-versions-8gpu")
    snap = TraceReader(path, window_s=10.0, clock=FakeClock()).read()
    desired = render(snap, assess(snap), settings)
    first = {"metadata": {"labels": dict(desired.labels),
                          "annotations": dict(desired.annotations)}}  # fmt: skip
    label = f"{settings.prefix}/gpu-0.memory.free-mib"
    ann = f"{settings.prefix}/telemetry"
    telemetry = desired.annotations[ann]
    m = re.search(r'"memory_free_mib":(\d+)', telemetry)
    if m is None or label not in desired.labels:
        raise RuntimeError(f"unexpected render: no {label} or memory_free_mib in the telemetry")
    base = int(m.group(1))
    out = Payloads(first)
    for i in range(n + WARMUP_PATCHES):
        v = base - 1 - i % 1000  # each patch differs from the one before: a real write
        out.patches.append({"metadata": {
            "labels": {label: str(v)},
            "annotations": {ann: telemetry.replace(m.group(0), f'"memory_free_mib":{v}', 1)},
        }})  # fmt: skip
    return out


def patch_round_trips(kubeconfig: str, load: Payloads) -> tuple[list[float], dict[str, int]]:
    """ms per ``NodeClient.patch_node`` of the timed patches, and the requests by status."""
    from omaticaya_py.kube import NodeClient

    api = admin_api(kubeconfig)
    create_nodes(api, [NODE], "kube-versions")
    client = NodeClient(NODE, kubeconfig=kubeconfig)
    try:
        client.patch_node(load.first)
        time.sleep(SETTLE_S)
        for p in load.patches[:WARMUP_PATCHES]:
            client.patch_node(p)
        gc.collect()
        ms = []
        for p in load.patches[WARMUP_PATCHES:]:
            t0 = time.perf_counter()
            client.patch_node(p)
            ms.append((time.perf_counter() - t0) * 1000)
        statuses: dict[str, int] = {}
        for (verb, status), count in client.requests.items():
            if verb == "patch":
                statuses[str(status)] = statuses.get(str(status), 0) + count
        return ms, statuses
    finally:
        client.close()
        api.api_client.close()


# -- one round of one release ------------------------------------------------------------------


def measure(release: str, load: Payloads, keep: bool) -> dict[str, Any]:
    from devtools.devcluster import load_state

    state_dir = Path(tempfile.mkdtemp(prefix=f"omaticaya-kv-{release}-"))
    watch = ReadyzWatch(state_dir)
    watch.start()
    row: dict[str, Any] = {"release": release}
    ok = False
    try:
        try:
            up_boot = boot_s()
            row["up"], err = dev_cluster(state_dir, release, "up")
            watch.join(2)  # ready: its next poll says so, unless it saw it first (the usual)
        finally:
            watch.done.set()
            watch.join(5)
        st = load_state(state_dir)
        assert st is not None
        api_start = st.procs["apiserver"].start_ticks / CLK_TCK
        row["ready"] = (watch.ready_boot_s - api_start if watch.ready_boot_s is not None
                        else float("nan"))  # fmt: skip
        etcd_start = st.procs["etcd"].start_ticks / CLK_TCK
        row["prep"], row["etcd"] = etcd_start - up_boot, api_start - etcd_start
        m = re.search(r"apiserver ready on \S+ after (\d+) s", err)
        row["sup"] = int(m.group(1)) if m else "?"
        ms, statuses = patch_round_trips(str(state_dir / "kubeconfig"), load)
        row["patch_p50"], row["patch_p95"] = median(ms), pct(ms, 95)
        row["patch_n"], row["statuses"] = len(ms), statuses
        ok = True
    finally:
        try:
            row["down"], _ = dev_cluster(state_dir, release, "down")
        except Exception:
            row["down"] = float("nan")
            ok = False
            raise
        finally:
            if ok and not keep:
                shutil.rmtree(state_dir, ignore_errors=True)
            else:
                print(f"(state dir kept: {state_dir})", file=sys.stderr, flush=True)
    return row


def summary(rows: list[dict[str, Any]], releases: list[str]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for key, unit, what in FIGURES:
        base = median([r[key] for r in rows if r["release"] == releases[0]])
        for rel in releases:
            vals = [r[key] for r in rows if r["release"] == rel]
            mid = median(vals)
            ratio = f"x{mid / base:.2f}" if base == base and base else "n/a"
            out.append([f"{what} ({unit})", rel, len(vals), min(vals), mid, max(vals), ratio])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", default=DEFAULT_RELEASES,
                    help="comma-separated, the first is the reference "
                    f"(default {DEFAULT_RELEASES})")  # fmt: skip
    ap.add_argument("--rounds", type=int, help="rounds, each release once per round (default 3)")
    ap.add_argument("--patches", type=int, help="timed Node merge patches per round (default 200)")
    ap.add_argument("--keep", action="store_true", help="keep the state dirs (default: removed)")
    ap.add_argument("--quick", action="store_true", help="1 round, 20 patches")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    n_patches = args.patches or (20 if args.quick else 200)
    if rounds < 1 or n_patches < 1:
        ap.error("--rounds and --patches: 1 or more")
    releases = [release_name(r) for r in args.releases.split(",") if r.strip()]
    if not releases or len(set(releases)) != len(releases):
        ap.error("--releases: one or more distinct releases")
    missing = [r for r in releases if not os.access(bin_dir(r) / "kube-apiserver", os.X_OK)]
    if missing:
        for r in missing:
            print(f"{r} not built ({bin_dir(r)}): run 'scripts/dev-cluster build "
                  f"--kubernetes-version {r}' first (not timed here)", file=sys.stderr)  # fmt: skip
        return 2
    for r in releases:
        warm_page_cache(r)
    load = payloads(n_patches)
    rows: list[dict[str, Any]] = []
    for i in range(rounds):
        order = releases if i % 2 == 0 else releases[::-1]
        for rel in order:
            print(f"(round {i + 1}/{rounds}: {rel} ...)", file=sys.stderr, flush=True)
            row = measure(rel, load, args.keep)
            row["round"] = i + 1
            rows.append(row)
    per_round = [
        [r["round"], r["release"], r["up"], r["prep"], r["etcd"], r["ready"], r["sup"], r["down"],
         r["patch_n"], r["patch_p50"], r["patch_p95"],
         " ".join(f"{k}:{v}" for k, v in sorted(r["statuses"].items()))]
        for r in rows
    ]  # fmt: skip
    emit(
        header("Kubernetes releases side by side: dev cluster start and Node merge patch "
               "(issue 37 item 5)"),  # fmt: skip
        "\n".join(["releases:", *(f"  {version_line(r)}" for r in releases)]),
        f"{rounds} round(s), each release once per round, the order reversed every other "
        f"round; {n_patches} timed patches per round (after {WARMUP_PATCHES} warm-up); "
        f"ratio: median / median of {releases[0]}",
        table(["figure", "release", "rounds", "min", "median", "max", "ratio"],
              summary(rows, releases)),  # fmt: skip
        table(["round", "release", "up s", "certs s", "etcd s", "spawn->readyz s", "sup. s",
               "down s", "patches", "patch p50 ms", "p95 ms", "PATCH statuses (all)"],
              per_round),  # fmt: skip
        "\n".join([
            "certs s: up start -> etcd spawn (certificates, the supervisor's etcd --help);",
            "etcd s: etcd spawn -> apiserver spawn (etcd /health, polled every 100 ms);",
            "sup. s: the supervisor's own 'apiserver ready ... after N s' (whole seconds);",
            f"PATCH statuses: every patch of the round (1 set-up + {WARMUP_PATCHES} warm-up "
            "+ timed).",
            "extender at 5,000 Nodes: skipped: bench/extender.py runs the extender in its own",
            "process on LIST bodies it encodes itself (no API server, no kubeconfig flag), so",
            "the Kubernetes release does not enter its figures.",
        ]),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""DRA at fleet scale (issue 51, items 1 and 4): the stock kube-scheduler of the dev cluster's
release with the agent's live ResourceSlices on N Nodes of 8 GPUs, against static slices.

The cluster: the dev cluster's etcd and kube-apiserver (``scripts/dev-cluster up``, or the one
``$KUBECONFIG`` names) and a kube-scheduler of its release started here (its cached binary,
profile ``dra-scale-<pid>``, leader election off, ``clientConnection`` QPS and burst 5,000 as
upstream's scheduler_perf runs it, not the default 50/100). No kubelet and no
kube-controller-manager: the bench makes the Nodes (Ready, schedulable: the status a kubelet
would post) and their ResourceSlices, and one ResourceClaim per pod, referenced by name (as
scheduler_perf's DRA cases do without the claim controller: nothing turns templates into claims
here). Between kinds the bench does what the claim controller would: pods and claims deleted,
the claims' finalizers cleared.

Slices are written by the agent's own ``ResourceSliceWriter`` through ``ResourceSliceClient``
(server-side apply) from the recorded traces, each Node on its own looping clock started at a
random point (phases shifted per Node). The fleet mix (``--mix``, default 85/10/5): steady nodes
replay ``tests/data/multi-gpu-trace.json`` (8 GPUs, a steady mixed load: 0 writes an hour, docs
section 19), busy and failing nodes the H100 recording (``h100-trace.json``) replicated to 8
GPUs, written at 1 and 180 writes per node-hour (the section's measured rates; ``--churn 10``:
ten times that). Churn: each busy or failing Node's writes come as a Poisson process at its rate;
at each, its trace clock moves on (2.5 s steps) until the writer (budget off: the rate is the
schedule's) sends an apply. Static: the same writer and the slice without ``freeMemoryMiB``,
written once, no churn.

Pods, three kinds (``--pods`` each, from an empty cluster), one whole GPU each:

- ``plain``: a request of the chart's DeviceClass ``gpu.omaticaya.io`` (rendered by helm from
  charts/omaticaya when helm is there, else the same selector written here);
- ``cel``: the class and a CEL selector, live ``freeMemoryMiB >= 20480``; static, the same bound
  on the device's ``memory`` capacity (static slices have no live attribute);
- ``first``: a prioritized list (``firstAvailable``) of three subrequests, live the ranges
  ``freeMemoryMiB`` [20, 40), [40, 60), >= 60 GiB (tightest first, docs/dra.md's binpack
  shape); static, ``memory`` capacity >= 60, 40, 20 GiB (the first fits every GPU).

``--control`` adds the live slices at the highest churn factor with the static claims: what the
live slices and their churn cost the scheduler apart from the live claims' selectivity.

Each kind: the claims and pods are created with a scheduling gate (not timed), then the gates
are removed as fast as 16 threads can; a pod watch records each pod's binding. Printed per
kind: pods/s to bound (pods over the span from the first gate removed to the last binding),
p50/p99 from its gate removed to bound (the pods were created before: "create-to-bound" of a
pod the scheduler sees at once), the API server's writes/s (``apiserver_request_total``, verbs
POST, PUT, PATCH, APPLY, DELETE, over that span; the ResourceSlice share apart), kube-scheduler's
CPU (cores: /proc/<pid>/stat over the span) and RSS (VmRSS, MiB), and this process' CPU (the
load generator shares the machine's cores with all of it). Ratios (live/static) first.

    flock /tmp/omaticaya-cluster.lock .venv/bin/python bench/dra_scale.py   # N = 50 100 500
    .venv/bin/python bench/dra_scale.py --nodes 100 --pods 300 --churn 1 10
    .venv/bin/python bench/dra_scale.py --nodes 1000 --pods 500 --control
    .venv/bin/python bench/dra_scale.py --quick     # N = 10, 20 pods a kind (CI smoke)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import heapq
import json
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    H100_TRACE,
    ROOT,
    FakeClock,
    bench_settings,
    cluster,
    emit,
    header,
    load_raw,
    median,
    pct,
    proc_cpu_s,
    proc_rss_mib,
    replicate,
    table,
    write_trace,
)

DRIVER = "gpu.omaticaya.io"
ATTR = f'device.attributes["{DRIVER}"]'
CAPACITY = f'device.capacity["{DRIVER}"].memory'
MULTI_GPU_TRACE = ROOT / "tests" / "data" / "multi-gpu-trace.json"
GPUS_PER_NODE = 8
#: writes per node-hour of each class (docs/benchmarks.md section 19, default settings)
RATES_PER_H = {"steady": 0.0, "busy": 1.0, "failing": 180.0}
KINDS = ("plain", "cel", "first")
GATE = "bench.omaticaya.io/hold"
#: the bench's namespace, its own per run (no namespace controller runs here: a deleted one
#: stays Terminating, so a second run on the same cluster cannot reuse it)
NS = f"dra-scale-{os.getpid()}"
#: the write verbs of ``apiserver_request_total``
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
#: the chart's selector of whole unshared GPUs (charts/omaticaya/templates/deviceclasses.yaml),
#: used when helm is not there to render it
CLASS_FALLBACK = (
    f'device.driver == "{DRIVER}" && {ATTR}.type == "gpu" && !{ATTR}.shared'
)  # fmt: skip


# -- claims --------------------------------------------------------------------------------------


def gib_range(low_gib: int, high_gib: int | None, live: bool) -> str:
    """A CEL selector on free memory (live: ``freeMemoryMiB``) or the ``memory`` capacity
    (static) from ``low_gib`` (inclusive) to ``high_gib`` (exclusive; None: no bound)."""
    if live:
        expr = f"{ATTR}.freeMemoryMiB >= {low_gib * 1024}"
        return expr + (f" && {ATTR}.freeMemoryMiB < {high_gib * 1024}" if high_gib else "")
    expr = f'{CAPACITY}.compareTo(quantity("{low_gib}Gi")) >= 0'
    return expr + (f' && {CAPACITY}.compareTo(quantity("{high_gib}Gi")) < 0' if high_gib else "")


def claim_spec(kind: str, live: bool) -> dict[str, Any]:
    """The ResourceClaim ``spec`` of a pod of ``kind`` (``KINDS``), live or static slices."""
    request: dict[str, Any]
    if kind == "plain":
        request = {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": 1}}
    elif kind == "cel":
        request = {"name": "gpu", "exactly": {
            "deviceClassName": DRIVER, "count": 1,
            "selectors": [{"cel": {"expression": gib_range(20, None, live)}}],
        }}  # fmt: skip
    elif kind == "first":
        ranges = [(20, 40), (40, 60), (60, None)] if live else [(60, None), (40, None), (20, None)]
        request = {"name": "gpu", "firstAvailable": [
            {"name": f"r{i}", "deviceClassName": DRIVER, "count": 1,
             "selectors": [{"cel": {"expression": gib_range(lo, hi, live)}}]}
            for i, (lo, hi) in enumerate(ranges)
        ]}  # fmt: skip
    else:
        raise ValueError(kind)
    return {"devices": {"requests": [request]}}


def pod_body(name: str, claim: str, scheduler: str, run: str) -> dict[str, Any]:
    """A gated pod (``GATE``) of ``scheduler`` asking the ResourceClaim ``claim``."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"run": run}},
        "spec": {
            "schedulerName": scheduler,
            "schedulingGates": [{"name": GATE}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }  # fmt: skip


def device_class(kubeconfig_free_env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """The chart's DeviceClass ``gpu.omaticaya.io`` and where it came from: rendered by helm
    (``tests.tools.helm_path``) from charts/omaticaya with ``dra.enabled``; the same selector
    written here (``CLASS_FALLBACK``) when helm is not there."""
    import yaml

    try:
        from tests.tools import helm_path

        helm = str(helm_path())
        home = Path(tempfile.mkdtemp(prefix="dra-scale-helm-"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HELM_", "KUBECONFIG"))}
        env.update(HELM_CACHE_HOME=str(home / "c"), HELM_CONFIG_HOME=str(home / "g"),
                   HELM_DATA_HOME=str(home / "d"), KUBECONFIG=str(home / "none"))  # fmt: skip
        out = subprocess.run(
            [helm, "template", "x", str(ROOT / "charts" / "omaticaya"), "--set", "dra.enabled=true",
             "--kube-version", "1.37.2", "--show-only", "templates/deviceclasses.yaml"],
            env=env, capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
        for doc in yaml.safe_load_all(out):
            if doc and doc.get("kind") == "DeviceClass" and doc["metadata"]["name"] == DRIVER:
                doc["metadata"].pop("labels", None)
                return doc, "the chart's, rendered by helm"
    except Exception as exc:  # noqa: BLE001 - any failure: the fallback, said in the output
        print(f"(helm: {exc}; the chart's selector as written here)", file=sys.stderr)
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": CLASS_FALLBACK}}]}}  # fmt: skip
    return body, "the chart's selector, written here (no helm)"


# -- the fleet -----------------------------------------------------------------------------------


@dataclass
class FleetNode:
    """One fake Node: its class, its writer, its trace clock and its slice writes."""

    name: str
    cls: str
    writer: Any
    clock: FakeClock
    reader: Any
    ledger: Any
    policy: Any
    writes: int = 0

    def step(self, live: bool, dt_s: float = 2.5, tries: int = 16) -> bool:
        """Move the trace on (``dt_s`` a step) until the writer sends an apply (at most
        ``tries`` steps); the first call writes the slice. Returns whether one was sent."""
        from omaticaya_py.core.rules.health import assess

        for _ in range(tries):
            snapshot = self.reader.read()
            self.ledger.record(snapshot.xid_events)
            health = assess(snapshot, self.ledger.recent(snapshot.clock_s), self.policy)
            sent = self.writer.write(snapshot, health, None, self.clock.now)
            self.clock.advance(dt_s)
            if sent:
                self.writes += 1
                return True
            if not live:
                return False
        return False


class StaticSlices:
    """A ``ResourceSliceClient`` whose applies carry no ``freeMemoryMiB`` (a static slice)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(body)
        for d in body["spec"]["devices"]:
            d.get("attributes", {}).pop("freeMemoryMiB", None)
        return self.inner.apply(body)

    def get(self) -> dict[str, Any] | None:
        """None: the first write goes out whatever is stored (a live slice of the round before)."""
        return None

    def delete(self) -> bool:
        return self.inner.delete()


def classes(n: int, mix: Sequence[float], rng: random.Random) -> list[str]:
    """``n`` node classes in the proportions ``mix`` (steady, busy, failing), shuffled."""
    total = sum(mix)
    counts = [round(n * m / total) for m in mix]
    counts[0] = n - sum(counts[1:])
    out = [c for c, k in zip(RATES_PER_H, counts, strict=True) for _ in range(k)]
    rng.shuffle(out)
    return out


def build_fleet(session: Any, names: list[str], mix: Sequence[float], live: bool,
                seed: int = 7) -> list[FleetNode]:  # fmt: skip
    """A writer per Node (the agent's ``ResourceSliceWriter`` over a ``ResourceSliceClient``,
    budget off) on its trace: steady nodes the 8-GPU trace, busy and failing ones the H100
    recording as 8 GPUs, each from a random point of its loop."""
    from omaticaya_py.agent.resourceslice_writer import ResourceSliceWriter
    from omaticaya_py.agent.state import SnapshotCache
    from omaticaya_py.core.rules.health import XidLedger, XidPolicy
    from omaticaya_py.kube.resourceslice import ResourceSliceClient
    from omaticaya_py.sources.replay import TraceReader

    h100x8 = write_trace(replicate(load_raw(H100_TRACE), GPUS_PER_NODE), "dra-scale-h100x8")
    rng = random.Random(seed)
    out = []
    for name, cls in zip(names, classes(len(names), mix, rng), strict=True):
        settings = bench_settings(node_name=name, dra=True, min_patch_interval_s=0.0)
        path = MULTI_GPU_TRACE if cls == "steady" else h100x8
        clock = FakeClock(0.0)
        reader = TraceReader(path, window_s=settings.schedule.interval_s, loop=True, clock=clock)
        reader.read()  # starts the trace's clock at 0
        clock.advance(rng.uniform(0, 30.0))  # this node's phase
        client: Any = ResourceSliceClient(session, name)
        if not live:
            client = StaticSlices(client)
        writer = ResourceSliceWriter(settings, client, SnapshotCache(lambda: 0.0))
        policy = XidPolicy(ignore=settings.xid_ignore, all_fatal=settings.xid_all_fatal,
                           quiet_s=settings.xid_quiet_s)  # fmt: skip
        out.append(FleetNode(name, cls, writer, clock, reader, XidLedger(policy), policy))
    return out


class Churn:
    """A thread writing the fleet's slices at their rates (writes per node-hour of the class,
    times ``factor``), each Node's writes a Poisson process; ``stop()`` ends it."""

    def __init__(self, fleet: list[FleetNode], factor: float, seed: int = 11) -> None:
        self.rng = random.Random(seed)
        self.heap: list[tuple[float, int]] = []
        self.rates = [RATES_PER_H[n.cls] * factor / 3600 for n in fleet]
        now = time.perf_counter()
        for i, rate in enumerate(self.rates):
            if rate > 0:
                heapq.heappush(self.heap, (now + self.rng.expovariate(rate), i))
        self.fleet, self.errors, self.lag_s = fleet, 0, 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Churn:
        self.thread.start()
        return self

    def _run(self) -> None:
        while self.heap and not self.done.is_set():
            due, i = self.heap[0]
            wait = due - time.perf_counter()
            if wait > 0:
                self.done.wait(min(wait, 0.05))
                continue
            heapq.heappop(self.heap)
            self.lag_s = max(self.lag_s, -wait)
            try:
                self.fleet[i].step(live=True)
            except Exception:  # noqa: BLE001 - counted, the churn goes on
                self.errors += 1
            heapq.heappush(self.heap, (due + self.rng.expovariate(self.rates[i]), i))

    def stop(self) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join()

    @property
    def expected_per_s(self) -> float:
        return sum(self.rates)


# -- the API server and the scheduler ------------------------------------------------------------


def https(kubeconfig: str) -> tuple[str, ssl.SSLContext]:
    """The API server's URL and a TLS context with the kubeconfig's admin credentials."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
    ctx.load_cert_chain(str(cfg.cert_file), str(cfg.key_file))
    return cfg.host, ctx


_REQUEST = re.compile(r"^apiserver_request_total\{([^}]*)\} (\S+)$")


def write_counts(host: str, ctx: ssl.SSLContext) -> Counter[str]:
    """The API server's write requests so far (``apiserver_request_total`` of its /metrics):
    ``{"all": n, "resourceslices": n, "pods": n, ...}`` (write verbs, by resource)."""
    with urllib.request.urlopen(f"{host}/metrics", context=ctx, timeout=10) as r:
        text = r.read().decode()
    out: Counter[str] = Counter()
    for line in text.splitlines():
        m = _REQUEST.match(line)  # counters are whole numbers
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("verb") in WRITE_VERBS:
            n = int(float(m.group(2)))
            out["all"] += n
            out[labels.get("resource", "?")] += n
    return out


@contextlib.contextmanager
def scheduler(kubeconfig: str, name: str, qps: int, tmp: Path) -> Iterator[subprocess.Popen]:
    """kube-scheduler of the release under test with profile ``name``, leader election off,
    client QPS/burst ``qps``; waits for its start line; stopped on exit."""
    import yaml

    from tests.devcluster import DevCluster, scheduler_binary
    from tests.scheduler.scheduling_cluster_support import SCHEDULER_STARTED

    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig, "qps": qps, "burst": qps},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": name}],
    }  # fmt: skip
    path, log = tmp / f"{name}.yaml", tmp / f"{name}.log"
    path.write_text(yaml.safe_dump(config))
    if not scheduler_binary().exists():
        subprocess.run([str(ROOT / "scripts" / "dev-cluster"), "build", "--scheduler"], check=True)
    proc = DevCluster.spawn_scheduler(None, path, log)  # type: ignore[arg-type]
    try:
        deadline = time.monotonic() + 60
        while SCHEDULER_STARTED not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"kube-scheduler did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class BindWatch:
    """A pod watch (raw JSON lines) in ``ns`` on label ``run``: the pods seen (``seen``) and
    when each was first seen bound (``spec.nodeName``), by this process's ``perf_counter``.

    Started with no resourceVersion (the API server sends every pod as ADDED first, so
    ``seen`` filling up means the watch is on); a watch the server ends (its timeout, an ERROR
    event such as "too large resource version" from a watch cache behind a busy server) is
    opened again from the last version seen. ``errors``: what ended them."""

    def __init__(self, core: Any, ns: str, run: str) -> None:
        self.core, self.ns, self.run = core, ns, run
        self.seen: set[str] = set()
        self.bound: dict[str, float] = {}
        self.errors: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def wait_seen(self, count: int, timeout_s: float = 60) -> None:
        """Wait until ``count`` pods were seen; raises ``RuntimeError`` after ``timeout_s``."""
        deadline = time.perf_counter() + timeout_s
        while len(self.seen) < count:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"pod watch saw {len(self.seen)} of {count}: {self.errors}")
            time.sleep(0.02)

    def _run(self) -> None:
        rv: str | None = None
        while not self.done.is_set():
            try:
                rv = self._stream(rv)
            except Exception as exc:  # noqa: BLE001 - noted, the watch is opened again
                self.errors.append(repr(exc)[:200])
                time.sleep(0.1)

    def _stream(self, rv: str | None) -> str | None:
        """One watch from ``rv`` (None: the current state first); the last version seen, or
        None after an ERROR event (start again from the current state)."""
        extra = {"resource_version": rv} if rv else {}
        resp = self.core.list_namespaced_pod(
            self.ns, label_selector=f"run={self.run}", watch=True, timeout_seconds=300,
            _preload_content=False, _request_timeout=None, **extra,
        )  # fmt: skip
        buf = b""
        for chunk in resp.stream(amt=None, decode_content=False):
            if self.done.is_set():
                return rv
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object", {})
                if event.get("type") == "ERROR":
                    self.errors.append(str(obj.get("message"))[:200])
                    return None
                meta = obj.get("metadata", {})
                rv, name = meta.get("resourceVersion", rv), meta.get("name")
                self.seen.add(name)
                if obj.get("spec", {}).get("nodeName") and name not in self.bound:
                    self.bound[name] = time.perf_counter()
        return rv

    def close(self) -> None:
        # closing the stream from this thread can block on the reader's lock: the reader stops at
        # its next line, the server ends the watch at its timeout
        self.done.set()


# -- one kind ------------------------------------------------------------------------------------


@dataclass
class KindRun:
    """What one kind's pods measured."""

    pods: int
    bound: int
    span_s: float
    pods_per_s: float
    p50_ms: float
    p99_ms: float
    writes_per_s: float
    slice_writes_per_s: float
    sched_cores: float
    sched_rss_mib: float
    apiserver_cores: float
    bench_cores: float
    extra: dict[str, Any] = field(default_factory=dict)


def parallel(fn: Callable[[Any], Any], items: Sequence[Any], workers: int = 16) -> list[float]:
    """``fn`` on each item on ``workers`` threads; each item's finishing ``perf_counter``."""

    def one(item: Any) -> float:
        fn(item)
        return time.perf_counter()

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, items))


def run_kind(kind: str, live: bool, pods: int, ctx: dict[str, Any], timeout_s: float,
             live_claims: bool | None = None) -> KindRun:  # fmt: skip
    """Create ``pods`` gated pods of ``kind`` with their claims, release them, wait for every
    binding (or ``timeout_s``), measure, and delete them again."""
    core, custom = ctx["core"], ctx["custom"]
    run = f"{kind}-{'live' if live else 'static'}-{ctx['seq']}"
    ctx["seq"] += 1
    names = [f"{run}-{i:05d}" for i in range(pods)]
    spec = claim_spec(kind, live if live_claims is None else live_claims)

    def create(name: str) -> None:
        custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", NS, "resourceclaims",
            {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "labels": {"run": run}}, "spec": spec},
            _preload_content=False,
        )  # fmt: skip
        core.create_namespaced_pod(NS, pod_body(name, name, ctx["scheduler"], run),
                                   _preload_content=False)  # fmt: skip

    parallel(create, names)
    watch = BindWatch(core, NS, run)
    watch.wait_seen(pods)
    pids = ctx["pids"]
    w0 = write_counts(ctx["host"], ctx["tls"])
    cpu0 = {k: proc_cpu_s(p) for k, p in pids.items()}
    bench0 = time.process_time()
    released: dict[str, float] = {}
    t0 = time.perf_counter()

    def ungate(name: str) -> None:
        core.patch_namespaced_pod(name, NS, [{"op": "remove", "path": "/spec/schedulingGates"}],
                                  _preload_content=False)  # fmt: skip
        released[name] = time.perf_counter()

    parallel(ungate, names)
    deadline = time.perf_counter() + timeout_s
    while len(watch.bound) < pods and time.perf_counter() < deadline:
        time.sleep(0.05)
    bound = dict(watch.bound)
    t1 = max(bound.values()) if bound else time.perf_counter()
    span = max(t1 - t0, 1e-9)
    w1 = write_counts(ctx["host"], ctx["tls"])
    cpu = {k: (proc_cpu_s(p) - cpu0[k]) / span for k, p in pids.items()}
    bench_cores = (time.process_time() - bench0) / span
    rss = proc_rss_mib(pids["scheduler"])[0]
    watch.close()
    if watch.errors:
        print(f"({run}: pod watch reopened after {watch.errors})", file=sys.stderr, flush=True)
    lat = [bound[n] - released[n] for n in bound if n in released]
    out = KindRun(
        pods=pods, bound=len(bound), span_s=span, pods_per_s=len(bound) / span,
        p50_ms=median(lat) * 1e3, p99_ms=pct(lat, 99) * 1e3,
        writes_per_s=(w1["all"] - w0["all"]) / span,
        slice_writes_per_s=(w1["resourceslices"] - w0["resourceslices"]) / span,
        sched_cores=cpu["scheduler"], sched_rss_mib=rss, apiserver_cores=cpu["apiserver"],
        bench_cores=bench_cores,
    )  # fmt: skip
    cleanup(core, custom, run)
    return out


def cleanup(core: Any, custom: Any, run: str, timeout_s: float = 120) -> None:
    """Delete the run's pods (grace 0: no kubelet) and claims (their finalizers cleared, as the
    claim controller would once no pod holds them); wait until the claims are gone."""
    core.delete_collection_namespaced_pod(NS, label_selector=f"run={run}", grace_period_seconds=0,
                                          _preload_content=False)  # fmt: skip
    custom.delete_collection_namespaced_custom_object(
        "resource.k8s.io", "v1", NS, "resourceclaims", label_selector=f"run={run}",
        _preload_content=False,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        items = json.loads(custom.list_namespaced_custom_object(
            "resource.k8s.io", "v1", NS, "resourceclaims", label_selector=f"run={run}",
            _preload_content=False).data)["items"]  # fmt: skip
        if not items:
            return

        def unblock(claim: dict[str, Any]) -> None:
            with contextlib.suppress(Exception):
                custom.patch_namespaced_custom_object(
                    "resource.k8s.io", "v1", NS, "resourceclaims", claim["metadata"]["name"],
                    {"metadata": {"finalizers": None}}, _preload_content=False,
                )  # fmt: skip

        parallel(unblock, [c for c in items if c["metadata"].get("finalizers")])
        time.sleep(0.2)
    raise RuntimeError(f"claims of {run} still there after {timeout_s:g} s")


# -- nodes ---------------------------------------------------------------------------------------


def make_nodes(core: Any, names: list[str], group: str) -> dict[str, str]:
    """Create the Nodes, Ready and schedulable (the status a kubelet posts:
    ``tests.scheduler.scheduling_cluster_support.schedulable``); their uids."""
    from tests.scheduler.scheduling_cluster_support import schedulable

    uids: dict[str, str] = {}

    def one(name: str) -> None:
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                      "bench": group}}}  # fmt: skip
        made = json.loads(core.create_node(body, _preload_content=False).data)
        uids[name] = made["metadata"]["uid"]
        schedulable(core, name)

    parallel(one, names, workers=8)
    return uids


def delete_nodes(core: Any, custom: Any, group: str) -> None:
    """Delete the bench's Nodes and their ResourceSlices (no garbage collector runs here)."""
    with contextlib.suppress(Exception):
        core.delete_collection_node(label_selector=f"bench={group}", _preload_content=False)
    with contextlib.suppress(Exception):
        custom.delete_collection_cluster_custom_object(
            "resource.k8s.io", "v1", "resourceslices",
            field_selector=f"spec.driver={DRIVER}", _preload_content=False,
        )  # fmt: skip


# -- main ----------------------------------------------------------------------------------------


def mode_name(live: bool, factor: float, control: bool = False) -> str:
    if control:
        return f"live {factor:g}x, static claims"
    return f"live {factor:g}x" if live else "static"


def run_size(n: int, pods: int, churns: Sequence[float], mix: Sequence[float],
             ctx: dict[str, Any], timeout_s: float,
             rounds: int = 1, control: bool = False) -> list[tuple[str, str, KindRun, dict]]:  # fmt: skip
    """Every mode (static, then live at each churn factor) and kind on ``n`` Nodes, ``rounds``
    times over (modes interleaved: the machine's other load falls on each alike); the median of
    the rounds per mode and kind."""
    from omaticaya_py.kube.session import ApiSession

    group = f"dra-scale-{os.getpid()}-n{n}"
    names = [f"{group}-{i:05d}" for i in range(n)]
    core, custom = ctx["core"], ctx["custom"]
    session = ApiSession(kubeconfig=ctx["kubeconfig"], attempts=2)
    runs: dict[tuple[str, str], list[KindRun]] = {}
    infos: dict[str, dict[str, float]] = {}
    try:
        t = time.perf_counter()
        make_nodes(core, names, group)
        print(f"(N={n}: {n} Nodes in {time.perf_counter() - t:.0f} s)", file=sys.stderr, flush=True)
        for _ in range(rounds):
            modes = [(False, 0.0, False)] + [(True, f, False) for f in churns]
            modes += [(True, max(churns), True)] if control else []
            for live, factor, static_claims in modes:
                mode = mode_name(live, factor, static_claims)
                fleet = build_fleet(session, names, mix, live)
                t = time.perf_counter()
                for node in fleet:
                    node.step(live)  # the slice as it is now (the first write; a GET before it)
                print(f"(N={n} {mode}: {n} slices in {time.perf_counter() - t:.0f} s)",
                      file=sys.stderr, flush=True)  # fmt: skip
                first = sum(f.writes for f in fleet)
                churn = Churn(fleet, factor).start() if live else None
                t = time.perf_counter()
                try:
                    for kind in KINDS:
                        r = run_kind(kind, live, pods, ctx, timeout_s,
                                     live_claims=False if static_claims else None)  # fmt: skip
                        runs.setdefault((mode, kind), []).append(r)
                        print(f"(N={n} {mode} {kind}: {r.bound}/{r.pods} bound, "
                              f"{r.pods_per_s:.1f} pods/s)", file=sys.stderr, flush=True)  # fmt: skip
                finally:
                    if churn:
                        churn.stop()
                info = infos.setdefault(mode, {"writes": 0.0, "wall_s": 0.0, "lag_s": 0.0})
                info["writes"] += sum(f.writes for f in fleet) - first
                info["wall_s"] += time.perf_counter() - t
                info["offered_per_s"] = churn.expected_per_s if churn else 0.0
                info["lag_s"] = max(info["lag_s"], churn.lag_s if churn else 0.0)
    finally:
        delete_nodes(core, custom, group)
        session.close()
    return [(mode, kind, middle(rs), infos[mode]) for (mode, kind), rs in runs.items()]


def middle(runs: list[KindRun]) -> KindRun:
    """Each figure's median over the rounds (``bound``: the least)."""
    out = copy.copy(runs[0])
    for name in KindRun.__dataclass_fields__:
        if name in ("pods", "extra"):
            continue
        values = [getattr(r, name) for r in runs]
        setattr(out, name, min(values) if name == "bound" else median(values))
    return out


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def report(results: dict[int, list[tuple[str, str, KindRun, dict]]], args: Any,
           class_src: str) -> list[str]:  # fmt: skip
    """The tables: ratios live/static first, then every run, then the write costs."""
    ratio_rows, rows, write_rows = [], [], []
    for n, runs in results.items():
        static = {k: r for m, k, r, _ in runs if m == "static"}
        for mode, kind, r, info in runs:
            rows.append([n, mode, kind, r.bound, r.pods, r.pods_per_s, r.pods_per_s / args.cores,
                         r.p50_ms, r.p99_ms, r.writes_per_s, r.slice_writes_per_s,
                         r.sched_cores, r.sched_rss_mib, r.apiserver_cores, r.bench_cores])  # fmt: skip
            if mode != "static" and kind in static:
                s = static[kind]
                q = ratio(r.pods_per_s, s.pods_per_s)
                ratio_rows.append([n, mode, kind, q, ratio(r.p50_ms, s.p50_ms),
                                   ratio(r.p99_ms, s.p99_ms), ratio(r.sched_cores, s.sched_cores),
                                   "yes" if q >= 0.9 else "no"])  # fmt: skip
            if kind == KINDS[0] and mode != "static":
                sent = info["writes"] / info["wall_s"] if info["wall_s"] else float("nan")
                write_rows.append([n, mode, info["offered_per_s"], sent, sent * 1000 / n,
                                   info["lag_s"]])  # fmt: skip
    mix = "/".join(f"{m:g}" for m in args.mix)
    return [
        table(
            [
                "N",
                "mode",
                "kind",
                "pods/s live/static",
                "p50 live/static",
                "p99 live/static",
                "scheduler CPU live/static",
                "goal >= 0.9x",
            ],
            ratio_rows,
        ),
        table(
            [
                "N",
                "mode",
                "kind",
                "bound",
                "pods",
                "pods/s",
                "pods/s per core",
                "p50 ms",
                "p99 ms",
                "apiserver writes/s",
                "of them slices/s",
                "scheduler cores",
                "scheduler RSS MiB",
                "apiserver cores",
                "bench cores",
            ],
            rows,
        ),
        f"DeviceClass: {class_src}. Fleet mix steady/busy/failing {mix} (%), at 0, 1 and 180 "
        "slice writes per node-hour (x the churn factor); static: no freeMemoryMiB, no churn.\n"
        "pods/s: pods bound over the span from the first gate removed to the last binding; "
        "p50/p99: a pod's gate removed to its binding seen by a watch.\n"
        f"per core: pods/s / {args.cores:g} (the machine's cores, shared by etcd, the API "
        "server, the scheduler and this process).",
        table(
            [
                "N",
                "mode",
                "churn writes/s offered",
                "sent",
                "sent per 1,000 nodes",
                "churn lag max s",
            ],
            write_rows,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 10, 20 pods a kind, churn 1x")
    ap.add_argument("--nodes", type=int, nargs="+", help="fleet sizes (default 50 100 500)")
    ap.add_argument("--pods", type=int, help="pods per kind (default 200; at most 70%% of GPUs)")
    ap.add_argument("--churn", type=float, nargs="+", help="churn factors (default 1 10)")
    ap.add_argument(
        "--mix",
        type=float,
        nargs=3,
        default=[85.0, 10.0, 5.0],
        metavar=("STEADY", "BUSY", "FAILING"),
        help="fleet mix, %% (85 10 5)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="modes interleaved, median taken")
    ap.add_argument("--control", action="store_true",
                    help="also the live slices at the highest churn with the static claims")  # fmt: skip
    ap.add_argument("--qps", type=int, default=5000, help="kube-scheduler client QPS and burst")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per kind, for the bindings")
    ap.add_argument("--kubeconfig", help="reuse this API server (default $KUBECONFIG or a new one)")
    args = ap.parse_args(argv)
    if args.quick:
        args.nodes, args.pods = args.nodes or [10], args.pods or 20
        args.churn = args.churn or [1.0]
    args.nodes, args.pods = args.nodes or [50, 100, 500], args.pods or 200
    args.churn = args.churn or [1.0, 10.0]
    args.cores = float(os.cpu_count() or 1)
    # `timeout` and CI stop with SIGTERM: run the finally blocks (the scheduler, the cluster)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from kubernetes import client, config
    from loguru import logger

    logger.remove()
    results: dict[int, list] = {}
    with cluster(args.kubeconfig) as c:
        cfg = client.Configuration()
        config.load_kube_config(config_file=c.kubeconfig, client_configuration=cfg)
        cfg.connection_pool_maxsize = 32
        api_client = client.ApiClient(cfg)
        core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
        host, tls = https(c.kubeconfig)
        body, class_src = device_class()
        with contextlib.suppress(client.ApiException):
            core.create_namespace({"metadata": {"name": NS}}, _preload_content=False)  # type: ignore[arg-type]
        created_class = False
        try:
            custom.create_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", body,
                                                _preload_content=False)  # fmt: skip
            created_class = True
        except client.ApiException as exc:
            if exc.status != 409:
                raise
        name = f"dra-scale-{os.getpid()}"
        tmp = Path(tempfile.mkdtemp(prefix="dra-scale-"))
        try:
            with scheduler(c.kubeconfig, name, args.qps, tmp) as sched:
                pids = {"scheduler": sched.pid, "apiserver": c.pid("apiserver")}
                if pids["apiserver"] is None:
                    raise SystemExit("the API server's pid is unknown: run with a dev cluster")
                ctx = {"core": core, "custom": custom, "api_client": api_client, "host": host,
                       "tls": tls, "pids": pids, "scheduler": name, "seq": 0,
                       "kubeconfig": c.kubeconfig}  # fmt: skip
                for n in args.nodes:
                    pods = min(args.pods, int(0.7 * GPUS_PER_NODE * n))
                    results[n] = run_size(
                        n,
                        pods,
                        args.churn,
                        args.mix,
                        ctx,
                        args.timeout_s,
                        args.rounds,
                        args.control,
                    )
        finally:
            with contextlib.suppress(Exception):
                core.delete_namespace(NS, _preload_content=False)
            if created_class:
                with contextlib.suppress(Exception):
                    custom.delete_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses",
                                                        DRIVER, _preload_content=False)  # fmt: skip
            api_client.close()
    from devtools.devcluster.cluster import K8S_VERSION

    emit(
        header(f"DRA at fleet scale: kube-scheduler {K8S_VERSION} (QPS {args.qps}), N nodes x "
               f"{GPUS_PER_NODE} GPUs, live vs static ResourceSlices"),
        *report(results, args, class_src),
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Shared helpers of the bench scripts: machine header, tables, statistics, synthetic traces,
a fake clock, a dev cluster (started or reused), an HTTP-layer request counter, /proc readers.

Every bench script prints a plain-text header (machine, date, command) then its tables; the
tables are what docs/benchmarks.md records. Nothing here is timed as a test.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/x.py` from anywhere
    sys.path.insert(0, str(ROOT))

H100_TRACE = ROOT / "tests" / "data" / "h100-trace.json"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# -- header and tables -------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def mem_total_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return 0.0


def header(title: str, argv: Sequence[str] | None = None) -> str:
    """Title, machine, date and the command that produced the tables below it."""
    argv = sys.argv if argv is None else argv
    cmd = " ".join(shlex.quote(a) for a in [".venv/bin/python", *argv])
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"== {title}",
        f"machine: {cpu_model()}, {os.cpu_count()} cores, {mem_total_gib():.0f} GiB, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
        f"date:    {now}",
        f"command: {cmd}",
    ]
    return "\n".join(lines)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str], raw: Sequence[Any] | None) -> str:
        out = []
        for i, c in enumerate(r):
            numeric = raw is not None and isinstance(raw[i], int | float)
            out.append(c.rjust(widths[i]) if numeric else c.ljust(widths[i]))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    body = [line(cells[0], None), sep]
    body += [line(c, raw) for c, raw in zip(cells[1:], rows, strict=True)]
    return "\n".join(body)


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "n/a"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def emit(*parts: str) -> None:
    print("\n\n".join(parts), flush=True)


# -- statistics --------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank on the sorted values; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# -- traces ------------------------------------------------------------------------------------


def load_raw(path: Path = H100_TRACE) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def replicate(raw: dict[str, Any], n_gpus: int) -> dict[str, Any]:
    """The one-GPU trace as an ``n_gpus`` trace: GPU 0 copied to indices 0..n-1, each with its
    own uuid (and the same readings, so that every GPU changes when the recorded one does)."""
    out = copy.deepcopy(raw)
    dev0 = raw["devices"][0]
    devices = []
    for i in range(n_gpus):
        d = copy.deepcopy(dev0)
        d["index"] = i
        d["uuid"] = f"{dev0['uuid'][:-12]}{i:012d}"
        devices.append(d)
    out["devices"] = devices
    out["device_count"] = n_gpus
    for sample in out["samples"]:
        if sample.get("gpus"):
            g0 = sample["gpus"][0]
            sample["gpus"] = [{**copy.deepcopy(g0), "index": i} for i in range(n_gpus)]
    return out


def phase_samples(raw: dict[str, Any], phase: str) -> dict[str, Any]:
    """Only the samples of one recorded phase (``idle`` ...), re-timed from 0: a trace that
    loops over that phase with its real noise."""
    bounds = [(p["t"], p["phase"]) for p in raw["phases"]]
    starts = {name: t for t, name in bounds}
    lo = starts[phase] if phase != "idle" else 0.0
    later = [t for t, _ in bounds if t > starts.get(phase, 0.0)]
    hi = min(later) if later else float("inf")
    out = copy.deepcopy(raw)
    picked = [s for s in raw["samples"] if lo <= s["t"] < hi]
    t0 = picked[0]["t"]
    out["samples"] = [{**copy.deepcopy(s), "t": round(s["t"] - t0, 3)} for s in picked]
    out["phases"] = [{"t": 0.0, "phase": phase}]
    return out


_TMP = Path(tempfile.mkdtemp(prefix="omaticaya-bench-"))


def write_trace(raw: dict[str, Any], name: str) -> Path:
    """Write a trace built in memory to a temporary file (``TraceReader`` reads a path)."""
    path = _TMP / f"{name}.json"
    path.write_text(json.dumps(raw), encoding="utf-8")
    return path


class FakeClock:
    """Monotonic seconds that move only when told (``advance``)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def bench_settings(**overrides: Any) -> Any:
    """Agent settings from defaults plus ``overrides``, ignoring any ``.env`` and environment
    (the bench must not depend on the caller's shell)."""
    from omaticaya_py.core.config.settings import Settings

    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("OMATICAYA_")}
    try:
        return Settings(_env_file=None, **overrides)  # type: ignore[call-arg]
    finally:
        os.environ.update(saved)


# -- the dev cluster ---------------------------------------------------------------------------


@dataclass
class Cluster:
    """An API server to talk to: ``kubeconfig`` path, and (when we know them) its state dir,
    audit log and the kube-apiserver / etcd pids."""

    kubeconfig: str
    state_dir: Path | None = None
    started: bool = False

    @property
    def audit_log(self) -> Path | None:
        return self.state_dir / "audit.log" if self.state_dir else None

    def pid(self, name: str) -> int | None:
        if self.state_dir is None:
            return None
        from devtools.devcluster import DevClusterError, load_state

        try:
            state = load_state(self.state_dir)
        except DevClusterError:
            return None
        proc = state.procs.get(name) if state else None
        return proc.pid if proc else None


@contextlib.contextmanager
def cluster(kubeconfig: str | None = None) -> Iterator[Cluster]:
    """The API server for a bench run: ``kubeconfig`` (or ``$KUBECONFIG``) when given, with its
    state dir from ``$OMATICAYA_DEV_DIR`` or next to the kubeconfig; else a fresh dev cluster
    (``scripts/dev-cluster up`` in a temporary dir), stopped afterwards."""
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG")
    if kubeconfig:
        state = os.environ.get("OMATICAYA_DEV_DIR") or str(Path(kubeconfig).parent)
        state_dir = Path(state) if (Path(state) / "state.json").exists() else None
        yield Cluster(kubeconfig=kubeconfig, state_dir=state_dir)
        return
    from tests.devcluster import start_dev_cluster

    state_dir = Path(tempfile.mkdtemp(prefix="omaticaya-bench-cluster-"))
    print(f"(starting a dev cluster in {state_dir} ...)", file=sys.stderr, flush=True)
    dev = start_dev_cluster(state_dir)
    try:
        yield Cluster(kubeconfig=str(dev.kubeconfig), state_dir=state_dir, started=True)
    finally:
        dev.down()


def admin_api(kubeconfig: str) -> Any:
    """``CoreV1Api`` from the kubeconfig (the dev cluster's admin certificate)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    return client.CoreV1Api(client.ApiClient(cfg))


def create_nodes(api: Any, names: Sequence[str], group: str) -> None:
    """Create bare Nodes labelled ``bench=<group>`` (deleted again by ``delete_nodes``)."""
    for name in names:
        api.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "nvidia.com/gpu.present": "true",
                        "bench": group,
                    },
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                },
            }
        )


def delete_nodes(api: Any, group: str) -> None:
    with contextlib.suppress(Exception):
        api.delete_collection_node(label_selector=f"bench={group}")


# -- counting at the HTTP layer ----------------------------------------------------------------


@dataclass
class HttpCount:
    """Requests and bytes one client sent and received, counted at urllib3's ``request()``:
    bytes are the HTTP/1.1 request line + headers + body (before TLS), and the same for the
    response (status line + headers + body)."""

    requests: Counter[str] = field(default_factory=Counter)
    sent: int = 0
    body_sent: int = 0
    received: int = 0

    @property
    def total(self) -> int:
        return sum(self.requests.values())


class CountingPool:
    """Wraps a urllib3 ``PoolManager``: every ``request()`` is counted in ``count``."""

    def __init__(self, inner: Any, count: HttpCount) -> None:
        self._inner = inner
        self.count = count

    def request(self, method: str, url: str, body: Any = None, headers: Any = None, **kw: Any):
        response = self._inner.request(method, url, body=body, headers=headers, **kw)
        c = self.count
        c.requests[method] += 1
        path = url.split("://", 1)[-1]
        path = path[path.find("/") :] if "/" in path else "/"
        host = url.split("://", 1)[-1].split("/", 1)[0]
        hdrs = dict(headers or {})
        size = len(body.encode() if isinstance(body, str) else (body or b""))
        hdrs.setdefault("Host", host)
        hdrs.setdefault("Accept-Encoding", "identity")
        if size:
            hdrs.setdefault("Content-Length", str(size))
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
        c.sent += len(head) + 2 + size
        c.body_sent += size
        data = response.data  # cached by urllib3: the caller still reads it
        rhead = f"HTTP/1.1 {response.status} X\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in response.headers.items()
        )
        c.received += len(rhead) + 2 + len(data or b"")
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def count_api_client(api_client: Any, count: HttpCount | None = None) -> HttpCount:
    """Count every request of a kubernetes ``ApiClient`` (its REST client's pool)."""
    count = count or HttpCount()
    rest = api_client.rest_client
    rest.pool_manager = CountingPool(rest.pool_manager, count)
    return count


def audit_counts(audit_log: Path | None, names: set[str]) -> dict[str, Counter[str]] | None:
    """The API server's own count, from its audit log: ``{node name: Counter(verb)}`` of the
    requests on those Nodes (stage ResponseComplete)."""
    if audit_log is None or not audit_log.exists():
        return None
    out: dict[str, Counter[str]] = {n: Counter() for n in names}
    with audit_log.open(encoding="utf-8") as f:
        for line in f:
            if '"nodes"' not in line:
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ref = ev.get("objectRef") or {}
            if (
                ev.get("stage") == "ResponseComplete"
                and ref.get("name") in out
                and ev.get("verb") not in ("create", "delete")  # the bench's own set-up
            ):
                out[ref["name"]][ev.get("verb", "?")] += 1
    return out


# -- /proc -------------------------------------------------------------------------------------


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_run_s(pid: int) -> float:
    """Seconds on a CPU of a process's live threads, summed from ``/proc/<pid>/task/*/schedstat``
    (nanoseconds): ``proc_cpu_s`` counts in clock ticks (10 ms), a third of a quiet minute's
    whole figure; this resolves microseconds. Threads that exited are not counted: measure a
    process whose threads live through the window (the agent's do)."""
    total_ns = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total_ns += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between the listing and the read
    return total_ns / 1e9


def proc_rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, MiB."""
    rss = hwm = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) / 1024
    return rss, hwm


def now_s() -> float:
    return time.perf_counter()

"""Node watch fan-out for the bench: plain watch streams on ``/api/v1/nodes`` (as one CNI agent
per node holds), counting what each receives, and the API server's own watch counters.

``NodeWatchers`` opens each stream as a plain HTTPS request with the kubeconfig's credentials
(``GET /api/v1/nodes?watch=1&resourceVersion=<the LIST's>``: events from now on, no initial
ADDED burst), reads it line by line (one JSON watch event per line, never parsed beyond its
type) and counts events and bytes: the event lines as delivered (JSON + newline, after the
chunked transfer decoding and TLS). ``apiserver_watch_counts`` reads
``apiserver_watch_events_total`` and ``apiserver_watch_events_sizes`` (``_sum``: the encoded
object of each event sent to a watcher, without the ``{"type":...,"object":...}`` wrapper) for
``kind="Node"`` from the API server's /metrics (kube-apiserver v1.20: both ALPHA, labelled
group, version, kind; counted once per event per watch stream).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Endpoint",
    "NodeWatchers",
    "WatchCount",
    "apiserver_watch_counts",
    "watch_program",
    "watch_rows",
]


@dataclass(frozen=True)
class Endpoint:
    """The API server's host, port and TLS context from a kubeconfig, plus a bearer token if
    the kubeconfig has one."""

    host: str
    port: int
    context: ssl.SSLContext
    token: str | None

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str) -> Endpoint:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        url = urllib.parse.urlsplit(cfg.host)
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if not cfg.verify_ssl:
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        token = (cfg.api_key or {}).get("authorization") or (cfg.api_key or {}).get("BearerToken")
        return cls(url.hostname or "127.0.0.1", url.port or 443, ctx, token)

    def connect(self, timeout_s: float | None = 30.0) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(
            self.host, self.port, context=self.context, timeout=timeout_s
        )

    def headers(self) -> dict[str, str]:
        auth = {"Authorization": self.token} if self.token else {}
        if self.token and not self.token.lower().startswith("bearer "):
            auth = {"Authorization": f"Bearer {self.token}"}
        return {"Accept": "application/json", **auth}

    def get(self, path: str) -> bytes:
        conn = self.connect()
        try:
            conn.request("GET", path, headers=self.headers())
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"GET {path}: HTTP {resp.status}: {data[:200]!r}")
            return data
        finally:
            conn.close()


@dataclass
class WatchCount:
    """What one watch stream received: events (by type) and bytes of event lines."""

    events: int = 0
    bytes: int = 0
    types: Counter[str] = field(default_factory=Counter)


class NodeWatchers:
    """``add(k)`` more plain Node watch streams, each in a daemon thread; ``total()`` sums what
    they received so far as ``(events, bytes)``; ``stop()`` closes them all. A stream that ends
    (the server's watch timeout) is counted in ``ended``, not reopened."""

    def __init__(self, endpoint: Endpoint, timeout_s: int = 3600) -> None:
        self.endpoint, self.timeout_s = endpoint, timeout_s
        self.counts: list[WatchCount] = []
        self.ended = 0
        self._conns: list[http.client.HTTPSConnection] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.counts)

    def add(self, k: int) -> None:
        """Open ``k`` more streams from the current resourceVersion; returns once each got its
        response headers (the API server has registered it)."""
        rv = json.loads(self.endpoint.get("/api/v1/nodes?limit=1"))["metadata"]["resourceVersion"]
        path = (
            f"/api/v1/nodes?watch=1&resourceVersion={rv}&timeoutSeconds={self.timeout_s}"
            "&allowWatchBookmarks=false"
        )
        for _ in range(k):
            conn = self.endpoint.connect(timeout_s=None)
            conn.request("GET", path, headers=self.endpoint.headers())
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"watch: HTTP {resp.status}: {resp.read()[:200]!r}")
            count = WatchCount()
            thread = threading.Thread(target=self._read, args=(resp, count), daemon=True)
            with self._lock:
                self.counts.append(count)
                self._conns.append(conn)
                self._threads.append(thread)
            thread.start()

    def _read(self, resp: http.client.HTTPResponse, count: WatchCount) -> None:
        try:
            while line := resp.readline():
                count.bytes += len(line)
                count.events += 1
                kind = line[9:20].split(b'"', 1)[0]  # {"type":"MODIFIED",...
                count.types[kind.decode("ascii", "replace")] += 1
        except (OSError, ValueError, http.client.HTTPException):
            pass  # closed by stop()
        with self._lock:
            self.ended += 1

    def total(self) -> tuple[int, int]:
        with self._lock:
            return sum(c.events for c in self.counts), sum(c.bytes for c in self.counts)

    def stop(self) -> None:
        """End every stream (socket shutdown: the readers see EOF), then close them."""
        for conn in self._conns:
            if conn.sock is not None:
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for thread in self._threads:
            thread.join(2.0)
        for conn in self._conns:
            conn.close()


def apiserver_watch_counts(endpoint: Endpoint, kind: str = "Node") -> tuple[float, float]:
    """(``apiserver_watch_events_total``, ``apiserver_watch_events_sizes_sum``) for ``kind``,
    summed over group and version: counters since the API server started."""
    events = size = 0.0
    for raw in endpoint.get("/metrics").decode().splitlines():
        if f'kind="{kind}"' not in raw or raw.startswith("#"):
            continue
        name, _, value = raw.rpartition(" ")
        if name.startswith("apiserver_watch_events_total{"):
            events += float(value)
        elif name.startswith("apiserver_watch_events_sizes_sum{"):
            size += float(value)
    return events, size


def watch_program(
    kubeconfig: str, snapshot: Callable[[], dict[str, Any]], ks: list[int], window_s: float
) -> Callable[[], list[dict[str, Any]]]:
    """For each K in ``ks`` (ascending): bring the Node watchers up to K streams, then count
    ``window_s`` seconds: the watchers' own events and bytes, the API server's watch counters,
    and what ``snapshot()`` counts (``t``, ``patches``, ``leases``, ``cpu`` by process).
    Returns the program for ``bench/fleet.py``'s ``run_fleet``."""

    def program() -> list[dict[str, Any]]:
        endpoint = Endpoint.from_kubeconfig(kubeconfig)
        watchers = NodeWatchers(endpoint)
        windows = []
        try:
            for k in ks:
                watchers.add(k - len(watchers))
                a0, w0, s0 = apiserver_watch_counts(endpoint), watchers.total(), snapshot()
                time.sleep(window_s)
                a1, w1, s1 = apiserver_watch_counts(endpoint), watchers.total(), snapshot()
                wall = s1["t"] - s0["t"]
                windows.append({
                    "k": k, "wall_s": wall, "patches": s1["patches"] - s0["patches"],
                    "leases": s1["leases"] - s0["leases"],
                    "events": w1[0] - w0[0], "bytes": w1[1] - w0[1],
                    "api_events": a1[0] - a0[0], "api_bytes": a1[1] - a0[1],
                    "cpu": {c: (s1["cpu"][c] - s0["cpu"][c]) / wall for c in s1["cpu"]},
                })  # fmt: skip
        finally:
            watchers.stop()
        return windows

    return program


def watch_rows(n: int, behaviour: str, windows: list[dict[str, Any]]) -> list[list[Any]]:
    """One row per window: per second over the fleet, and per node-hour (/ N * 3600)."""
    rows = []
    for w in windows:
        per_s = 1.0 / w["wall_s"]
        node_h = 3600.0 / n
        rows.append([
            n, behaviour, w["k"], w["wall_s"], w["patches"] * per_s, w["patches"] * per_s * node_h,
            w["leases"] * per_s * node_h,
            w["events"] * per_s, w["bytes"] * per_s / 1024,
            w["events"] * per_s * node_h, w["bytes"] * per_s * node_h / 2**20,
            w["api_events"] * per_s, w["api_bytes"] * per_s / 1024,
            w["api_events"] * per_s * node_h, w["api_bytes"] * per_s * node_h / 2**20,
            w["cpu"].get("apiserver", float("nan")),
        ])  # fmt: skip
    return rows

"""A fault-injecting HTTP proxy in front of the real kube-apiserver (tests only).

The agent talks plain HTTP to the proxy on 127.0.0.1; the proxy forwards every request to the
dev cluster's API server over TLS as admin, unless a queued fault says otherwise: answer with a
status (409, 429 + Retry-After, 503, ...) without forwarding, or hold the request for a while
before forwarding; or, between ``stall()`` and ``heal()``, accept every request and never
answer it (an API server that hangs). It sits beside the real API server, never instead of it: every request that
succeeds was served by kube-apiserver.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


@dataclass
class Fault:
    method: str  # "PATCH", "GET", "*"
    status: int | None = None  # answer with this instead of forwarding
    retry_after_s: int | None = None
    delay_s: float = 0.0  # hold the request this long, then forward


class FaultProxy:
    """``url`` is the proxy's address; ``seen`` lists (method, path, status) of every request."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        target = urlsplit(cluster.server)
        self._host, self._port = target.hostname, target.port
        self._ctx = cluster.ssl_context()
        self.faults: deque[Fault] = deque()
        self.seen: list[tuple[str, str, int]] = []
        self.in_flight = threading.Event()
        self.held = 0  # requests held unanswered by a stall so far
        self._stalled = False
        self._healed = threading.Event()
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if proxy._hold():  # stalled: never answered; the connection closes at heal()
                    self.close_connection = True
                    return
                fault = proxy._take(self.command)
                if fault is not None and fault.delay_s:
                    proxy.in_flight.set()
                    time.sleep(fault.delay_s)
                if fault is not None and fault.status is not None:
                    payload = json.dumps(
                        {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "message": f"injected {fault.status}", "code": fault.status}
                    ).encode()
                    self.send_response(fault.status)
                    if fault.retry_after_s is not None:
                        self.send_header("Retry-After", str(fault.retry_after_s))
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    proxy._record(self.command, self.path, fault.status)
                    return
                conn = http.client.HTTPSConnection(
                    proxy._host, proxy._port, context=proxy._ctx, timeout=30
                )
                headers = {
                    k: v for k, v in self.headers.items()
                    if k.lower() not in ("host", "authorization", "connection")
                }
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()
                proxy._record(self.command, self.path, resp.status)

            do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _take(self, method: str) -> Fault | None:
        with self._lock:
            if self.faults and self.faults[0].method in (method, "*"):
                return self.faults.popleft()
        return None

    def _hold(self) -> bool:
        with self._lock:
            if not self._stalled:
                return False
            self.held += 1
        self.in_flight.set()
        self._healed.wait()
        return True

    def stall(self) -> None:
        """From now on, accept every request and never answer it, until ``heal()``."""
        with self._lock:
            self._stalled = True
            self._healed.clear()

    def heal(self) -> None:
        """End a stall: requests are forwarded again; the held ones are closed unanswered."""
        with self._lock:
            self._stalled = False
        self._healed.set()

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.seen.append((method, path, status))

    def inject(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    def kubeconfig(self, path: Path) -> Path:
        """Write a kubeconfig that points at the proxy (no credentials needed)."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "proxy", "cluster": {"server": self.url}}],
                    "users": [{"name": "anyone", "user": {}}],
                    "contexts": [
                        {"name": "proxy", "context": {"cluster": "proxy", "user": "anyone"}}
                    ],
                    "current-context": "proxy",
                }
            )
        )
        return path

    def close(self) -> None:
        self.heal()
        self._server.shutdown()
        self._server.server_close()

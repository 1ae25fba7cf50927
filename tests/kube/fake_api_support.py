"""A stand-in API server for the hook commands' unit tests (``tests/kube/test_stop_daemonset.py``,
``test_agent_nodes.py``), beside the real kube-apiserver tests of the same commands: an HTTP
server on 127.0.0.1 that answers each request with ``handle(method, path, body)`` as JSON, and a
kubeconfig with a throwaway token pointing at it."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from omaticaya_py.kube import ApiSession

#: (method, path with query, JSON body or None) -> (HTTP status, JSON answer)
Handle = Callable[[str, str, Any], tuple[int, Any]]


def status(code: int, reason: str) -> dict[str, Any]:
    """A ``metav1.Status`` failure as the API server sends it."""
    return {"kind": "Status", "status": "Failure", "code": code, "reason": reason,
            "message": reason.lower()}  # fmt: skip


@contextmanager
def serve_fake_api(handle: Handle, tmp_path: Path, token: str = "test-token") -> Iterator[Path]:
    """Serve ``handle`` on a free port of 127.0.0.1 (GET and DELETE) while the block runs; yields
    the path of a kubeconfig (``tmp_path/kubeconfig``) that reaches it with ``token``."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            code, answer = handle(self.command, self.path, json.loads(raw) if raw else None)
            data = json.dumps(answer).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_DELETE = _serve  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))  # fmt: skip
    try:
        yield kubeconfig
    finally:
        server.shutdown()
        server.server_close()


def session(kubeconfig: Path) -> ApiSession:
    """A session on ``kubeconfig`` that tries once and never sleeps."""
    return ApiSession(kubeconfig=str(kubeconfig), attempts=1, sleep=lambda _s: None)

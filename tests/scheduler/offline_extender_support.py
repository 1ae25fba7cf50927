"""The extender served for real without a cluster: ``serve`` in a thread, its caches pointed at
an API server that refuses connections (they retry; the ports serve meanwhile). Shared by
tests/scheduler/test_extender_metrics_port.py and tests/charts/test_dashboard.py (the
dashboard's extender metrics in a real scrape)."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from omaticaya_py.scheduler import ExtenderSettings
from omaticaya_py.scheduler.server import serve


def unreachable_kubeconfig(folder: Path) -> str:
    """The path of a kubeconfig (written in ``folder``) naming an API server on port 1 of the
    loopback, where nothing listens."""
    path = folder / "unreachable-kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    return str(path)


def offline_settings(folder: Path, **kw: Any) -> ExtenderSettings:
    """``ExtenderSettings`` of ``kw`` (no environment, no ``.env``) whose kubeconfig is
    ``unreachable_kubeconfig(folder)``."""
    return ExtenderSettings(_env_file=None, kubeconfig=unreachable_kubeconfig(folder), **kw)  # type: ignore[call-arg]


class ServedExtender:
    """``serve(settings)`` in a daemon thread until ``close``: ``ready`` once its verbs' port
    listens; ``code``: its exit status, once it returned."""

    def __init__(self, settings: ExtenderSettings) -> None:
        self.ready, self.stop = threading.Event(), threading.Event()
        self.code: list[int] = []
        self.thread = threading.Thread(
            target=lambda: self.code.append(serve(settings, ready=self.ready, stop=self.stop)),
            name="served-extender", daemon=True,
        )  # fmt: skip
        self.thread.start()

    def close(self) -> None:
        """Stop it and wait (15 s) for ``serve`` to return."""
        self.stop.set()
        self.thread.join(15)
        assert not self.thread.is_alive(), "the extender did not stop"


def http(url: str, body: bytes | None = None) -> tuple[int, str]:
    """(HTTP status, body text) of a GET, or a POST of ``body``; raises ``URLError`` when
    nothing listens there."""
    try:
        with urllib.request.urlopen(url, data=body, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()

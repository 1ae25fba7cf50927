"""The scheduler extender run for real in a test: ``serve`` in a thread on a free port against the
dev cluster (``RunningExtender``), and ``metric`` to read one sample of its /metrics text."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from typing import Any

from omaticaya_py.scheduler import ExtenderSettings
from omaticaya_py.scheduler.server import serve
from tests.helpers import free_port

P = "omaticaya.io/"


def pod(mib: int = 1024) -> dict[str, Any]:
    """A pod that asks for ``mib`` MiB of GPU memory (the extender's annotation)."""
    return {"metadata": {"name": "p", "annotations": {P + "gpu-memory-mib": str(mib)}}}


class RunningExtender:
    """``extender.serve`` in a thread on a free port, against the dev cluster."""

    def __init__(self, kubeconfig: str, settings: dict[str, Any] | None = None, **kw: Any) -> None:
        self.port = free_port()
        settings = ExtenderSettings(  # type: ignore[call-arg]
            _env_file=None, port=self.port, kubeconfig=kubeconfig, **(settings or {})
        )
        self.ready, self.stop = threading.Event(), threading.Event()
        self.thread = threading.Thread(
            target=serve, args=(settings,), kwargs={"ready": self.ready, "stop": self.stop, **kw},
            daemon=True,
        )  # fmt: skip
        self.thread.start()
        assert self.ready.wait(30), "extender did not start"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def post(self, verb: str, pod_doc: dict[str, Any], names: list[str]) -> Any:
        """The scheduler's call: ``verb`` (filter, prioritize) for ``pod_doc`` on ``names``."""
        body = json.dumps({"Pod": pod_doc, "Nodes": None, "NodeNames": names}).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/{verb}", data=body,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    def filter(self, *names: str) -> dict[str, Any]:
        return self.post("filter", pod(), list(names))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(15)


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus text exposition (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def judge_state(state: Any, need: Any, *, inflight: Any = (), **context: Any) -> Any:
    """``fit.judge`` of one Node's parsed ``state`` (``None``: not in the cache) with its
    ``inflight`` reservations taken off, in a ``fit.JudgingContext`` of ``context`` (``now``,
    ``ttl_s`` and ``grace_s`` required): the rule without the cache, as ``fit.judge_each``."""
    from omaticaya_py.scheduler.fit import JudgingContext, build_record, judge

    ctx = JudgingContext(**context)
    rec = None if state is None else build_record(state, inflight, ctx, version=0, until=float("inf"))
    return judge(rec, need, ctx)

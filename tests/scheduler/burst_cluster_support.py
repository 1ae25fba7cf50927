"""What other test files share of test_burst_cluster.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from tests.scheduler.placement_cluster_support import _restart_extender, api  # noqa: F401
from tests.scheduler.scheduling_cluster_support import ExtenderScheduler


def ledger_scheduler(core: Any, cluster: Any, tmp_path: Any, ns: str, scheduler: str,
                     nodes: dict[str, Any], write: Any) -> Iterator[dict[str, Any]]:  # fmt: skip
    """For a fixture (``yield from``): the namespace ``ns`` with its default ServiceAccount,
    ``nodes`` written by ``write(name, value)``, and a kube-scheduler ``scheduler`` whose
    extender (binpack, settle 600 s) fills the yielded ``ledger``; all removed afterwards.
    Yields {ns, nodes, sched, ledger, name}."""
    from omaticaya_py.scheduler.ledger import Ledger

    core.create_namespace({"metadata": {"name": ns}})
    core.create_namespaced_service_account(ns, {"metadata": {"name": "default"}})
    ledger = Ledger(600, 30)
    sched = None
    os.environ["OMATICAYA_EXTENDER_SCHEDULER_NAME"] = scheduler  # the pod watch's selector
    try:
        for name, value in nodes.items():
            write(name, value)
        sched = ExtenderScheduler(cluster, tmp_path, scheduler, "binpack", settle_s=600,
                                  serve_kw={"ledger": ledger})  # fmt: skip
        yield {"ns": ns, "nodes": nodes, "sched": sched, "ledger": ledger, "name": scheduler}
    finally:
        os.environ.pop("OMATICAYA_EXTENDER_SCHEDULER_NAME", None)
        if sched is not None:
            sched.close()
        for name in nodes:
            try:
                core.delete_node(name)
            except Exception:  # noqa: BLE001
                pass
        core.delete_namespace(ns)


def bound(core: Any, ns: str) -> dict[str, tuple[str, str]]:
    """{pod: (node, uid)} of the bound pods in ``ns``."""
    return {p.metadata.name: (p.spec.node_name, p.metadata.uid)
            for p in core.list_namespaced_pod(ns).items if p.spec.node_name}  # fmt: skip


def waiting_reason(core: Any, ns: str, pod: str) -> str:
    """Why ``pod`` is not scheduled ("" once bound, or not yet tried)."""
    p = core.read_namespaced_pod(pod, ns)
    if p.spec.node_name:
        return ""
    for c in p.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False":
            return c.message or ""
    return ""

"""What other test files share of test_placement_cluster.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.devcluster import DevCluster
from tests.scheduler.scheduling_cluster_support import (
    ExtenderScheduler,
)


@pytest.fixture(scope="module")
def api(scheduling_cluster: DevCluster, admin_api: Any) -> Any:
    """conftest's admin client, once the cluster runs kube-scheduler."""
    return admin_api


def _restart_extender(sched: ExtenderScheduler, **serve_kw: Any) -> None:
    """Stop the extender (the kube-scheduler keeps running) and start a new one on its port
    (``serve_kw``: more arguments of ``serve``, e.g. the ``ledger`` to fill)."""
    from omaticaya_py.scheduler.server import serve

    settings = sched_settings(sched)
    sched.stop_event.set()
    sched.thread.join(30)
    assert not sched.thread.is_alive(), "extender did not stop"
    sched.ready, sched.stop_event = threading.Event(), threading.Event()
    sched.thread = threading.Thread(
        target=serve, args=(settings,),
        kwargs={"ready": sched.ready, "stop": sched.stop_event, **serve_kw}, daemon=True,
    )  # fmt: skip
    sched.thread.start()
    assert sched.ready.wait(15), "extender did not restart"


def sched_settings(sched: ExtenderScheduler) -> Any:
    return sched.thread._args[0]  # type: ignore[attr-defined]  (the settings serve() runs with)

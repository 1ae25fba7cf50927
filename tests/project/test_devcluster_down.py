"""``scripts/dev-cluster down`` leaves no process behind: every daemon ``up`` started, and every
process in their process groups, is gone (a cluster of its own, not the session's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.devcluster import procs
from tests.devcluster import _run_script, start_dev_cluster

pytestmark = pytest.mark.cluster


def _group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def test_up_twice_then_down_leaves_no_process(tmp_path: Path) -> None:
    cluster = start_dev_cluster(tmp_path / "dc")
    try:
        started = cluster.state().procs
        assert set(started) == {"etcd", "apiserver"}
        assert all(procs.alive(p) for p in started.values())
        # up again: nothing restarted, the same export line
        assert _run_script(cluster.state_dir, "up").strip() == (
            f"export KUBECONFIG={cluster.state_dir.resolve()}/kubeconfig"
        )
        assert cluster.state().procs == started
        assert "status: up" in _run_script(cluster.state_dir, "status")
    finally:
        cluster.down()
    assert cluster.state().procs == {}
    for proc in started.values():
        assert not procs.alive(proc)
        assert not _group_alive(proc.pid)

"""The processes of ``bench/burst.py``: an ``omaticaya extender`` from any source tree, a
kube-scheduler of the dev cluster's release from that tree's example config, a pod watch that
times bindings, and a ``git worktree`` of a rev. Everything listens on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import ROOT, admin_api

__all__ = ["Watched", "start_extender", "start_scheduler", "stop", "watch_pods", "worktree"]

UNSCHEDULABLE = ("PodScheduled", "False", "Unschedulable")


@dataclass
class Watched:
    """What the pod watch saw: first time each pod was bound (monotonic s), the last
    Unschedulable message of each pod."""

    bound_at: dict[str, float] = field(default_factory=dict)
    reason: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def watch_pods(kubeconfig: str, ns: str, rv: str, seen: Watched, stop: threading.Event) -> None:
    """Watch the pods of ``ns`` from resource version ``rv`` into ``seen`` until ``stop`` is
    set (a thread's target; the watch is renewed every 5 s from the last version seen)."""
    from kubernetes import watch

    api = admin_api(kubeconfig)
    while not stop.is_set():
        w = watch.Watch()
        for ev in w.stream(api.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=5):
            pod, now = ev["object"], time.monotonic()
            rv = pod.metadata.resource_version
            with seen.lock:
                if pod.spec.node_name and pod.metadata.name not in seen.bound_at:
                    seen.bound_at[pod.metadata.name] = now
                for c in pod.status.conditions or []:
                    if (c.type, c.status, c.reason) == UNSCHEDULABLE:
                        seen.reason[pod.metadata.name] = c.message or ""
            if stop.is_set():
                w.stop()
    api.api_client.close()


def start_extender(tree: Path, kubeconfig: str, name: str, port: int, strategy: str,
                   tmp: Path) -> subprocess.Popen[bytes]:  # fmt: skip
    """``omaticaya extender`` from ``tree`` (its own interpreter, the tree first on the path,
    run from an empty dir: no ``.env``), configured through the environment only (every rev
    reads it); waits for ``/readyz`` (its Node cache synced)."""
    env = {k: val for k, val in os.environ.items() if not k.startswith("OMATICAYA_")}
    env.update(PYTHONPATH=str(tree), OMATICAYA_EXTENDER_PORT=str(port),
               OMATICAYA_EXTENDER_ADDRESS="127.0.0.1", OMATICAYA_PLACEMENT_POLICY=strategy,
               OMATICAYA_SETTLE_S="3600", OMATICAYA_EXTENDER_SCHEDULER_NAME=name,
               OMATICAYA_EXTENDER_KUBECONFIG=kubeconfig)  # fmt: skip
    cwd = tmp / f"{name}-cwd"
    cwd.mkdir()
    log_path = tmp / f"{name}-extender.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "omaticaya_py", "extender"], env=env,
                                cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)  # fmt: skip
    _wait_http(f"http://127.0.0.1:{port}/readyz", proc, f"extender {name}", log_path)
    return proc


def start_scheduler(kubeconfig: str, name: str, extender_port: int | None, tree: Path,
                    tmp: Path) -> subprocess.Popen[bytes]:  # fmt: skip
    """A kube-scheduler of the release under test (``devtools.devcluster.cluster.K8S_VERSION``,
    its cached binary) from ``tree``'s example configuration
    (``tests.scheduler.scheduling_cluster_support.scheduler_config``; the working tree's when ``tree``, an
    older rev, has none), the extender removed for stock, profile ``name``, leader election off;
    waits until its log says it started (it serves nothing)."""
    import yaml

    from tests.devcluster import DevCluster, scheduler_binary
    from tests.scheduler.scheduling_cluster_support import SCHEDULER_STARTED, scheduler_config

    try:
        config = scheduler_config(tree / "examples" / "scheduler")
    except FileNotFoundError as exc:
        print(f"(kube-scheduler {name}: {tree} has no {Path(exc.filename).name}: the working "
              "tree's)", file=sys.stderr, flush=True)  # fmt: skip
        config = scheduler_config()
    config["clientConnection"]["kubeconfig"] = kubeconfig
    config["leaderElection"] = {"leaderElect": False}
    config["profiles"][0]["schedulerName"] = name
    if extender_port is None:
        del config["extenders"]
    else:
        config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{extender_port}"
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    if not scheduler_binary().exists():
        subprocess.run([str(ROOT / "scripts" / "dev-cluster"), "build", "--scheduler"], check=True)
    # spawn_scheduler uses nothing of its cluster (the config names the kubeconfig)
    log = tmp / f"{name}.log"
    proc = DevCluster.spawn_scheduler(None, path, log)  # type: ignore[arg-type]
    _wait(lambda: SCHEDULER_STARTED in log.read_text(errors="replace"), proc,
          f"kube-scheduler {name}", log)  # fmt: skip
    return proc


def _wait_http(url: str, proc: subprocess.Popen[bytes], what: str, log: Path,
               timeout_s: float = 60) -> None:  # fmt: skip
    def ok() -> bool:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=1) as r:
                return bool(r.status == 200)
        return False

    _wait(ok, proc, what, log, timeout_s, f"{url} not ready")


def _wait(ready: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, log: Path,
          timeout_s: float = 60, never: str = "not started") -> None:  # fmt: skip
    """Until ``ready()``; raises when ``proc`` exits first (the tail of its ``log``) or after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = " | ".join(log.read_text(errors="replace").splitlines()[-3:])
            raise RuntimeError(f"{what} exited {proc.returncode}: {tail[-400:]}")
        if ready():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what}: {never} after {timeout_s:g} s")


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def worktree(rev: str, tmp: Path, key: str) -> tuple[Path, str]:
    """A detached ``git worktree`` of ``rev`` in ``tmp``; (its path, the full commit)."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    path = tmp / f"{key}-{sha[:10]}"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=ROOT, check=True,
                   capture_output=True)  # fmt: skip
    return path, sha

"""What other test files share of test_helm_install.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import waiting
from tests.devcluster import DevCluster, _run_script, start_dev_cluster
from tests.kubelet import kubelet_sock_in_use
from tests.tools import ToolUnavailable, helm_path, kubectl_path

REPO = Path(__file__).resolve().parents[2]


CHART = REPO / "charts" / "omaticaya"


NAMESPACE = "omaticaya"


RELEASE = "omaticaya"


PREFIX = "omaticaya.io/"


TRACE = "h100-trace.json"


#: bounds of the condition waits (generous for a loaded 2-core machine; never asserted on)
WAIT_S = float(os.environ.get("OMATICAYA_HELM_WAIT_S", "180"))


def wait_for(what: str, probe: Callable[[], Any], timeout: float = WAIT_S) -> Any:
    """``tests.waiting.wait_for`` every 0.5 s, up to ``timeout`` seconds, printing how long the
    wait took (the figures this module reports)."""
    start = time.monotonic()
    got = waiting.wait_for(what, probe, timeout_s=timeout, every_s=0.5)
    print(f"[helm-install] {what}: after {time.monotonic() - start:.1f} s")
    return got


@pytest.fixture(scope="module")
def tools() -> tuple[Path, Path]:
    try:
        return helm_path(), kubectl_path()
    except ToolUnavailable as exc:
        pytest.skip(f"helm/kubectl unavailable: {exc}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    if os.environ.get("OMATICAYA_SKIP_CLUSTER") == "1":
        pytest.skip("OMATICAYA_SKIP_CLUSTER=1: real cluster tests disabled")
    if os.uname().sysname != "Linux" or os.geteuid() != 0:
        pytest.skip(
            "the full dev cluster (kubelet, containerd, bridge, iptables) needs Linux and root"
        )
    if kubelet_sock_in_use():
        pytest.skip("another kubelet runs on this machine (one per machine)")
    # a short name: the DRA driver's registration socket lies 55 bytes below it, and a unix
    # socket's path is at most 107 (under pytest-xdist the folder gains "popen-gwN/")
    state_dir = tmp_path_factory.mktemp("fc")
    try:
        cluster = start_dev_cluster(state_dir, full=True)
    except BaseException:
        try:
            _run_script(state_dir, "down")
        except Exception:  # noqa: BLE001
            pass
        raise
    try:
        yield cluster
    finally:
        cluster.down()


class Kube:
    """The real helm and kubectl on the dev cluster, with a hermetic helm home."""

    def __init__(self, cluster: DevCluster, helm: Path, kubectl: Path, home: Path) -> None:
        self.cluster = cluster
        self.helm_bin, self.kubectl_bin = helm, kubectl
        self.env = dict(
            cluster.env(),
            HELM_CACHE_HOME=str(home / "cache"),
            HELM_CONFIG_HOME=str(home / "config"),
            HELM_DATA_HOME=str(home / "data"),
        )

    def run(
        self, *args: str, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        start = time.monotonic()
        proc = subprocess.run(
            [str(a) for a in args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if time.monotonic() - start > 2:
            shown = " ".join(Path(str(a)).name if i == 0 else str(a) for i, a in enumerate(args))
            print(f"[helm-install] {shown[:120]}: {time.monotonic() - start:.1f} s")
        if check and proc.returncode != 0:
            pytest.fail(
                f"{' '.join(map(str, args))} exited {proc.returncode}\n"
                f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\n{self.diagnostics()}"
            )
        return proc

    def helm(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run(self.helm_bin, *args, **kw)

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run(self.kubectl_bin, *args, **kw)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def pods(self, component: str = "node-agent") -> list[dict[str, Any]]:
        """The release's pods of ``component`` (the agents; ``uninstall-hook``: the hook's)."""
        return self.json(
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-l",
            f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}",
        )["items"]

    def hook_objects(self) -> list[str]:
        """The uninstall hook's objects still in the namespace (kind/name)."""
        out = self.kubectl(
            "-n",
            NAMESPACE,
            "get",
            "serviceaccounts,roles.rbac.authorization.k8s.io,"
            "rolebindings.rbac.authorization.k8s.io,jobs.batch",
            "-l",
            "app.kubernetes.io/component=uninstall-hook",
            "-o",
            "name",
        ).stdout
        return out.split()

    def node_labels(self, node: str) -> dict[str, str]:
        """Our labels, as ``kubectl get nodes --show-labels`` prints them."""
        out = self.kubectl("get", "nodes", node, "--show-labels", "--no-headers").stdout
        labels = out.split()[-1]
        pairs = dict(kv.split("=", 1) for kv in labels.split(",") if "=" in kv)
        return {k.removeprefix(PREFIX): v for k, v in pairs.items() if k.startswith(PREFIX)}

    def diagnostics(self) -> str:
        """Pods, events and the agent's log, for a failure message."""
        parts = []
        for args in (
            ("-n", NAMESPACE, "get", "ds,pods", "-o", "wide"),
            ("-n", NAMESPACE, "get", "events", "--sort-by=.lastTimestamp"),
            ("-n", NAMESPACE, "logs", "-l", f"app.kubernetes.io/instance={RELEASE}", "--tail=30"),
        ):
            proc = subprocess.run(
                [str(self.kubectl_bin), *args],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            parts.append(f"$ kubectl {' '.join(args)}\n{proc.stdout}{proc.stderr}")
        return "\n".join(parts)


def values_file(tmp: Path, cluster: DevCluster, node: str, **extra: Any) -> Path:
    repo, tag = cluster.agent_image.rsplit(":", 1)
    values = {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
        "trace": TRACE,
        "schedule": "@every 2s",
        # no GPU feature discovery here: drop the default nvidia.com/gpu.present selector and
        # pick the kubelet's Node, which carries the dev cluster's NoSchedule taint
        "nodeSelector": {"nvidia.com/gpu.present": None, "kubernetes.io/hostname": node},
        "tolerations": [
            {"key": "omaticaya.io/dev-kubelet", "operator": "Exists", "effect": "NoSchedule"}
        ],
        # readiness looked at every 2 s, not 10: helm --wait returns sooner (CI time); the
        # probes' paths and what they judge are the chart's
        "readinessProbe": {"initialDelaySeconds": 1, "periodSeconds": 2},
        **extra,
    }
    scheduler = values.get("scheduler")
    if isinstance(scheduler, dict):
        extender = scheduler.setdefault("extender", {})
        extender.setdefault("readinessProbe", {"initialDelaySeconds": 1, "periodSeconds": 2})
    path = tmp / f"values-{len(list(tmp.glob('values-*')))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path

"""Pod Security on a real cluster (issue 52, item 7): the chart's check reads the release
Namespace's ``pod-security.kubernetes.io/enforce`` label with ``lookup`` and refuses a level the
pods break, before anything is created; the API server's own PodSecurity admission (on by
default, the cluster's default level privileged) agrees.

On ``scripts/dev-cluster up --full`` (v1.37.2, a real kubelet on containerd 2), the whole-stack
goal (examples/install/whole-stack.yaml, the scheduler left off: the agent with its hostPath
volumes and the privileged ``mps`` container) in trace mode:

- a namespace labelled ``enforce: baseline``: ``helm install`` fails, its stderr naming the
  fields and the ``kubectl label`` command, and leaves no release and no object;
- ``helm install --dry-run=server`` (the same render, with ``lookup``): a namespace labelled
  ``restricted`` refuses the whole stack and admits the labels goal; ``warn`` and ``audit`` labels
  refuse nothing; a namespace that does not exist yet (``--create-namespace``) passes;
- ``helm template | kubectl apply`` into the baseline namespace, past the check: the API server
  admits the DaemonSets with a warning and rejects every pod (the DaemonSet's FailedCreate
  events), as docs/install.md says;
- a namespace labelled ``enforce: privileged``: ``helm install --wait`` deploys, the agent's and
  the mps pod go Ready, and NOTES say the level.

Every wait is on a condition. Needs Linux and root.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.helm_install_support import (  # noqa: F401 - cluster and tools are fixtures
    CHART,
    REPO,
    WAIT_S,
    Kube,
    cluster,
    tools,
    values_file,
    wait_for,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.kubelet]

INSTALL = REPO / "examples" / "install"
RELEASE = "omaticaya"
ENFORCE = "pod-security.kubernetes.io/enforce"
#: namespace -> its Pod Security labels
NAMESPACES = {
    "ps-privileged": {ENFORCE: "privileged"},
    "ps-baseline": {ENFORCE: "baseline"},
    "ps-restricted": {ENFORCE: "restricted"},
    "ps-warn": {"pod-security.kubernetes.io/warn": "restricted",
                "pod-security.kubernetes.io/audit": "restricted"},
}  # fmt: skip


def _values(cluster: Any, node: str, tmp: Path) -> list[str]:
    """The whole-stack goal on the dev node: 8 recorded H100s, the dev kubelet's PodResources
    socket, no second scheduler."""
    socket = cluster.state_dir / "kubelet" / "root" / "pod-resources" / "kubelet.sock"
    dev = values_file(tmp, cluster, node, trace="multi-gpu-trace.json",
                      podResourcesSocket=str(socket), scheduler={"enabled": False})  # fmt: skip
    return ["-f", str(INSTALL / "whole-stack.yaml"), "-f", str(dev)]


def _install(kube: Kube, ns: str, files: list[str], *extra: str):
    return kube.helm("install", RELEASE, str(CHART), "-n", ns, *files, *extra, check=False)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _ready(kube: Kube, ns: str, component: str) -> bool:
    pods = kube.json("-n", ns, "get", "pods", "-l", f"app.kubernetes.io/component={component}")
    return any(
        p["metadata"].get("deletionTimestamp") is None
        and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}])
        for p in pods["items"]
    )


def test_baseline_refuses_privileged_installs_and_says_how(cluster, tools, tmp_path):
    helm, kubectl = tools
    node = cluster.start_full()
    kube = Kube(cluster, helm, kubectl, tmp_path / "helm")
    files = _values(cluster, node, tmp_path)
    for ns, labels in NAMESPACES.items():
        kube.kubectl("create", "namespace", ns)
        kube.kubectl("label", "namespace", ns, *(f"{k}={v}" for k, v in labels.items()))
    try:
        # --- enforce: baseline: helm install refuses before it creates anything
        refused = _install(kube, "ps-baseline", files, "--wait", "--timeout", "60s")
        err = _flat(refused.stderr)
        assert refused.returncode != 0, refused.stdout
        for words in (
            'namespace ps-baseline enforces Pod Security "baseline"',
            "this release's pods need \"privileged\"",
            "DaemonSet omaticaya: hostPath volumes mps-state (/run/omaticaya-mps-state), "
            "device-plugins (/var/lib/kubelet/device-plugins)",
            "DaemonSet omaticaya-mps: hostPath volumes mps-state (/run/omaticaya-mps-state), "
            "mps-host (/run); privileged container mps",
            f"kubectl label namespace ps-baseline {ENFORCE}=privileged --overwrite",
        ):
            assert words in err, err
        assert kube.helm("list", "-n", "ps-baseline", "-q").stdout.strip() == ""
        assert kube.kubectl("-n", "ps-baseline", "get", "all,serviceaccounts,roles", "-o", "name",
                            "-l", f"app.kubernetes.io/instance={RELEASE}").stdout.strip() == ""  # fmt: skip

        # --- the same render with lookup, nothing created
        strict = _install(kube, "ps-restricted", files, "--dry-run=server")
        assert strict.returncode != 0 and "container agent runAsUser 0" in _flat(strict.stderr)
        # the labels goal on its own values (no PodResources socket: that one is a hostPath)
        labels_goal = ["-f", str(INSTALL / "labels.yaml"), "-f", str(values_file(tmp_path, cluster, node))]
        assert _install(kube, "ps-restricted", labels_goal, "--dry-run=server").returncode == 0
        warned = _install(kube, "ps-warn", files, "--dry-run=server")
        assert warned.returncode == 0, warned.stderr
        absent = _install(kube, "ps-absent", files, "--dry-run=server", "--create-namespace")
        assert absent.returncode == 0, absent.stderr

        _apply_past_the_check(kube, files, tmp_path)

        # --- enforce: privileged: installed, the agent and the mps pod Ready
        out = kube.helm("install", RELEASE, str(CHART), "-n", "ps-privileged", *files,
                        "--wait", "--timeout", f"{int(WAIT_S)}s").stdout  # fmt: skip
        assert "STATUS: deployed" in out
        assert 'these pods need the level "privileged" in namespace ps-privileged' in _flat(out)
        wait_for("the agent's pod Ready", lambda: _ready(kube, "ps-privileged", "node-agent"))
        wait_for("the mps pod Ready", lambda: _ready(kube, "ps-privileged", "mps"))
        kube.helm("uninstall", RELEASE, "-n", "ps-privileged", "--wait", "--timeout", f"{int(WAIT_S)}s")
    finally:
        for ns in NAMESPACES:
            kube.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False)


def _apply_past_the_check(kube: Kube, files: list[str], tmp: Path) -> None:
    """``helm template | kubectl apply`` into the baseline namespace (the ServiceAccount and the
    two DaemonSets): admitted with the API server's warning, every pod rejected."""
    rendered = kube.helm("template", RELEASE, str(CHART), "-n", "ps-baseline", *files).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in ("ServiceAccount", "DaemonSet")
            and "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]  # fmt: skip
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == "DaemonSet") == [
        "omaticaya", "omaticaya-mps"]  # fmt: skip
    path = tmp / "past-the-check.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    applied = kube.kubectl("apply", "-f", str(path))
    warning = _flat(applied.stderr)
    assert 'would violate PodSecurity "baseline:latest": hostPath volumes' in warning, warning
    assert 'privileged (container "mps" must not set securityContext.privileged=true)' in warning

    def rejected() -> dict[str, str]:
        events = kube.json("-n", "ps-baseline", "get", "events")["items"]
        return {e["involvedObject"]["name"]: _flat(e["message"]) for e in events
                if e.get("reason") == "FailedCreate" and "violates PodSecurity" in e["message"]}  # fmt: skip

    seen = wait_for("both DaemonSets' pods rejected", lambda: len(rejected()) == 2 and rejected())
    print(json.dumps(seen, indent=1))
    assert 'violates PodSecurity "baseline:latest": hostPath volumes' in seen["omaticaya"]
    assert "privileged" in seen["omaticaya-mps"]
    assert kube.json("-n", "ps-baseline", "get", "pods")["items"] == []
    kube.kubectl("delete", "-f", str(path), "--wait=true", "--timeout=120s")

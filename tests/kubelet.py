"""The dev cluster's real kubelet for a test module: one per machine (v1.20 always serves its
device-plugin registration socket at the same path)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.devcluster import DevCluster

__all__ = [
    "IMAGE",
    "PLUGIN_DIR",
    "default_service_account",
    "delete_pods",
    "kubelet_node",
    "kubelet_pod",
    "kubelet_sock_in_use",
    "stop_plugin",
]

PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
#: the busybox image the dev cluster imports into its containerd (never pulled)
IMAGE = "omaticaya.local/busybox:1"


def kubelet_sock_in_use() -> bool:
    """True when some kubelet answers on ``PLUGIN_DIR/kubelet.sock``."""
    path = PLUGIN_DIR / "kubelet.sock"
    if not path.exists():
        return False
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def kubelet_node(dev_cluster: DevCluster) -> Iterator[str]:
    """For a module-scoped fixture (``yield from kubelet_node(dev_cluster)``): skip, saying why,
    unless this machine can run the kubelet (Linux, root, no other kubelet); start it, yield its
    Node's name, stop it afterwards."""
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("the kubelet needs Linux and root (cgroups, mounts, /var/lib/kubelet)")
    if kubelet_sock_in_use():
        pytest.skip(f"another kubelet serves {PLUGIN_DIR}/kubelet.sock (one per machine)")
    node = dev_cluster.start_kubelet()
    try:
        yield node
    finally:
        dev_cluster.kubelet_down()


def stop_plugin(proc: subprocess.Popen) -> int:
    """SIGTERM a device-plugin process and return its exit status (-9 when it had to be killed
    after 10 s)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            return -9
    return proc.returncode


def default_service_account(admin_api: Any) -> None:
    """Create the ``default`` ServiceAccount in ``default`` (no controller-manager makes it in
    the dev cluster; the apiserver refuses pods without it); one already there is fine."""
    from kubernetes.client.exceptions import ApiException

    try:
        admin_api.create_namespaced_service_account("default", {"metadata": {"name": "default"}})
    except ApiException as exc:
        if exc.status != 409:
            raise


def kubelet_pod(
    name: str,
    node: str,
    script: str,
    limits: dict[str, str],
    out: Path,
    *,
    labels: dict[str, str] | None = None,
    container: str = "c",
    host_pid: bool = False,
    out_type: str = "DirectoryOrCreate",
) -> dict[str, Any]:
    """A pod bound to the kubelet's ``node`` (no scheduler), on the host network, running
    ``script`` in ``/bin/sh -c`` with ``limits`` (extended resources), its ``/out`` the host
    folder ``out`` (``out_type``: the hostPath type); ``host_pid`` shares the host's PIDs."""
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = labels
    spec: dict[str, Any] = {"nodeName": node, "hostNetwork": True}
    if host_pid:
        spec["hostPID"] = True
    spec.update(
        {
            "automountServiceAccountToken": False,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": container,
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                    "resources": {"limits": limits},
                    "volumeMounts": [{"name": "out", "mountPath": "/out"}],
                }
            ],
            "volumes": [{"name": "out", "hostPath": {"path": str(out), "type": out_type}}],
        }
    )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def delete_pods(admin_api: Any, names: list[str]) -> None:
    """Delete the pods ``names`` in ``default`` at once (grace 0); gone ones are fine."""
    from kubernetes.client.exceptions import ApiException

    for name in names:
        try:
            admin_api.delete_namespaced_pod(name, "default", grace_period_seconds=0)
        except ApiException:
            pass

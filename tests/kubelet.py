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

import pytest

from tests.devcluster import DevCluster

__all__ = ["PLUGIN_DIR", "kubelet_node", "kubelet_sock_in_use", "stop_plugin"]

PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")


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
        pytest.skip(f"another kubelet serves {PLUGIN_DIR}/kubelet.sock (one per machine in 1.20)")
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

"""Bad input in the environment and on the command line: each value gets a one-line error naming
the variable (or flag) and the expected form, exit status 2, no traceback, and nothing is sent
to the API server."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from omaticaya_py.extender import load_extender_settings
from omaticaya_py.settings import SettingsError, load_settings
from tests.conftest import H100_TRACE, node_metadata

OWN = "expected a prefix this agent owns, like 'omaticaya.io'"

# (prefix, refused)
PREFIXES = [
    ("nvidia.com", True),  # GPU Feature Discovery's labels, the device plugin's resource
    ("gpu.nvidia.com", True),
    ("kubernetes.io", True),  # kubernetes.io/hostname, arch, os
    ("node.kubernetes.io", True),  # node.kubernetes.io/instance-type
    ("feature.node.kubernetes.io", True),  # node-feature-discovery
    ("k8s.io", True),
    ("node-role.k8s.io", True),
    ("NVIDIA.com/", True),  # case and a trailing slash do not get around it
    ("omaticaya.io", False),
    ("gpu.example.com", False),
    ("nvidia.community", False),  # not under nvidia.com
    ("mykubernetes.io", False),  # not under kubernetes.io
]


@pytest.mark.parametrize(("prefix", "refused"), PREFIXES, ids=[p for p, _ in PREFIXES])
def test_well_known_prefixes_are_refused(monkeypatch, prefix, refused):
    for load, var in ((load_settings, "OMATICAYA_PREFIX"), (load_extender_settings, "OMATICAYA_EXTENDER_PREFIX")):
        monkeypatch.setenv(var, prefix)
        if not refused:
            assert load().prefix == prefix.strip().rstrip("/")
            continue
        with pytest.raises(SettingsError) as err:
            load()
        line = str(err.value)
        assert "\n" not in line and line.startswith(f"invalid setting {var}={prefix!r}: {OWN}")
        monkeypatch.delenv(var)


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OMATICAYA_") and k != "NODE_NAME"}
    return subprocess.run(
        [sys.executable, "-m", "omaticaya_py", *args],
        env={**base, **env}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.cluster
def test_cleanup_with_a_foreign_prefix_exits_2_and_removes_nothing(dev_cluster, admin_api, make_node):
    node = make_node({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    before = node_metadata(admin_api, node)
    kc = str(dev_cluster.kubeconfig)
    for args, env, named in (
        (("cleanup", "--prefix", "nvidia.com"), {}, "--prefix='nvidia.com'"),
        (("cleanup",), {"OMATICAYA_PREFIX": "kubernetes.io"}, "OMATICAYA_PREFIX='kubernetes.io'"),
        (("once", "--trace", str(H100_TRACE), "--prefix", "node.kubernetes.io"), {},
         "--prefix='node.kubernetes.io'"),
    ):  # fmt: skip
        done = cli(*args, "--node", node, "--kubeconfig", kc, **env)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and named in lines[0] and OWN in lines[0], done.stderr
    assert node_metadata(admin_api, node) == before

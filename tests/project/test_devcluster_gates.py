"""The dev cluster's feature gates and API versions per release (devtools/devcluster/cluster.py):
what docs/dra.md tells a user of each release to turn on, and nothing elsewhere."""

from __future__ import annotations

import pytest

from devtools.devcluster.cluster import (
    DRA_ALPHA_GATES,
    feature_gate_flags,
    feature_gates,
    runtime_config_flags,
)


@pytest.mark.parametrize(("version", "gates", "runtime_config"), [
    ("v1.31.0", False, False),  # no resource.k8s.io/v1 yet: nothing of DRA's newer features
    ("v1.33.9", False, False),
    ("v1.34.4", True, True),  # DRA GA, its newer features alpha: gates, and DeviceTaintRule's v1alpha3
    ("v1.35.0", True, True),
    ("v1.36.0", False, False),  # beta, on by default
    ("v1.37.2", False, False),
])  # fmt: skip
def test_gates_and_api_versions_by_release(version, gates, runtime_config):
    assert feature_gates(version) == (dict.fromkeys(DRA_ALPHA_GATES, True) if gates else {})
    assert bool(feature_gate_flags(version)) is gates
    if gates:
        assert feature_gate_flags(version) == ["--feature-gates=" + ",".join(f"{g}=true" for g in DRA_ALPHA_GATES)]
    # a kube-scheduler with DRADeviceTaints on lists DeviceTaintRules: without the API version
    # it waits for that informer and schedules nothing (seen on v1.34.4)
    assert runtime_config_flags(version) == (["--runtime-config=resource.k8s.io/v1alpha3=true"] if runtime_config else [])

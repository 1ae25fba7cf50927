"""The chart's ``trace`` value: replay a recorded trace from the image instead of NVML.

Empty (the default): real NVML, with the NVIDIA runtime variables. A file name: the DaemonSet
sets ``OMATICAYA_TRACE=/opt/omaticaya/traces/<file>`` and asks nothing of the NVIDIA runtime.
The schema takes a plain ``*.json`` file name only (no path), and every trace the values.yaml
comment names is one the Dockerfile (and scripts/build-image) puts in the image.
tests/charts/test_helm_install.py runs it for real.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml

from tests.chart import CHART, REPO, run_helm


def render(helm, *sets: str) -> subprocess.CompletedProcess[str]:
    """``helm template`` at Kubernetes 1.31.0 (the oldest supported) with ``--set`` each of
    ``sets`` (not checked)."""
    args = ["template", "omaticaya", str(CHART), "-n", "omaticaya", "--kube-version", "1.31.0"]
    for s in sets:
        args += ["--set", s]
    return run_helm(helm, *args, check=False)


def agent_env(helm, *sets: str) -> dict[str, Any]:
    proc = render(helm, *sets)
    assert proc.returncode == 0, proc.stderr
    (ds,) = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "DaemonSet"]
    (agent,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    return {e["name"]: e.get("value") for e in agent["env"]}


def test_default_reads_nvml_under_the_nvidia_runtime(helm):
    env = agent_env(helm)
    assert "OMATICAYA_TRACE" not in env
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


@pytest.mark.parametrize("name", ["h100-trace.json", "h100-mig-trace.json", "multi-gpu-trace.json"])
def test_trace_replays_a_file_from_the_image(helm, name):
    env = agent_env(helm, f"trace={name}")
    assert env["OMATICAYA_TRACE"] == f"/opt/omaticaya/traces/{name}"
    assert "NVIDIA_VISIBLE_DEVICES" not in env and "NVIDIA_DRIVER_CAPABILITIES" not in env
    # nothing else changes: the same settings are rendered
    default = agent_env(helm)
    assert set(env) - {"OMATICAYA_TRACE"} == set(default) - {
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
    }


@pytest.mark.parametrize(
    "bad", ["../../etc/passwd.json", "/tmp/x.json", "traces/h100-trace.json", "h100", ".json"]
)
def test_schema_takes_a_file_name_only(helm, bad):
    proc = render(helm, f"trace={bad}")
    assert proc.returncode != 0, f"trace={bad} rendered"
    assert "trace" in proc.stderr, proc.stderr


def test_the_traces_values_yaml_names_are_in_the_image():
    text = (CHART / "values.yaml").read_text()
    block = text[text.index("Try the chart without a GPU") : text.index('trace: ""')]
    named = set(re.findall(r"[\w.-]+-trace\.json", block))
    dockerfile = (REPO / "Dockerfile").read_text()
    copied = set(re.findall(r"tests/data/([\w.-]+-trace\.json)", dockerfile))
    assert named and named == copied, (named, copied)
    for name in named:
        assert (REPO / "tests" / "data" / name).is_file(), name

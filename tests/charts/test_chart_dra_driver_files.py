"""The chart's side of the DRA driver's files (issue 52, item 9; docs/dra.md, "The driver's files,
without the nvidia runtime"): ``dra.driverFiles`` (default true) and the host's ``driverRoot``.

Rendered by the real helm (``tests/chart.py``): with DRA on, the host's ``driverRoot`` mounted
read-only at ``/host/driver-root`` with ``mountPropagation: HostToContainer`` (a hostPath
``DirectoryOrCreate``: the GPU Operator's ``/run/nvidia/driver`` may come later),
``OMATICAYA_DRA_DRIVER_FILES``, ``OMATICAYA_DRA_DRIVER_ROOT=/host/driver-root`` and
``OMATICAYA_DRA_DRIVER_HOST_ROOT=<driverRoot>``, loaded by the agent's Settings; with
``dra.driverFiles: false`` or DRA off, no mount and the code's defaults; the schema refuses a
non-boolean; the Pod Security check names the new hostPath volume.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    agent_container,
    agent_daemonset,
    chart_settings,
    env_of,
    render,
    run_helm,
    template,
    values_args,
)

KUBE = "1.37.0"
GPU_OPERATOR = "/run/nvidia/driver"
MOUNT = "/host/driver-root"
VARS = ("OMATICAYA_DRA_DRIVER_FILES", "OMATICAYA_DRA_DRIVER_ROOT", "OMATICAYA_DRA_DRIVER_HOST_ROOT")


def docs_of(helm: dict[str, Any], values: dict[str, Any] | None) -> list[dict]:
    return render(helm, values, "--kube-version", KUBE)


def dra(driver_files: bool | None = None, **more: Any) -> dict[str, Any]:
    block: dict[str, Any] = {"enabled": True}
    if driver_files is not None:
        block["driverFiles"] = driver_files
    return {"dra": block, **more}


def driver_root_mount(docs: list[dict]) -> tuple[dict | None, dict | None]:
    """The agent container's mount and the pod's volume named dra-driver-root (None: absent)."""
    spec = agent_daemonset(docs)["spec"]["template"]["spec"]
    mount = [m for m in agent_container(docs).get("volumeMounts") or [] if m["name"] == "dra-driver-root"]
    volume = [v for v in spec["volumes"] if v["name"] == "dra-driver-root"]
    return (mount[0] if mount else None), (volume[0] if volume else None)


def driver_env(docs: list[dict]) -> tuple[str, ...]:
    env = env_of(docs)
    return tuple(env[name] for name in VARS)


@pytest.mark.parametrize(
    ("driver_root", "host_path"),
    [(None, "/"), (GPU_OPERATOR, GPU_OPERATOR), ("/opt/nvidia-root", "/opt/nvidia-root")],
    ids=["host-driver", "gpu-operator", "elsewhere"],
)
def test_dra_mounts_the_driver_root_read_only(helm, driver_root, host_path):
    values = dra() if driver_root is None else dra(driverRoot=driver_root)
    docs = docs_of(helm, values)
    mount, volume = driver_root_mount(docs)
    assert mount == {"name": "dra-driver-root", "mountPath": MOUNT, "readOnly": True,
                     "mountPropagation": "HostToContainer"}  # fmt: skip
    assert volume == {"name": "dra-driver-root",
                      "hostPath": {"path": host_path, "type": "DirectoryOrCreate"}}  # fmt: skip
    assert driver_env(docs) == ("true", MOUNT, host_path)


@pytest.mark.parametrize(
    "values",
    [None, {"driverRoot": GPU_OPERATOR}, dra(False), dra(False, driverRoot=GPU_OPERATOR)],
    ids=["dra-off", "dra-off-gpu-operator", "driverFiles-false", "driverFiles-false-gpu-operator"],
)
def test_no_mount_without_dra_or_driver_files(helm, values):
    """Nothing of the host's driver root is mounted; the variables are the code's defaults
    (``/``: nothing reads them), OMATICAYA_DRA_DRIVER_FILES the value."""
    docs = docs_of(helm, values)
    assert driver_root_mount(docs) == (None, None)
    files = "false" if values and values.get("dra", {}).get("driverFiles") is False else "true"
    assert driver_env(docs) == (files, "/", "/")


def test_the_rendered_env_loads_into_settings(helm, monkeypatch, tmp_path):
    settings = chart_settings(env_of(docs_of(helm, dra(driverRoot=GPU_OPERATOR))), monkeypatch, tmp_path)
    assert settings.dra_driver_files is True
    assert settings.dra_driver_root == Path(MOUNT)
    assert settings.dra_driver_host_root == Path(GPU_OPERATOR)
    off = chart_settings(env_of(docs_of(helm, dra(False))), monkeypatch, tmp_path)
    assert off.dra_driver_files is False


@pytest.mark.parametrize("bad", ["yes", "true", 1, None])
def test_schema_refuses_a_non_boolean(helm, bad):
    proc = template(helm, dra(bad) if bad is not None else {"dra": {"enabled": True, "driverFiles": None}},
                    "--kube-version", KUBE, check=False)  # fmt: skip
    if bad is None:  # helm drops a null value: the default stays
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert "/dra/driverFiles" in proc.stderr, proc.stderr


def test_pod_security_check_names_the_driver_root(helm, tmp_path):
    """A namespace enforcing baseline: the chart's own refusal (omaticaya.podSecurityRefusal,
    fed the Namespace's labels in a copy of the chart, as tests/charts/test_chart_pod_security.py
    does) names the new hostPath volume with its host path."""
    chart = Path(shutil.copytree(CHART, tmp_path / "omaticaya"))
    (chart / "templates" / "zz-probe.yaml").write_text(
        '{{ include "omaticaya.podSecurityRefusal" (dict "top" . "labels" '
        '(dict "pod-security.kubernetes.io/enforce" "baseline")) }}\n'
    )
    proc = run_helm(helm, "template", RELEASE, str(chart), "--namespace", NAMESPACE,
                    "--kube-version", KUBE, *values_args(helm, dra(driverRoot=GPU_OPERATOR)),
                    "--show-only", "templates/zz-probe.yaml", check=False)  # fmt: skip
    assert proc.returncode != 0
    said = " ".join(proc.stderr.split())
    assert f"dra-driver-root ({GPU_OPERATOR})" in said, said

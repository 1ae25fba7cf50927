"""The chart's MPS supervisor (issue 39): with the device plugin on, some GPUs shared and
``sharing.enforcement: mps`` the DaemonSet gets a second container ``mps`` (``omaticaya mps``):
privileged, the host folder two levels above ``sharing.mps.root`` mounted at ``/host<folder>``
with Bidirectional propagation (``OMATICAYA_MPS_HOST_ROOT``; the supervisor binds the root at its
own path in the container's /run, an emptyDir), the
``mps-state`` emptyDir shared with the agent (read-only there), its readiness probe on /readyz,
the NVIDIA runtime's compute capability unless a trace is replayed. The agent gets the
enforcement settings in every case. Helpers: tests/chart.py; the same on a real kubelet:
tests/test_mps_cluster.py.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.chart import (
    CHART,
    K8S_VERSION,
    NAMESPACE,
    RELEASE,
    agent_container,
    chart_settings,
    env_of,
    mps_container,
    one,
    render,
    run_helm,
    template,
    values_args,
)

SHARED = {"devicePlugin": True, "sharing": {"gpus": "0-1"}}
STATE_DIR = "/var/lib/omaticaya/mps-state"


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container.get("volumeMounts") or []}


def _volumes(docs: list[dict]) -> dict[str, dict[str, Any]]:
    spec = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return {v["name"]: v for v in spec["volumes"]}


def _with(**extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"devicePlugin": True, "sharing": {"gpus": "0-1"}}
    for key, value in extra.items():
        if key == "sharing":
            values["sharing"] = {**values["sharing"], **value}
        else:
            values[key] = value
    return values


@pytest.mark.parametrize(
    "values",
    [
        None,
        {"devicePlugin": True},
        {"sharing": {"gpus": "all"}},
        {"devicePlugin": True, "sharing": {"gpus": "all", "enforcement": "none"}},
    ],
    ids=["default", "plugin-no-sharing", "sharing-no-plugin", "enforcement-none"],
)
def test_no_mps_container_unless_plugin_sharing_and_mps(helm, values):
    docs = render(helm, values)
    assert mps_container(docs) is None
    assert not {"mps-state", "mps-host", "mps-run"} & set(_volumes(docs))
    assert "mps-state" not in _mounts(agent_container(docs))


def test_agent_gets_the_enforcement_settings_even_without_mps(helm, monkeypatch, tmp_path):
    """Rendered in every case, so that the code's default (mps) never surprises; they load."""
    env = env_of(render(helm))
    assert env["OMATICAYA_SHARE_ENFORCEMENT"] == "mps"
    assert env["OMATICAYA_MPS_ROOT"] == "/run/omaticaya/mps"
    assert env["OMATICAYA_MPS_STATE_DIR"] == STATE_DIR
    assert env["OMATICAYA_MPS_THREAD_SHARE"] == "false"
    assert env["OMATICAYA_MPS_STALE_S"] == "15"
    values = _with(sharing={"enforcement": "none",
                            "mps": {"root": "/srv/gpu/mps", "threadShare": True, "checkS": 10}})  # fmt: skip
    s = chart_settings(env_of(render(helm, values)), monkeypatch, tmp_path)
    assert s.share_enforcement == "none"
    assert str(s.mps_root) == "/srv/gpu/mps"
    assert str(s.mps_state_dir) == STATE_DIR
    assert s.mps_thread_share is True
    assert s.mps_stale_s == 35  # 3 x 10 + 5


@pytest.mark.parametrize(("check_s", "stale"), [(2, "15"), (0.5, "15"), (4, "17"), (2.5, "15")])
def test_stale_bound_follows_the_check_period(helm, check_s, stale):
    env = env_of(render(helm, _with(sharing={"mps": {"checkS": check_s}})))
    assert env["OMATICAYA_MPS_STALE_S"] == stale
    assert _env(mps_container(render(helm, _with(sharing={"mps": {"checkS": check_s}}))))[
        "OMATICAYA_MPS_CHECK_S"
    ] == str(check_s)


def test_mps_container_with_a_gpu(helm):
    docs = render(helm, SHARED)
    agent, mps = agent_container(docs), mps_container(docs)
    assert mps is not None
    assert mps["args"] == ["mps"]
    assert mps["image"] == agent["image"] and mps["imagePullPolicy"] == agent["imagePullPolicy"]
    env = _env(mps)
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        # the NVIDIA runtime injects the MPS binaries only with compute
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "OMATICAYA_SHARED_GPUS": "0-1",
        "OMATICAYA_SHARE_UNIT_MIB": "1024",
        "OMATICAYA_SHARE_ENFORCEMENT": "mps",
        "OMATICAYA_MPS_ROOT": "/run/omaticaya/mps",
        "OMATICAYA_MPS_STATE_DIR": STATE_DIR,
        "OMATICAYA_MPS_HOST_ROOT": "/host/run/omaticaya/mps",
        "OMATICAYA_MPS_CONTROL": "nvidia-cuda-mps-control",
        "OMATICAYA_MPS_CHECK_S": "2",
        "OMATICAYA_MPS_SHM_MIB": "1024",
        "OMATICAYA_MPS_METRICS_PORT": "9403",
        "OMATICAYA_LOG_JSON": "true",
        "OMATICAYA_LOG_LEVEL": "INFO",
    }
    # the names it shares with the agent carry the same values
    agent_env = _env(agent)
    for name in ("OMATICAYA_SHARED_GPUS", "OMATICAYA_SHARE_UNIT_MIB", "OMATICAYA_SHARE_ENFORCEMENT",
                 "OMATICAYA_MPS_ROOT", "OMATICAYA_MPS_STATE_DIR"):  # fmt: skip
        assert env[name] == agent_env[name], name
    assert mps["ports"] == [{"name": "mps-metrics", "containerPort": 9403, "protocol": "TCP"}]
    probe = mps["readinessProbe"]
    assert probe["httpGet"] == {"path": "/readyz", "port": "mps-metrics"}
    assert "livenessProbe" not in mps  # a restart would kill every client's GPU context
    assert "resources" not in mps


def test_mps_container_replaying_a_trace_uses_the_stand_in(helm):
    docs = render(helm, _with(trace="multi-gpu-trace.json"))
    env = _env(mps_container(docs))
    assert env["OMATICAYA_TRACE"] == "/opt/omaticaya/traces/multi-gpu-trace.json"
    assert env["OMATICAYA_MPS_CONTROL"] == "/opt/omaticaya/standin/nvidia-cuda-mps-control"
    assert "NVIDIA_VISIBLE_DEVICES" not in env and "NVIDIA_DRIVER_CAPABILITIES" not in env
    # a control binary set by the user wins, trace or not
    docs = render(helm, _with(trace="multi-gpu-trace.json",
                              sharing={"mps": {"control": "/usr/local/bin/mps-control"}}))  # fmt: skip
    assert _env(mps_container(docs))["OMATICAYA_MPS_CONTROL"] == "/usr/local/bin/mps-control"


def test_mps_container_is_privileged_and_the_agent_is_not(helm):
    docs = render(helm, SHARED)
    sc = mps_container(docs)["securityContext"]
    assert sc["privileged"] is True
    assert (sc["runAsUser"], sc["runAsNonRoot"]) == (0, False)
    assert sc.get("allowPrivilegeEscalation") is not False  # the API refuses it with privileged
    agent = agent_container(docs)["securityContext"]
    assert not agent.get("privileged") and agent["allowPrivilegeEscalation"] is False
    assert agent["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize(
    ("root", "host_dir"),
    [("/run/omaticaya/mps", "/run"), ("/srv/gpu/omaticaya/mps", "/srv/gpu")],
)  # fmt: skip
def test_the_host_folder_two_levels_up_is_mounted_under_host(helm, root, host_dir):
    """The supervisor creates the root and its parent itself and removes them (helm uninstall
    leaves no folder); its tmpfs reaches the host (Bidirectional); the host folder is not at its
    own path (the NVIDIA runtime's mounts under /run would propagate back to the host): the
    supervisor binds the host's root at the root's path in the container's own /run (an
    emptyDir, which keeps the ServiceAccount token, /var/run, in the pod), so the daemons' pipe
    folders have the clients' paths."""
    docs = render(helm, _with(sharing={"mps": {"root": root}}))
    mounts, volumes = _mounts(mps_container(docs)), _volumes(docs)
    assert mounts["mps-host"] == {"name": "mps-host", "mountPath": "/host" + host_dir,
                                  "mountPropagation": "Bidirectional"}  # fmt: skip
    assert volumes["mps-host"]["hostPath"] == {"path": host_dir, "type": "Directory"}
    assert mounts["mps-run"]["mountPath"] == "/run" and "emptyDir" in volumes["mps-run"]
    env = _env(mps_container(docs))
    assert env["OMATICAYA_MPS_ROOT"] == root
    assert env["OMATICAYA_MPS_HOST_ROOT"] == "/host" + root
    # only the host folder's mount propagates
    assert [n for n, m in mounts.items() if m.get("mountPropagation")] == ["mps-host"]


def test_state_volume_is_shared_read_only_in_the_agent(helm):
    docs = render(helm, SHARED)
    agent, mps = _mounts(agent_container(docs)), _mounts(mps_container(docs))
    assert agent["mps-state"] == {"name": "mps-state", "mountPath": STATE_DIR, "readOnly": True}
    assert mps["mps-state"]["mountPath"] == STATE_DIR and not mps["mps-state"].get("readOnly")
    assert "emptyDir" in _volumes(docs)["mps-state"]
    # the agent mounts no host folder of MPS: it only hands the paths out
    assert not {"mps-host", "mps-run"} & set(agent)


def test_mps_values_reach_the_container(helm):
    values = _with(sharing={"unitMib": 2048, "mps": {
        "shmMib": 0, "metricsPort": 9500, "resources": {"limits": {"memory": "256Mi"}}}})  # fmt: skip
    mps = mps_container(render(helm, values))
    env = _env(mps)
    assert (env["OMATICAYA_MPS_SHM_MIB"], env["OMATICAYA_MPS_METRICS_PORT"]) == ("0", "9500")
    assert env["OMATICAYA_SHARE_UNIT_MIB"] == "2048"
    assert mps["ports"][0]["containerPort"] == 9500
    assert mps["resources"] == {"limits": {"memory": "256Mi"}}


def test_rendered_daemonset_validates(helm):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for values in (SHARED, _with(trace="multi-gpu-trace.json")):
        kubernetes_validate.validate(one(render(helm, values), "DaemonSet"), K8S_VERSION,
                                     strict=True)  # fmt: skip


BAD = [
    ("enforcement", {"sharing": {"enforcement": "hami"}}, "/sharing/enforcement"),
    ("root-relative", {"sharing": {"mps": {"root": "run/omaticaya/mps"}}}, "/sharing/mps/root"),
    ("root-shallow", {"sharing": {"mps": {"root": "/run/mps"}}}, "/sharing/mps/root"),
    ("root-dotdot", {"sharing": {"mps": {"root": "/run/../etc/mps"}}}, "/sharing/mps/root"),
    ("shmMib-negative", {"sharing": {"mps": {"shmMib": -1}}}, "/sharing/mps/shmMib"),
    ("checkS-zero", {"sharing": {"mps": {"checkS": 0}}}, "/sharing/mps/checkS"),
    ("metricsPort-zero", {"sharing": {"mps": {"metricsPort": 0}}}, "/sharing/mps/metricsPort"),
    (
        "threadShare-string",
        {"sharing": {"mps": {"threadShare": "yes"}}},
        "/sharing/mps/threadShare",
    ),
    ("unknown-key", {"sharing": {"mps": {"pipe": "/tmp"}}}, "pipe"),
]


@pytest.mark.parametrize(("values", "where"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_schema_rejects_bad_mps_values(helm, values, where):
    proc = template(helm, values, check=False)
    assert proc.returncode != 0, f"helm template accepted {values}"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert where in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("values", "says"),
    [
        (_with(trace="multi-gpu-trace.json"),
         ["GPUs 0-1", "enforced by CUDA MPS", "container mps", "omaticaya top"]),
        (_with(sharing={"enforcement": "none"}), ["GPUs 0-1", "NOT enforced"]),
    ],
    ids=["mps", "none"],
)  # fmt: skip
def test_notes_say_which_gpus_are_enforced_and_how_to_check(helm, values, says):
    out = " ".join(notes(helm, values).split())
    for text in says:
        assert text in out, (text, out[-2000:])


def test_notes_say_nothing_of_mps_without_sharing(helm):
    assert "MPS" not in notes(helm, {"devicePlugin": True})


def notes(helm, values: dict[str, Any]) -> str:
    """NOTES.txt as ``helm install`` prints it (``--dry-run=client``: helm's own version)."""
    args = ("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client")
    out = run_helm(helm, *args, *values_args(helm, values)).stdout
    return out[out.index("NOTES:") :]


def test_every_omaticaya_variable_of_the_mps_container_is_a_supervisor_setting(helm, monkeypatch,
                                                                               tmp_path):  # fmt: skip
    """What the chart renders into the mps container, ``omaticaya mps`` reads (MpsSettings), and
    its defaults load there as the code's."""
    from omaticaya_py.core.settings import load
    from omaticaya_py.core.settings_base import env_names
    from omaticaya_py.mps.settings import MpsSettings

    env = _env(mps_container(render(helm, SHARED)))
    rendered = {k for k in env if k.startswith("OMATICAYA_")}
    assert rendered <= env_names(MpsSettings), sorted(rendered - env_names(MpsSettings))
    for key in list(os.environ):
        if key.startswith("OMATICAYA_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    for key in rendered:
        monkeypatch.setenv(key, env[key])
    s = load(MpsSettings)
    assert (s.mps_control, s.mps_check_s, s.mps_shm_mib, s.mps_metrics_port) == (
        "nvidia-cuda-mps-control", 2, 1024, 9403)  # fmt: skip
    assert str(s.mps_root) == "/run/omaticaya/mps" and str(s.mps_state_dir) == STATE_DIR
    assert s.shared_gpus.indices == {0, 1} and s.share_enforcement == "mps"

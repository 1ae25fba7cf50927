"""The chart's MPS supervisor (issue 39; a DaemonSet of its own since issue 47): with the device
plugin (or DRA) on, some GPUs shared and ``sharing.enforcement: mps`` the chart renders a second
DaemonSet, ``<fullname>-mps`` (``omaticaya mps``, container ``mps``): ``updateStrategy: OnDelete``
on the agent's nodes (the same nodeSelector, affinity and tolerations), privileged, the host folder
two levels above ``sharing.mps.root`` mounted at ``/host<folder>`` with Bidirectional propagation
(``OMATICAYA_MPS_HOST_ROOT``; the supervisor binds the root at its own path in the container's
/run, an emptyDir), the ``mps-state`` host folder ``/run/omaticaya-mps-state`` shared with the
agent's pod (where its plugins write their slice requests), its readiness probe on /readyz, the NVIDIA runtime's compute
capability unless a trace is replayed. The agent's pod has no ``mps`` container, and its settings
never reach the mps pod's template: ``helm upgrade`` with a new agent setting leaves it byte for
byte as it was, so no MPS daemon restarts. The agent gets the enforcement settings in every case.
Helpers: tests/chart.py; the same on a real kubelet, ``helm upgrade`` included:
tests/mps/test_mps_cluster.py.
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
    agent_daemonset,
    chart_settings,
    env_of,
    mps_container,
    mps_daemonset,
    render,
    run_helm,
    template,
    values_args,
)

SHARED = {"devicePlugin": True, "sharing": {"gpus": "0-1"}}
STATE_DIR = "/var/lib/omaticaya/mps-state"
#: the host folder of the daemons' states, shared by the agent's pod and the mps pod
STATE_HOST_DIR = "/run/omaticaya-mps-state"
MPS_DS = f"{RELEASE}-mps"


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container.get("volumeMounts") or []}


def _volumes(ds: dict | None) -> dict[str, dict[str, Any]]:
    """A DaemonSet's pod volumes by name (none for no DaemonSet)."""
    return {} if ds is None else {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}


def _pod(ds: dict) -> dict[str, Any]:
    return ds["spec"]["template"]["spec"]


def _mps_text(helm, values: dict[str, Any] | None) -> str:
    """The MPS DaemonSet exactly as helm renders it (text: byte for byte)."""
    return template(helm, values, "--show-only", "templates/mps-daemonset.yaml").stdout


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
        {"devicePlugin": True, "sharing": {"gpus": "all", "enforcement": "none"}},
    ],
    # sharing.gpus without the device plugin or DRA fails the render:
    # tests/charts/test_chart_values_mistakes.py
    ids=["default", "plugin-no-sharing", "enforcement-none"],
)
def test_no_mps_daemonset_unless_plugin_sharing_and_mps(helm, values):
    docs = render(helm, values)
    assert mps_daemonset(docs) is None and mps_container(docs) is None
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "DaemonSet"] == [RELEASE]
    assert not {"mps-state", "mps-host", "mps-run"} & set(_volumes(agent_daemonset(docs)))
    assert "mps-state" not in _mounts(agent_container(docs))


def test_the_supervisor_is_a_daemonset_of_its_own_on_delete(helm):
    """Issue 47: not a container of the agent's pod, which any agent setting replaces (its
    RollingUpdate), taking every daemon with it; OnDelete: a change of its own template (a new
    image) replaces no pod either."""
    docs = render(helm, SHARED)
    agent, mps = agent_daemonset(docs), mps_daemonset(docs)
    assert mps is not None and mps["metadata"]["name"] == MPS_DS
    assert mps["metadata"]["namespace"] == NAMESPACE
    assert mps["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert agent["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    # the agent's pod has the agent alone; the mps pod the supervisor alone
    assert [c["name"] for c in _pod(agent)["containers"]] == ["agent"]
    assert [c["name"] for c in _pod(mps)["containers"]] == ["mps"]
    assert not {"mps-host", "mps-run"} & set(_volumes(agent))
    # neither DaemonSet selects the other's pods (an orphaned pod would be adopted, replaced)
    agent_sel = agent["spec"]["selector"]["matchLabels"]
    mps_sel = mps["spec"]["selector"]["matchLabels"]
    agent_pod = agent["spec"]["template"]["metadata"]["labels"]
    mps_pod = mps["spec"]["template"]["metadata"]["labels"]
    assert agent_sel.items() <= agent_pod.items() and mps_sel.items() <= mps_pod.items()
    assert not agent_sel.items() <= mps_pod.items()
    assert not mps_sel.items() <= agent_pod.items()
    assert mps_pod["app.kubernetes.io/component"] == "mps"
    assert mps_pod["app.kubernetes.io/instance"] == RELEASE
    # no token: `omaticaya mps` asks nothing of the API server
    assert _pod(mps)["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in _pod(mps)


def test_the_mps_pods_run_on_the_agents_nodes_as_the_agents_do(helm):
    """The same nodeSelector, affinity, tolerations (the device plugin there reads its states),
    the runtime class (the NVIDIA runtime injects the MPS binaries), the priority (the kubelet
    must not evict what enforces the slices), the pull secrets."""
    values = {**SHARED,
              "nodeSelector": {"nvidia.com/gpu.present": None, "pool": "shared"},
              "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                  "nodeSelectorTerms": [{"matchExpressions": [
                      {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}},
              "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
              "runtimeClassName": "nvidia",
              "imagePullSecrets": [{"name": "regcred"}]}  # fmt: skip
    docs = render(helm, values)
    agent, mps = _pod(agent_daemonset(docs)), _pod(mps_daemonset(docs))
    for key in ("nodeSelector", "affinity", "tolerations", "runtimeClassName",
                "imagePullSecrets", "priorityClassName"):  # fmt: skip
        assert mps[key] == agent[key], key
    assert mps["nodeSelector"] == {"pool": "shared"}
    assert mps["priorityClassName"] == "system-node-critical"
    mine = _pod(mps_daemonset(render(helm, {**values, "priorityClassName": "gpu-high"})))
    assert mine["priorityClassName"] == "gpu-high"
    assert _pod(mps_daemonset(render(helm, SHARED)))["terminationGracePeriodSeconds"] == 30
    grace = _with(sharing={"mps": {"terminationGracePeriodSeconds": 90}})
    assert _pod(mps_daemonset(render(helm, grace)))["terminationGracePeriodSeconds"] == 90


#: agent settings, each changed from its default: none may reach the mps pod's template
AGENT_CHANGES = {
    "schedule": {"schedule": "@every 3s"},
    "logLevel": {"logLevel": "DEBUG"},
    "logJson": {"logJson": False},
    "resources": {"resources": {"limits": {"memory": "512Mi"}}},
    "podAnnotations": {"podAnnotations": {"example.com/rev": "2"}},
    "podLabels": {"podLabels": {"team": "gpu"}},
    "extraEnv": {"extraEnv": [{"name": "TZ", "value": "UTC"}]},
    "terminationGracePeriodSeconds": {"terminationGracePeriodSeconds": 60},
    "probes": {"readinessProbe": {"periodSeconds": 2}, "livenessProbe": {"periodSeconds": 5}},
    "updateStrategy": {"updateStrategy": {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxUnavailable": "20%"}}},  # fmt: skip
    "metricsPort": {"metricsPort": 9500},
    "tmpSizeLimit": {"tmpSizeLimit": "32Mi"},
    "hostPID": {"hostPID": True},
    "podSecurityContext": {"podSecurityContext": {"runAsNonRoot": True, "runAsUser": 1000}},
    "xid": {"xidIgnore": [13], "xidAllFatal": True},
    "labels": {"perGpuLabels": False, "temperatureLabels": True, "prefix": "gpu.example.com"},
    "podResourcesSocket": {"podResourcesSocket": "off"},
    "placement": {"placement": {"policy": "spread"}},
    "placement.settleS": {"sharing": {"gpus": "0-1"}, "placement": {"settleS": 5}},
    "sharing.mps.threadShare": {"sharing": {"gpus": "0-1", "mps": {"threadShare": True}}},
    "scheduler": {"scheduler": {"enabled": True}},
    "vap": {"validatingAdmissionPolicy": {"enabled": False}},
}


@pytest.mark.parametrize("change", list(AGENT_CHANGES.values()), ids=list(AGENT_CHANGES))
def test_an_agent_setting_leaves_the_mps_daemonset_byte_for_byte(helm, change):
    """`helm upgrade` with this change alone replaces the agent's pods (their template changes)
    and leaves the MPS DaemonSet as it was: no daemon restarts, no slice loses its GPU context.
    (threadShare is the device plugin's: it hands each slice its share; the daemons do not read
    it.)"""
    values = {**SHARED, **change}
    if "sharing" in change:
        values["sharing"] = {**SHARED["sharing"], **change["sharing"]}
    before, after = _mps_text(helm, SHARED), _mps_text(helm, values)
    assert "kind: DaemonSet" in before
    assert after == before
    # the change is real: the agent's DaemonSet differs (other objects for the last two)
    if change is not AGENT_CHANGES["scheduler"] and change is not AGENT_CHANGES["vap"]:
        assert agent_daemonset(render(helm, values)) != agent_daemonset(render(helm, SHARED))


@pytest.mark.parametrize("change", [
    {"image": {"tag": "0.2.0"}},
    {"image": {"pullPolicy": "Always"}},
    {"sharing": {"gpus": "0-3"}},
    {"sharing": {"gpus": "0-1", "unitMib": 2048}},
    {"sharing": {"gpus": "0-1", "mps": {"checkS": 5}}},
    {"sharing": {"gpus": "0-1", "mps": {"logLevel": "DEBUG"}}},
    {"trace": "multi-gpu-trace.json"},
], ids=["image.tag", "image.pullPolicy", "sharing.gpus", "sharing.unitMib", "sharing.mps.checkS",
        "sharing.mps.logLevel", "trace"])  # fmt: skip
def test_what_the_daemons_need_does_change_the_mps_template(helm, change):
    """The other side: the image and the MPS settings are in the template (OnDelete then waits
    for each pod's deletion to apply them: docs/chart.md)."""
    values = {**SHARED, **change}
    before = mps_daemonset(render(helm, SHARED))["spec"]["template"]
    after = mps_daemonset(render(helm, values))["spec"]["template"]
    assert after != before


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
    assert "command" not in mps
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
    assert probe == {"httpGet": {"path": "/readyz", "port": "mps-metrics"},
                     "initialDelaySeconds": 5, "periodSeconds": 10, "timeoutSeconds": 5,
                     "failureThreshold": 3}  # fmt: skip
    assert "livenessProbe" not in mps  # a restart would kill every client's GPU context
    assert "resources" not in mps


def test_the_mps_probe_and_log_are_its_own(helm):
    """sharing.mps.readinessProbe, logLevel and logJson, not the agent's values."""
    values = _with(logLevel="DEBUG", logJson=False, readinessProbe={"periodSeconds": 2},
                   sharing={"mps": {"logLevel": "WARNING", "logJson": False,
                                    "readinessProbe": {"periodSeconds": 3,
                                                       "failureThreshold": 6}}})  # fmt: skip
    mps = mps_container(render(helm, values))
    env = _env(mps)
    assert (env["OMATICAYA_LOG_LEVEL"], env["OMATICAYA_LOG_JSON"]) == ("WARNING", "false")
    assert (mps["readinessProbe"]["periodSeconds"], mps["readinessProbe"]["failureThreshold"]) == (
        3, 6)  # fmt: skip


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
    mounts, volumes = _mounts(mps_container(docs)), _volumes(mps_daemonset(docs))
    assert mounts["mps-host"] == {"name": "mps-host", "mountPath": "/host" + host_dir,
                                  "mountPropagation": "Bidirectional"}  # fmt: skip
    assert volumes["mps-host"]["hostPath"] == {"path": host_dir, "type": "Directory"}
    assert mounts["mps-run"]["mountPath"] == "/run" and "emptyDir" in volumes["mps-run"]
    env = _env(mps_container(docs))
    assert env["OMATICAYA_MPS_ROOT"] == root
    assert env["OMATICAYA_MPS_HOST_ROOT"] == "/host" + root
    # only the host folder's mount propagates
    assert [n for n, m in mounts.items() if m.get("mountPropagation")] == ["mps-host"]


def test_state_folder_is_a_host_folder_in_both_pods(helm):
    """Two pods now: the daemons' states and the plugins' slice requests go through a host
    folder (no emptyDir spans pods), at OMATICAYA_MPS_STATE_DIR in both, writable in both (the
    agent's plugins write the requests); under /run (nothing outlives a reboot), beside the
    root's parent /run/omaticaya, which the supervisor must still be able to remove."""
    for values in (SHARED, _with(sharing={"mps": {"root": "/srv/gpu/omaticaya/mps"}})):
        docs = render(helm, values)
        agent, mps = _mounts(agent_container(docs)), _mounts(mps_container(docs))
        assert agent["mps-state"] == {"name": "mps-state", "mountPath": STATE_DIR}
        assert mps["mps-state"] == {"name": "mps-state", "mountPath": STATE_DIR}
        want = {"path": STATE_HOST_DIR, "type": "DirectoryOrCreate"}
        for ds in (agent_daemonset(docs), mps_daemonset(docs)):
            assert _volumes(ds)["mps-state"] == {"name": "mps-state", "hostPath": want}
        assert _env(agent_container(docs))["OMATICAYA_MPS_STATE_DIR"] == STATE_DIR
        assert _env(mps_container(docs))["OMATICAYA_MPS_STATE_DIR"] == STATE_DIR
        # the agent mounts no host folder of MPS but the states: it only hands the paths out
        assert not {"mps-host", "mps-run"} & set(agent)
    # not inside the supervisor's root or the parent it makes and removes
    assert not STATE_HOST_DIR.startswith("/run/omaticaya/")


def test_mps_values_reach_the_container(helm):
    values = _with(sharing={"unitMib": 2048, "mps": {
        "shmMib": 0, "metricsPort": 9500, "resources": {"limits": {"memory": "256Mi"}}}})  # fmt: skip
    mps = mps_container(render(helm, values))
    env = _env(mps)
    assert (env["OMATICAYA_MPS_SHM_MIB"], env["OMATICAYA_MPS_METRICS_PORT"]) == ("0", "9500")
    assert env["OMATICAYA_SHARE_UNIT_MIB"] == "2048"
    assert mps["ports"][0]["containerPort"] == 9500
    assert mps["resources"] == {"limits": {"memory": "256Mi"}}


def test_rendered_daemonsets_validate(helm):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for values in (SHARED, _with(trace="multi-gpu-trace.json")):
        docs = render(helm, values)
        for ds in (agent_daemonset(docs), mps_daemonset(docs)):
            kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


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
    ("logLevel-unknown", {"sharing": {"mps": {"logLevel": "VERBOSE"}}}, "/sharing/mps/logLevel"),
    ("logJson-string", {"sharing": {"mps": {"logJson": "yes"}}}, "/sharing/mps/logJson"),
    (
        "grace-negative",
        {"sharing": {"mps": {"terminationGracePeriodSeconds": -1}}},
        "/sharing/mps/terminationGracePeriodSeconds",
    ),
    (
        "probe-enabled",  # always on: a readiness probe is what tells that every daemon is up
        {"sharing": {"mps": {"readinessProbe": {"enabled": False}}}},
        "enabled",
    ),
    (
        "probe-period-zero",
        {"sharing": {"mps": {"readinessProbe": {"periodSeconds": 0}}}},
        "/sharing/mps/readinessProbe/periodSeconds",
    ),
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
         ["GPUs 0-1", "enforced by CUDA MPS", f"DaemonSet {MPS_DS} (container mps)",
          "omaticaya top", "OnDelete", "restarts no MPS daemon",
          f"A second one then stops {MPS_DS}"]),
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
    from omaticaya_py.core.config.settings import load
    from omaticaya_py.core.config.settings_base import env_names
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

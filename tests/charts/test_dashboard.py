"""The chart's Grafana dashboard and alerts (charts/omaticaya/files/): every dashboard query
parses with ``promtool``, every metric the dashboard and the alerts name is in a real scrape of
a running agent (against the real kube-apiserver), and the rules pass ``promtool check rules``
and ``promtool test rules`` (input series -> the alerts that fire, with their rendered text).

``promtool`` comes from Debian's ``prometheus`` package (``apt-get install -y prometheus``);
without it these tests skip, saying so."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import FAULTS_TRACE, free_port
from tests.mps_rig import STANDIN
from tests.tools import ToolUnavailable, promtool_path
from tests.waiting import wait_for

FILES = Path(__file__).resolve().parents[2] / "charts" / "omaticaya" / "files"
DASHBOARD = FILES / "dashboard.json"
ALERTS = FILES / "alerts.yaml"
METRIC = re.compile(r"\bomaticaya_[a-z0-9_]+\b")


def _promtool() -> str:
    try:
        return str(promtool_path())
    except ToolUnavailable as exc:
        pytest.skip(f"promtool unavailable: {exc}")


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target, Grafana's variables given values."""
    out = []
    for panel in _dashboard()["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "5m").replace("$instance", ".*")
            out.append((panel["title"], expr))
    return out


def _rules_yaml() -> str:
    return ALERTS.read_text()


def _alert_exprs() -> list[str]:
    return re.findall(r"^\s+expr: (?:>-\n)?(.+?)(?=\n\s+for:)", _rules_yaml(), re.S | re.M)


def test_dashboard_shape():
    dash = _dashboard()
    titles = [p["title"] for p in dash["panels"]]
    for needed in ("Fleet free GPU memory", "utilisation per GPU", "Unhealthy GPUs",
                   "Agents not reporting", "API requests", "Patch rate", "Tick duration"):
        assert any(needed in t for t in titles), needed
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert all(t["datasource"]["uid"] == "${datasource}" for p in dash["panels"]
               for t in p["targets"])
    for p in dash["panels"]:  # inside Grafana's 24-column grid
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24


def test_every_dashboard_query_parses(tmp_path):
    promtool = _promtool()
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(_queries())
    ]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_queries())} rules found" in done.stdout


def test_alert_rules_check():
    promtool = _promtool()
    done = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def _names(exposition: str) -> set[str]:
    """Every metric name a scrape exposes: sample lines, and each family's series names (a
    counter's ``_total``, a histogram's ``_bucket``/``_sum``/``_count``) from ``# TYPE``."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()[:4]
            names.add(name)
            if kind == "counter":
                names.add(name + "_total")
            if kind == "histogram":
                names.update(name + s for s in ("_bucket", "_sum", "_count"))
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


@pytest.mark.cluster
def test_every_metric_named_is_in_a_real_scrape(dev_cluster, make_node):
    """An agent replaying the faults trace against the real API server, and the MPS supervisor
    (``omaticaya mps`` on the same trace, the stand-in daemon for GPU 0), both scraped."""
    node = make_node()
    port, mps_port = free_port(), free_port()
    env = dict(dev_cluster.env(), NODE_NAME=node)
    proc = subprocess.Popen(
        [sys.executable, "-m", "omaticaya_py", "run", "--trace", str(FAULTS_TRACE),
         "--metrics-port", str(port), "--schedule", "@every 1s"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    short = Path(tempfile.mkdtemp(prefix="om-dash-", dir="/tmp"))  # a unix socket's path bound
    mps = subprocess.Popen(
        [sys.executable, "-m", "omaticaya_py", "mps"],
        env=dict(os.environ, OMATICAYA_TRACE=str(FAULTS_TRACE), OMATICAYA_SHARED_GPUS="0",
                 OMATICAYA_MPS_CONTROL=str(STANDIN), OMATICAYA_MPS_SHM_MIB="0",
                 OMATICAYA_MPS_ROOT=str(short / "mps"), OMATICAYA_MPS_STATE_DIR=str(short / "state"),
                 OMATICAYA_MPS_METRICS_PORT=str(mps_port), OMATICAYA_METRICS_ADDRESS="127.0.0.1"),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        def patched() -> str | None:
            text = _scrape(port)
            return text if "omaticaya_last_patch_timestamp_seconds " in text else None

        def daemon_up() -> str | None:
            text = _scrape(mps_port)
            return text if "omaticaya_mps_daemon_up{" in text else None

        text = wait_for("a scrape after the first patch", patched, 60)
        text += wait_for("the MPS supervisor's scrape", daemon_up, 60)
    finally:
        for p in (proc, mps):
            p.terminate()
            p.wait(timeout=30)
        shutil.rmtree(short, ignore_errors=True)
    exposed = _names(text)
    named = {m for m in _named() if not m.startswith(SCRAPED_ELSEWHERE)}
    assert len(named) >= 12
    assert named - exposed == set(), f"not in a real scrape: {sorted(named - exposed)}"


def _named() -> set[str]:
    """Every metric name the dashboard's queries and the alerts' expressions use."""
    named = {m for _, expr in _queries() for m in METRIC.findall(expr)}
    return named | {m for expr in _alert_exprs() for m in METRIC.findall(expr)}


#: metric families checked by ``test_every_dra_and_extender_metric_named_is_in_their_scrape``
#: (the DRA plugin's counters, registered only with OMATICAYA_DRA; the extender's, its own
#: process), not by the agent's and the MPS supervisor's scrape above
SCRAPED_ELSEWHERE = ("omaticaya_dra_", "omaticaya_extender_")


def test_every_dra_and_extender_metric_named_is_in_their_scrape(tmp_path):
    """The DRA plugin's counters as the agent registers them with OMATICAYA_DRA
    (``dra.metrics.DraCounters``, cli/daemon.py), rendered by prometheus-client; and a real
    scrape of the extender's metrics port (``serve`` running, its caches on an API server that
    refuses connections: every family is there before the first LIST)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from omaticaya_py.dra.metrics import DraCounters, DraCounts
    from tests.scheduler.offline_extender_support import ServedExtender, http, offline_settings

    registry = CollectorRegistry()
    registry.register(DraCounters(DraCounts()))
    text = generate_latest(registry).decode()
    port, scrape_port = free_port(), free_port()
    served = ServedExtender(offline_settings(tmp_path, port=port, scrape_port=scrape_port,
                                             scrape_address="127.0.0.1", lease_namespace="ns"))  # fmt: skip
    try:
        assert served.ready.wait(30), "the extender did not start"
        status, scraped = http(f"http://127.0.0.1:{scrape_port}/metrics")
        assert status == 200
    finally:
        served.close()
    named = {m for m in _named() if m.startswith(SCRAPED_ELSEWHERE)}
    assert {"omaticaya_dra_prepare_total", "omaticaya_extender_decisions_total"} <= named
    exposed = _names(text + scraped)
    assert named - exposed == set(), f"not in a real scrape: {sorted(named - exposed)}"


# -- promtool test rules -------------------------------------------------------------------

INST = 'instance="node-a:9402"'
#: (alert, input series, eval time, expected alerts: (their labels, the humanized $value))
CASES = [
    ("OmaticayaGpuUnhealthy",
     [(f'omaticaya_gpu_healthy{{{INST},gpu="0",uuid="GPU-0"}}', "1x20"),
      (f'omaticaya_gpu_healthy{{{INST},gpu="1",uuid="GPU-1"}}', "1 0x20")],
     "7m", [({"gpu": "1", "uuid": "GPU-1"}, "0")]),
    ("OmaticayaGpuUnhealthy",  # not yet 5 minutes
     [(f'omaticaya_gpu_healthy{{{INST},gpu="1",uuid="GPU-1"}}', "1 1 0x20")], "5m", []),
    ("OmaticayaNvmlUnreadable",
     [(f'omaticaya_node_health{{{INST},state="Unknown"}}', "1x20"),
      (f'omaticaya_node_health{{{INST},state="Healthy"}}', "0x20")],
     "6m", [({"state": "Unknown"}, "1")]),
    ("OmaticayaNvmlUnreadable",  # unreadable for 3 minutes, then read again
     [(f'omaticaya_node_health{{{INST},state="Unknown"}}', "1x3 0x20")], "6m", []),
    ("OmaticayaNvmlErrorsRising",
     [(f'omaticaya_nvml_errors_total{{{INST},call="nvmlDeviceGetMemoryInfo",error="GpuIsLost"}}',
       "0+6x30")],
     "15m", [({"call": "nvmlDeviceGetMemoryInfo", "error": "GpuIsLost"}, "100m")]),
    ("OmaticayaNvmlErrorsRising",  # one error, then none
     [(f'omaticaya_nvml_errors_total{{{INST},call="nvmlDeviceGetMemoryInfo",error="GpuIsLost"}}',
       "0 1x30")], "15m", []),
    ("OmaticayaAgentNotReporting",
     [(f'omaticaya_build_info{{{INST},version="0.1.0",python="3.11.7"}}', "1x5 _x40")],
     "20m", [({"version": "0.1.0", "python": "3.11.7"}, "1")]),
    ("OmaticayaAgentNotReporting",  # still reporting
     [(f'omaticaya_build_info{{{INST},version="0.1.0",python="3.11.7"}}', "1x40")], "20m", []),
    ("OmaticayaAgentNotTicking",
     [(f"omaticaya_ticks_total{{{INST}}}", "0+1x10 10x40"),
      ('omaticaya_ticks_total{instance="node-b:9402"}', "0+1x50")],
     "35m", [({}, "0")]),
    ("OmaticayaAgentNotTicking",  # ticking
     [(f"omaticaya_ticks_total{{{INST}}}", "0+1x50")], "35m", []),
    ("OmaticayaAgentNotPatching",
     [(f"omaticaya_last_patch_timestamp_seconds{{{INST}}}", "0x40"),
      ('omaticaya_last_patch_timestamp_seconds{instance="node-b:9402"}', "0+60x40")],
     "25m", [({}, "25m 0s")]),
    ("OmaticayaAgentNotPatching",  # its heartbeat is a Lease: a quiet Node is not patched
     [(f"omaticaya_last_patch_timestamp_seconds{{{INST}}}", "0x40"),
      (f"omaticaya_heartbeat_on_lease{{{INST}}}", "1x40")],
     "25m", []),
    ("OmaticayaLeaseNotRenewed",
     [(f"omaticaya_lease_renewals_total{{{INST}}}", "0+1x5 5x40"),
      (f"omaticaya_heartbeat_on_lease{{{INST}}}", "1x45"),
      ('omaticaya_lease_renewals_total{instance="node-b:9402"}', "0+1x45"),
      ('omaticaya_heartbeat_on_lease{instance="node-b:9402"}', "1x45")],
     "30m", [({}, "0")]),
    ("OmaticayaLeaseNotRenewed",  # its heartbeat moved to the Node annotation (a 403 on Leases)
     [(f"omaticaya_lease_renewals_total{{{INST}}}", "0+1x5 5x40"),
      (f"omaticaya_heartbeat_on_lease{{{INST}}}", "1x5 0x40")], "30m", []),
    ("OmaticayaApiErrorsRising",
     [(f'omaticaya_api_requests_total{{{INST},verb="patch",result="503"}}', "0+3x30"),
      (f'omaticaya_api_requests_total{{{INST},verb="patch",result="200"}}', "0+60x30")],
     "15m", [({"verb": "patch", "result": "503"}, "50m")]),
    ("OmaticayaApiErrorsRising",  # one 503, then answered
     [(f'omaticaya_api_requests_total{{{INST},verb="patch",result="503"}}', "0 1x30"),
      (f'omaticaya_api_requests_total{{{INST},verb="patch",result="200"}}', "0+60x30")],
     "15m", []),
    ("OmaticayaTickErrors",
     [(f"omaticaya_tick_errors_total{{{INST}}}", "0+1x30")], "15m", [({}, "16.67m")]),
    ("OmaticayaTickErrors",  # one failed tick
     [(f"omaticaya_tick_errors_total{{{INST}}}", "0 1x30")], "15m", []),
    ("OmaticayaMpsDaemonDown",  # GPU 1's daemon down from minute 1: fires after 2 minutes
     [(f'omaticaya_mps_daemon_up{{{INST},gpu="0",uuid="GPU-0"}}', "1x10"),
      (f'omaticaya_mps_daemon_up{{{INST},gpu="1",uuid="GPU-1"}}', "1 0x10")],
     "4m", [({"gpu": "1", "uuid": "GPU-1"}, "0")]),
    ("OmaticayaMpsDaemonDown",  # down for one minute, then back: no alert
     [(f'omaticaya_mps_daemon_up{{{INST},gpu="1",uuid="GPU-1"}}', "1 0 1x10")], "4m", []),
    ("OmaticayaMpsLimitNotEnforced",  # the first episode: the gauge (the counter created at 1)
     [(f'omaticaya_slice_over_limit{{{INST},gpu="0",uuid="GPU-0",enforced="true",'
       'reason="MpsLimitNotEnforced"}', "1x10"),
      (f'omaticaya_slice_over_limit_episodes_total{{{INST},enforced="true",'
       'reason="MpsLimitNotEnforced"}', "1x10")],
     "5m", [({}, "1")]),
    ("OmaticayaMpsLimitNotEnforced",  # an episode shorter than a scrape: the counter
     [(f'omaticaya_slice_over_limit_episodes_total{{{INST},enforced="true",'
       'reason="MpsLimitNotEnforced"}', "0 0 1x20")],
     "5m", [({}, "1")]),
    ("OmaticayaMpsLimitNotEnforced",  # over its slice where nothing enforced it: not MPS's fault
     [(f'omaticaya_slice_over_limit{{{INST},gpu="0",uuid="GPU-0",enforced="false",'
       'reason="GpuMemoryOverLimit"}', "1x10"),
      (f'omaticaya_slice_over_limit_episodes_total{{{INST},enforced="false",'
       'reason="GpuMemoryOverLimit"}', "0+1x10")], "5m", []),
    ("OmaticayaMpsDaemonRestarting",  # GPU 1's daemon exits once a minute; GPU 0's is steady
     [(f'omaticaya_mps_daemon_failures_total{{{INST},gpu="1",uuid="GPU-1",reason="exited"}}',
       "0+1x40"),
      (f'omaticaya_mps_daemon_failures_total{{{INST},gpu="0",uuid="GPU-0",reason="exited"}}',
       "2x40")],
     "35m", [({"gpu": "1", "uuid": "GPU-1", "reason": "exited"}, "30")]),
    ("OmaticayaMpsDaemonRestarting",  # three failures in half an hour: not yet
     [(f'omaticaya_mps_daemon_failures_total{{{INST},gpu="1",uuid="GPU-1",reason="exited"}}',
       "0 1 2 3x40")], "25m", []),
    ("OmaticayaMpsSliceDaemonsFailing",
     [(f'omaticaya_mps_slice_daemon_failures_total{{{INST},gpu="0",uuid="GPU-0",'
       'reason="start-timeout"}', "0+1x40")],
     "35m", [({"gpu": "0", "uuid": "GPU-0", "reason": "start-timeout"}, "30")]),
    ("OmaticayaMpsSliceDaemonsFailing",  # failed a while ago, quiet for the last half hour
     [(f'omaticaya_mps_slice_daemon_failures_total{{{INST},gpu="0",uuid="GPU-0",'
       'reason="exited"}', "0+1x10 10x40")], "45m", []),
    ("OmaticayaResourceSliceWriteErrors",
     [(f"omaticaya_resourceslice_errors_total{{{INST}}}", "0+2x30"),
      (f"omaticaya_resourceslice_writes_total{{{INST}}}", "1x30"),
      ('omaticaya_resourceslice_errors_total{instance="node-b:9402"}', "0x30")],
     "25m", [({}, "33.33m")]),
    ("OmaticayaResourceSliceWriteErrors",  # one failed apply, then written again
     [(f"omaticaya_resourceslice_errors_total{{{INST}}}", "0 1x30"),
      (f"omaticaya_resourceslice_writes_total{{{INST}}}", "0+1x30")], "25m", []),
    ("OmaticayaDraPrepareFailing",
     [(f'omaticaya_dra_prepare_total{{{INST},result="refused"}}', "0+1x30"),
      (f'omaticaya_dra_prepare_total{{{INST},result="prepared"}}', "0+5x30"),
      (f'omaticaya_dra_prepare_total{{{INST},result="failed"}}', "0x30")],
     "25m", [({"result": "refused"}, "16.67m")]),
    ("OmaticayaDraPrepareFailing",  # one failure, retried and prepared
     [(f'omaticaya_dra_prepare_total{{{INST},result="failed"}}', "0 1x30"),
      (f'omaticaya_dra_prepare_total{{{INST},result="prepared"}}', "0+5x30")], "25m", []),
    ("OmaticayaDraUnprepareFailing",
     [(f'omaticaya_dra_unprepare_total{{{INST},result="failed"}}', "0+1x30")],
     "25m", [({}, "16.67m")]),
    ("OmaticayaDraUnprepareFailing",  # unprepared: no alert
     [(f'omaticaya_dra_unprepare_total{{{INST},result="unprepared"}}', "0+1x30"),
      (f'omaticaya_dra_unprepare_total{{{INST},result="failed"}}', "0x30")], "25m", []),
    ("OmaticayaDraDeviceTainted",  # GPU 1 unhealthy from minute 1 on a DRA node
     [(f'omaticaya_gpu_healthy{{{INST},gpu="0",uuid="GPU-0"}}', "1x40"),
      (f'omaticaya_gpu_healthy{{{INST},gpu="1",uuid="GPU-1"}}', "1 0x40"),
      (f'omaticaya_dra_prepare_total{{{INST},result="prepared"}}', "0x40")],
     "35m", [({"gpu": "1", "uuid": "GPU-1"}, "0")]),
    ("OmaticayaDraDeviceTainted",  # not yet 30 minutes
     [(f'omaticaya_gpu_healthy{{{INST},gpu="1",uuid="GPU-1"}}', "1 0x40"),
      (f'omaticaya_dra_prepare_total{{{INST},result="prepared"}}', "0x40")], "25m", []),
    ("OmaticayaDraDeviceTainted",  # no DRA plugin on that node (no device, no taint)
     [(f'omaticaya_gpu_healthy{{{INST},gpu="1",uuid="GPU-1"}}', "1 0x40"),
      ('omaticaya_dra_prepare_total{instance="node-b:9402",result="prepared"}', "0x40")],
     "35m", []),
]


def _render(template: str, labels: dict[str, str], value: str) -> str:
    """The annotation as Prometheus renders it for these labels and this (humanized) value:
    ``{{ $labels.x }}`` and ``{{ $value | ... }}`` (what alerts.yaml uses)."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)
    return re.sub(r"\{\{ \$value(?: \| \w+)? \}\}", value, text)


def _annotations(alert: str) -> dict[str, str]:
    import yaml  # PyYAML comes with the kubernetes client

    for group in yaml.safe_load(_rules_yaml())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                return rule["annotations"]
    raise AssertionError(alert)


def test_alert_rules_unit(tmp_path):
    promtool = _promtool()
    tests = []
    for alert, series, at, expected in CASES:
        exp = []
        for extra, value in expected:
            labels = {"instance": "node-a:9402", "severity": "warning", **extra}
            exp.append({
                "exp_labels": labels,
                "exp_annotations": {k: _render(v, labels, value)
                                    for k, v in _annotations(alert).items()},
            })
        tests.append({
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": exp}],
        })
    path = tmp_path / "alerts-test.yaml"
    path.write_text(json.dumps({"rule_files": [str(ALERTS)], "evaluation_interval": "1m",
                                "tests": tests}))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_case_that_fires_and_one_that_stays_silent():
    """Each alert of alerts.yaml is in CASES at least twice: input it must fire on, and input
    close to it that must leave it silent (a test that could not fail proves nothing)."""
    import yaml

    alerts = [r["alert"] for g in yaml.safe_load(_rules_yaml())["groups"] for r in g["rules"]]
    assert len(alerts) == len(set(alerts)) >= 17
    fires = {alert for alert, _, _, expected in CASES if expected}
    silent = {alert for alert, _, _, expected in CASES if not expected}
    assert set(alerts) - fires == set(), "no case where it fires"
    assert set(alerts) - silent == set(), "no case where it stays silent"
    assert {alert for alert, *_ in CASES} <= set(alerts)


def test_docs_list_every_alert():
    """docs/metrics.md's table of the shipped alerts has a row for each, and no other."""
    import yaml

    alerts = {r["alert"] for g in yaml.safe_load(_rules_yaml())["groups"] for r in g["rules"]}
    text = (FILES.parents[2] / "docs" / "metrics.md").read_text()
    rows = set(re.findall(r"^\| `(Omaticaya[A-Za-z]+)` \|", text, re.M))
    assert rows == alerts


def test_dashboard_covers_dra_mps_and_the_extender():
    """Panels for the DRA driver (ResourceSlice writes and errors, prepare and unprepare
    results, tainted devices), the MPS daemons and the extender's decisions; their queries
    name those families. The MPS supervisor's and the extender's targets are their own pods,
    not the agents': their panels do not filter by the Agent variable."""
    panels = {p["title"]: p for p in _dashboard()["panels"]}
    wanted = {
        "DRA: ResourceSlice applies, held and failed": ("omaticaya_resourceslice_writes_total",
                                                        "omaticaya_resourceslice_errors_total"),
        "DRA: claims prepared and unprepared, by result": ("omaticaya_dra_prepare_total",
                                                           "omaticaya_dra_unprepare_total"),
        "DRA: devices tainted": ("omaticaya_gpu_healthy", "omaticaya_dra_prepare_total"),
        "MPS: daemons up": ("omaticaya_mps_daemon_up", "omaticaya_mps_slice_daemons"),
        "MPS: daemon failures by reason": ("omaticaya_mps_daemon_failures_total",
                                           "omaticaya_mps_slice_daemon_failures_total"),
        "Extender: decisions per node, by verb and result": ("omaticaya_extender_decisions_total",),
    }  # fmt: skip
    for title, families in wanted.items():
        exprs = " ".join(t["expr"] for t in panels[title]["targets"])
        assert all(f in METRIC.findall(exprs) for f in families), title
        assert panels[title]["description"], title
        if title.startswith(("MPS", "Extender")):
            assert "$instance" not in exprs, title
        else:
            assert all("$instance" in t["expr"] for t in panels[title]["targets"]), title
    boxes = [(p["gridPos"]["x"], p["gridPos"]["y"]) for p in panels.values()]
    assert len(boxes) == len(set(boxes)), "two panels in one place"


# -- the chart -----------------------------------------------------------------------------


def _render_chart(*sets: str) -> list[dict]:
    import yaml

    from tests.tools import ToolUnavailable, helm_path

    try:
        helm = helm_path()
    except ToolUnavailable as exc:
        pytest.skip(f"helm: {exc}")
    chart = FILES.parent
    done = subprocess.run([str(helm), "template", "t", str(chart), "-n", "mon",
                           *(a for s in sets for a in ("--set", s))],
                          capture_output=True, text=True, timeout=120, check=True)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_chart_dashboard_and_rules_off_by_default():
    kinds = {d["kind"] for d in _render_chart()}
    assert "PrometheusRule" not in kinds and "ConfigMap" not in kinds


def test_chart_dashboard_configmap_for_the_grafana_sidecar():
    docs = _render_chart("grafanaDashboard.enabled=true",
                         "grafanaDashboard.annotations.grafana_folder=GPUs")
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GPUs"}
    assert cm["metadata"]["namespace"] == "mon"
    assert json.loads(cm["data"]["omaticaya-fleet.json"]) == _dashboard()
    other = _render_chart("grafanaDashboard.enabled=true", "grafanaDashboard.namespace=grafana")
    assert [d for d in other if d["kind"] == "ConfigMap"][0]["metadata"]["namespace"] == "grafana"


def test_chart_prometheus_rule_holds_the_tested_rules():
    import yaml

    docs = _render_chart("prometheusRule.enabled=true", "prometheusRule.labels.release=prom")
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["spec"] == yaml.safe_load(_rules_yaml())

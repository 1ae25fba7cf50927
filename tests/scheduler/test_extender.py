"""The scheduler extender: table-driven filter and prioritize on ExtenderArgs documents, the
node parsing (from the agent's real render), settings, and the HTTP app."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.testclient import TestClient

from omaticaya_py.core.config.settings import SettingsError
from omaticaya_py.core.config.settings_base import env_names
from omaticaya_py.scheduler import Extender, ExtenderSettings, create_app, parse_node
from omaticaya_py.scheduler.fit import MAX_PRIORITY
from omaticaya_py.scheduler.need import Need, parse_need
from omaticaya_py.scheduler.protocol import handle_filter, handle_prioritize
from omaticaya_py.scheduler.settings import load_extender_settings
from tests.helpers import READ_AT
from tests.scheduler.extender_support import (  # the names moved out, for this file's tests
    NOW,  # noqa: F401
    agent_node,  # noqa: F401
)

REPO = Path(__file__).resolve().parents[2]

P = "omaticaya.io"


def settings(**kw: Any) -> ExtenderSettings:
    return ExtenderSettings(_env_file=None, **kw)  # type: ignore[call-arg]




def bare_node(name: str, labels: dict[str, str] | None = None, annotations: dict | None = None):
    return {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}}}


def pod(mib: Any = None, count: Any = None) -> dict[str, Any]:
    annotations = {}
    if mib is not None:
        annotations[f"{P}/gpu-memory-mib"] = str(mib)
    if count is not None:
        annotations[f"{P}/gpu-count"] = str(count)
    return {"metadata": {"name": "p", "namespace": "default", "annotations": annotations}}


NODES = {
    "big": agent_node("big", 70000),
    "mid": agent_node("mid", 35000),
    "small": agent_node("small", 20000),
    "sick": agent_node("sick", 70000, unhealthy=(0,)),
    "degraded": agent_node("degraded", 40000, 70000, unhealthy=(1,)),
    "two": agent_node("two", 40000, 40000),
    "stale": agent_node("stale", 70000, age_s=400),
    "plain": bare_node("plain"),
}


def args_with_nodes(pod_doc: dict, names: list[str]) -> dict[str, Any]:
    return {
        "Pod": pod_doc,
        "Nodes": {"metadata": {}, "items": [NODES[n] for n in names]},
        "NodeNames": None,
    }


# ----------------------------------------------------------------------------- parsing ----


def test_parse_node_from_the_agents_telemetry():
    s = parse_node("n", NODES["degraded"]["metadata"]["labels"], NODES["degraded"]["metadata"]["annotations"])
    assert s.known and s.health == "Degraded" and s.read_at == READ_AT.timestamp()
    # the least of the telemetry's exact MiB and the labels (gpu-0.memory.free-mib 39936; the
    # node's gpu.memory.free-mib, 39936 over healthy GPUs, bounds every GPU)
    assert [(g.index, g.free_mib, g.healthy) for g in s.gpus] == [(0, 39936, True), (1, 39936, False)]
    assert s.free_total_mib == 39936


def test_parse_node_falls_back_to_labels():
    labels = {f"{P}/gpu.health": "Healthy", f"{P}/gpu-0.memory.free-mib": "1024",
              f"{P}/gpu-0.health": "Healthy", f"{P}/gpu-1.memory.free-mib": "4096",
              f"{P}/gpu-1.health": "Unhealthy"}  # fmt: skip
    s = parse_node("n", labels, {})
    assert s.read_at is None and s.free_total_mib == 1024
    agg = parse_node("n", {f"{P}/gpu.health": "Healthy", f"{P}/gpu.memory.free-mib": "8192",
                           f"{P}/gpu.memory.free-total-mib": "12288", f"{P}/gpu.healthy-count": "2"}, {})  # fmt: skip
    assert [g.free_mib for g in agg.gpus] == [8192, 4096]


def test_parse_node_without_data_and_with_a_broken_annotation():
    assert not parse_node("n", {"a": "b"}, {}).known
    broken = parse_node("n", {f"{P}/gpu.health": "Healthy"}, {f"{P}/telemetry": "{not json"})
    assert broken.known and broken.read_at is None and "unreadable" in (broken.problem or "")


@pytest.mark.parametrize(
    ("annotations", "need"),
    [
        ({}, None),
        ({f"{P}/gpu-memory-mib": "30720"}, Need(30720, 1)),
        ({f"{P}/gpu-memory-mib": "30Gi", f"{P}/gpu-count": "2"}, Need(30720, 2)),
        ({f"{P}/gpu-memory-mib": " 512Mi "}, Need(512, 1)),
        ({f"{P}/gpu-memory-mib": "lots"}, "not a memory size"),
        ({f"{P}/gpu-memory-mib": "1024", f"{P}/gpu-count": "0"}, "not a whole number from 1"),
        ({"other.io/gpu-memory-mib": "1024"}, None),
    ],
)
def test_parse_need(annotations, need):
    got = parse_need({"metadata": {"annotations": annotations}})
    if isinstance(need, str):
        assert got is not None and need in (got.error or "")
    else:
        assert got == need


# ------------------------------------------------------------------------------ filter ----

ALL = list(NODES)
ROOM = "node(s) had no room: pod needs a GPU with 30720 MiB free (omaticaya.io)"
SICK = "node(s) had GPU health Unhealthy (omaticaya.io)"
STALE = "node(s) had stale GPU telemetry (omaticaya.io/telemetry read_at older than 360s: agent not reporting)"
NODATA = "node(s) had no GPU telemetry (omaticaya.io labels missing: no agent)"

FILTER_CASES = [
    # (id, pod, settings, passed, failed)
    ("no annotation: every node passes", pod(), {}, ALL, {}),
    ("30 GiB", pod(30720), {}, ["big", "mid", "degraded", "two"],
     {"small": ROOM, "sick": SICK, "stale": STALE, "plain": NODATA}),
    ("two GPUs of 35 GiB", pod("35000", 2), {}, ["two"],
     {n: "node(s) had no room: pod needs 2 GPUs with 35000 MiB free (omaticaya.io)"
      for n in ("big", "mid", "small", "degraded")} | {"sick": SICK, "stale": STALE, "plain": NODATA}),
    ("degraded node: only its healthy GPU counts", pod(50000), {}, ["big"],
     {"mid": "node(s) had no room: pod needs a GPU with 50000 MiB free (omaticaya.io)",
      "small": "node(s) had no room: pod needs a GPU with 50000 MiB free (omaticaya.io)",
      "degraded": "node(s) had no room: pod needs a GPU with 50000 MiB free (omaticaya.io)",
      "two": "node(s) had no room: pod needs a GPU with 50000 MiB free (omaticaya.io)",
      "sick": SICK, "stale": STALE, "plain": NODATA}),
    ("fail open: unknown and stale pass, unhealthy still fails", pod(30720), {"fail_open": True},
     ["big", "mid", "degraded", "two", "stale", "plain"], {"small": ROOM, "sick": SICK}),
    ("a longer TTL keeps the stale node", pod(30720), {"ttl_s": 1000}, ["big", "mid", "degraded", "two", "stale"],
     {"small": ROOM, "sick": SICK, "plain": NODATA}),
    ("bad annotation: every node fails with the reason", pod("x"), {}, [],
     {n: "pod annotation omaticaya.io/gpu-memory-mib='x' is not a memory size: expected MiB as a whole number (30720) or a quantity (30Gi, 1.5Gi)" for n in ALL}),
]  # fmt: skip


@pytest.mark.parametrize(("pod_doc", "kw", "passed", "failed"), [c[1:] for c in FILTER_CASES],
                         ids=[c[0] for c in FILTER_CASES])  # fmt: skip
def test_filter_with_nodes(pod_doc, kw, passed, failed):
    result = handle_filter(args_with_nodes(pod_doc, ALL), settings(**kw), now=NOW)
    assert set(result) - {"FailedAndUnresolvableNodes"} == {"Nodes", "NodeNames", "FailedNodes", "Error"}
    # nodes eviction cannot help (tests/scheduler/test_preemption.py): some of the failed ones, same reasons
    assert result.get("FailedAndUnresolvableNodes", {}).items() <= failed.items()
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == passed
    # the scheduler's own objects come back, untouched
    assert all(item is NODES[name] for item, name in zip(result["Nodes"]["items"], passed, strict=True))
    assert result["FailedNodes"] == failed
    assert result["Error"] == "" and result["NodeNames"] is None


@pytest.mark.parametrize(("pod_doc", "kw", "passed", "failed"), [c[1:] for c in FILTER_CASES],
                         ids=[c[0] for c in FILTER_CASES])  # fmt: skip
def test_filter_with_node_names_from_the_cache(pod_doc, kw, passed, failed):
    s = settings(**kw)
    cache = {n: parse_node(n, d["metadata"]["labels"], d["metadata"]["annotations"]) for n, d in NODES.items()}
    args = {"Pod": pod_doc, "Nodes": None, "NodeNames": ALL}
    result = handle_filter(args, s, cache.get, now=NOW)
    assert result["NodeNames"] == passed and result["Nodes"] is None
    assert result["FailedNodes"] == failed


def test_filter_node_missing_from_the_cache():
    args = {"Pod": pod(1024), "NodeNames": ["ghost"]}
    closed = handle_filter(args, settings(), lambda n: None, now=NOW)
    assert closed["NodeNames"] == [] and "not yet in the omaticaya extender's cache" in closed["FailedNodes"]["ghost"]
    assert handle_filter(args, settings(fail_open=True), lambda n: None, now=NOW)["NodeNames"] == ["ghost"]


def test_filter_before_the_cache_synced_says_so():
    ext = Extender(settings(), lambda n: None, synced=lambda: False)
    result = ext.filter({"Pod": pod(1024), "NodeNames": ["a", "b"]})
    assert result["NodeNames"] == [] and all("not synced" in r for r in result["FailedNodes"].values())


# -------------------------------------------------------------------------- prioritize ----

FITTING = ["big", "mid", "degraded", "two"]  # free on healthy GPUs: 70000, 35000, 40000, 80000

PRIORITY_CASES = [
    # (id, pod, strategy, fitting nodes from best to worst, nodes that must score 0)
    ("binpack: least free that fits wins", pod(30720), "binpack",
     ["mid", "degraded", "big", "two"], ["small", "sick", "stale", "plain"]),
    ("spread: most free wins", pod(30720), "spread",
     ["two", "big", "degraded", "mid"], ["small", "sick", "stale", "plain"]),
    ("no annotation: all zero", pod(), "binpack", [], ALL),
    ("one fitting node gets the top score", pod(60000), "binpack",
     ["big"], [n for n in ALL if n != "big"]),
]  # fmt: skip


@pytest.mark.parametrize(("pod_doc", "strategy", "ranked", "zero"), [c[1:] for c in PRIORITY_CASES],
                         ids=[c[0] for c in PRIORITY_CASES])  # fmt: skip
def test_prioritize(pod_doc, strategy, ranked, zero):
    """Assert the ordering the strategy promises, not the formula's numbers: the best fit gets
    the top score, each next one strictly less, every fitting node more than 0, the rest 0."""
    result = handle_prioritize(args_with_nodes(pod_doc, ALL), settings(placement_policy=strategy), now=NOW)
    assert [r["Host"] for r in result] == ALL
    assert all(0 <= r["Score"] <= MAX_PRIORITY and set(r) == {"Host", "Score"} for r in result)
    score = {r["Host"]: r["Score"] for r in result}
    assert all(score[n] == 0 for n in zero)
    if ranked:
        assert score[ranked[0]] == MAX_PRIORITY
        ordered = [score[n] for n in ranked]
        assert ordered == sorted(ordered, reverse=True) and len(set(ordered)) == len(ordered), score
        assert ordered[-1] > 0


# ---------------------------------------------------------------------------- settings ----


def test_settings_defaults_and_env(monkeypatch):
    s = settings()
    assert (s.port, s.placement_policy, s.ttl_s, s.grace_s, s.fail_open, s.prefix) == (
        8888, "binpack", 300, 60, False, "omaticaya.io")  # fmt: skip
    monkeypatch.setenv("OMATICAYA_EXTENDER_STRATEGY", "Spread")
    monkeypatch.setenv("OMATICAYA_EXTENDER_FAIL_OPEN", "true")
    s = load_extender_settings()
    assert s.placement_policy == "spread" and s.fail_open


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"OMATICAYA_EXTENDER_PORT": "http"}, "invalid setting OMATICAYA_EXTENDER_PORT='http': expected an integer"),
        ({"OMATICAYA_EXTENDER_STRATEGY": "random"}, "invalid setting OMATICAYA_EXTENDER_STRATEGY='random': Input should be 'binpack' or 'spread'"),
        ({"OMATICAYA_EXTENDER_TTL_S": "0"}, "invalid setting OMATICAYA_EXTENDER_TTL_S='0': Input should be greater than 0"),
        ({"OMATICAYA_EXTENDER_FAIL_OPEN": "maybe"}, "invalid setting OMATICAYA_EXTENDER_FAIL_OPEN='maybe': expected true or false"),
        ({"OMATICAYA_EXTENDER_PREFIX": "Bad_Prefix"}, "invalid setting OMATICAYA_EXTENDER_PREFIX='Bad_Prefix': expected a DNS subdomain"),
    ],
)  # fmt: skip
def test_bad_settings_are_one_line_each(monkeypatch, env, line):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError) as err:
        load_extender_settings()
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_subcommand_flags_and_exit_status_2(capsys):
    from omaticaya_py.cli import main
    from omaticaya_py.cli.parser import build_parser

    argv = ["extender", "--strategy", "spread", "--port", "0", "--fail-open"]
    args = build_parser().parse_args(argv)
    assert (args.command, args.placement_policy, args.port, args.fail_open) == ("extender", "spread", "0", True)
    assert main(argv) == 2
    assert "OMATICAYA_EXTENDER_PORT='0'" in capsys.readouterr().err


# --------------------------------------------------------------------------------- app ----


@pytest.fixture
def client():
    cache = {n: parse_node(n, d["metadata"]["labels"], d["metadata"]["annotations"]) for n, d in NODES.items()}
    synced = {"value": True}
    ext = Extender(settings(), cache.get, clock=lambda: NOW, synced=lambda: synced["value"])
    with TestClient(create_app(ext)) as c:
        c.synced = synced  # type: ignore[attr-defined]
        yield c


def test_http_filter_and_prioritize_with_go_field_names(client):
    body = {"Pod": pod(30720), "Nodes": None, "NodeNames": ["big", "small", "mid"]}
    r = client.post("/filter", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    assert r.json() == {"Nodes": None, "NodeNames": ["big", "mid"], "FailedNodes": {"small": ROOM}, "Error": ""}
    r = client.post("/prioritize", json={"Pod": pod(30720), "NodeNames": ["big", "mid"]})
    scores = r.json()
    assert [h["Host"] for h in scores] == ["big", "mid"]
    assert scores[1]["Score"] == MAX_PRIORITY > scores[0]["Score"] > 0  # binpack: mid is tighter


def test_http_bad_json_and_readiness(client):
    assert client.post("/filter", content=b"{nope").status_code == 400
    assert client.get("/healthz").text == "ok"
    assert client.get("/readyz").status_code == 200
    client.synced["value"] = False
    assert client.get("/readyz").status_code == 503


# ------------------------------------------------------------- the chart's second scheduler ----


def test_chart_scheduler_renders_valid_manifests_with_the_extender(helm):
    from tests.chart import K8S_VERSION, render

    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render(helm, {"scheduler": {"enabled": True}, "placement": {"policy": "spread"}})
    sched = [d for d in docs if d["metadata"]["name"].endswith("-scheduler") or "scheduler-" in d["metadata"]["name"]]
    assert {d["kind"] for d in sched} == {
        "ServiceAccount", "ConfigMap", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment"}  # fmt: skip
    for doc in sched:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    config = yaml.safe_load(next(d for d in sched if d["kind"] == "ConfigMap")["data"]["config.yaml"])
    example = yaml.safe_load((REPO / "examples" / "scheduler" / "scheduler-config-v1.yaml").read_text())
    # the newest supported version renders the same configuration as K8S_VERSION (the oldest)
    docs_137 = render(helm, {"scheduler": {"enabled": True}}, "--kube-version", "1.37.2")
    config_137 = yaml.safe_load(
        next(d for d in docs_137 if d["kind"] == "ConfigMap" and "scheduler" in d["metadata"]["name"])["data"]["config.yaml"]
    )
    assert config_137["apiVersion"] == example["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"  # K8S_VERSION 1.31
    assert config["profiles"] == [{"schedulerName": "omaticaya-scheduler"}]
    assert config["extenders"] == example["extenders"]
    pod = next(d for d in sched if d["kind"] == "Deployment")["spec"]["template"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    env = {e["name"]: e["value"] for e in containers["extender"]["env"]}
    assert containers["extender"]["args"] == ["extender"]
    assert env["OMATICAYA_PLACEMENT_POLICY"] == "spread" and env["OMATICAYA_EXTENDER_PORT"] == "8888"
    assert set(env) <= env_names(ExtenderSettings)
    # the DaemonSet's selector (name + instance) must not select the scheduler pods
    ds = next(d for d in docs if d["kind"] == "DaemonSet")
    selector = ds["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= pod["metadata"]["labels"].items()


def test_chart_scheduler_is_off_by_default(helm):
    from tests.chart import render

    assert not [d for d in render(helm) if d["kind"] in ("Deployment", "ConfigMap")]

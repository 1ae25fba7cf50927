"""The extender's untrusted input, table by table: Node labels and annotations (any controller
can write them), pod annotations (any user), and the HTTP bodies the scheduler (or anyone who
reaches the port) sends. Each bad input gets a clear reason or a 4xx answer; the process keeps
serving and the good nodes beside a bad one are judged as before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from omaticaya_py.scheduler import Extender, ExtenderSettings, create_app, parse_node
from omaticaya_py.scheduler.app import MAX_BODY_BYTES
from omaticaya_py.scheduler.need import Need, parse_need
from omaticaya_py.scheduler.protocol import handle_filter, handle_prioritize

P = "omaticaya.io/"
READ_AT = "2026-01-01T00:00:00Z"
NOW = 1767225600.0 + 10  # READ_AT + 10 s
S = ExtenderSettings(_env_file=None)  # type: ignore[call-arg]
HEALTHY = {P + "gpu.health": "Healthy"}


def tele(**kw: Any) -> str:
    doc = {"read_at": READ_AT, "health": "Healthy",
           "gpus": [{"index": 0, "memory_free_mib": 40960, "health": "Healthy"}]}  # fmt: skip
    doc.update(kw)
    return json.dumps(doc)


def gpus(*items: Any) -> str:
    return tele(gpus=list(items))


def deep(n: int) -> str:
    return '{"read_at":"' + READ_AT + '","gpus":' + "[" * n + "]" * n + "}"


# (id, labels, telemetry annotation or None, passes a 1024 MiB pod, text in the reason)
NODE_CASES = [
    ("good", HEALTHY, tele(), True, ""),
    ("not JSON", HEALTHY, "{not json", False, "unreadable telemetry annotation"),
    ("JSON but a list", HEALTHY, "[1,2]", False, "unreadable telemetry annotation"),
    ("JSON string", HEALTHY, '"hello"', False, "unreadable telemetry annotation"),
    ("1 MiB", HEALTHY, tele(pad="x" * (1 << 20)), False, "over 262144 bytes"),
    ("nested 100,000 deep", HEALTHY, deep(100_000), False, "unreadable telemetry annotation"),
    ("nested 50 deep", HEALTHY, deep(50), False, "no room"),
    ("Infinity free", HEALTHY, gpus({"index": 0, "memory_free_mib": float("inf"), "health": "Healthy"}),
     False, "bad memory_free_mib"),
    ("-Infinity free", HEALTHY, gpus({"index": 0, "memory_free_mib": float("-inf"), "health": "Healthy"}),
     False, "bad memory_free_mib"),
    ("NaN free", HEALTHY, gpus({"index": 0, "memory_free_mib": float("nan"), "health": "Healthy"}),
     False, "bad memory_free_mib"),
    ("1e400 free", HEALTHY, tele().replace("40960", "1e400"), False, "bad memory_free_mib"),
    ("10^30 free", HEALTHY, tele().replace("40960", "1" + "0" * 30), False, "bad memory_free_mib"),
    ("free as text", HEALTHY, gpus({"index": 0, "memory_free_mib": "lots", "health": "Healthy"}),
     False, "bad memory_free_mib"),
    ("free as a bool", HEALTHY, gpus({"index": 0, "memory_free_mib": True, "health": "Healthy"}),
     False, "bad memory_free_mib"),
    ("negative free", HEALTHY, gpus({"index": 0, "memory_free_mib": -5, "health": "Healthy"}),
     False, "no room"),
    ("gpus not a list", HEALTHY, tele(gpus="all"), False, "no room"),
    ("gpu entries not objects", HEALTHY, tele(gpus=[1, "x", None]), False, "no room"),
    ("index as a dict", HEALTHY, gpus({"index": {}, "memory_free_mib": 40960, "health": "Healthy"}),
     False, "no room"),
    ("health as a list", {}, tele(health=["Healthy"]), False, "GPU health Unknown"),
    ("read_at a number", HEALTHY, tele(read_at=12), False, "without a valid read_at"),
    ("read_at without zone", HEALTHY, tele(read_at="2026-01-01T00:00:00"), False, "without a valid read_at"),
    ("read_at 10 kB", HEALTHY, tele(read_at="2" * 10_000), False, "without a valid read_at"),
    ("read_at year 9999 (future)", HEALTHY, tele(read_at="9999-12-31T23:59:59Z"), False,
     "read_at 9999-12-31T23:59:59Z is 251635075189s ahead of this clock (allowed skew 300s)"),
    ("read_at a year ahead", HEALTHY, tele(read_at="2027-01-01T00:00:00Z",
                                           expires_at="2027-01-01T00:05:30Z"), False,
     "ahead of this clock"),
    ("read_at 60 s ahead (within the skew)", HEALTHY, tele(read_at="2026-01-01T00:01:00Z"), True, ""),
    ("read_at year 1, zone +23:59", HEALTHY, tele(read_at="0001-01-01T00:00:00+23:59"), False,
     "without a valid read_at"),
    ("read_at and expires_at year 1", HEALTHY, tele(read_at="0001-01-01T00:00:00+23:59",
                                                    expires_at="0001-01-01T00:05:00+23:59"),
     False, "without a valid read_at"),
    ("read_at before 1970", HEALTHY, tele(read_at="1969-12-31T23:59:59Z"), False, "without a valid read_at"),
    ("expires_at year 10000 in UTC", HEALTHY, tele(expires_at="9999-12-31T23:59:59-23:59"), True, ""),
    ("1,000 GPUs", HEALTHY, gpus(*[{"index": i, "memory_free_mib": 2048, "health": "Healthy"}
                                  for i in range(1_000)]), True, ""),
    # more than a Node's annotations can hold: not from the API server, not parsed
    ("10,000 GPUs", HEALTHY, gpus(*[{"index": i, "memory_free_mib": 2048, "health": "Healthy"}
                                   for i in range(10_000)]), False, "over 262144 bytes"),
    ("health label Unhealthy", {P + "gpu.health": "Unhealthy"}, tele(), False, "GPU health Unhealthy"),
    ("labels only, free label 1e400", {**HEALTHY, P + "gpu.memory.free-mib": "1e400",
                                       P + "gpu.healthy-count": "1"}, None, False, "no telemetry annotation"),
    ("no data at all", {"kubernetes.io/hostname": "n"}, None, False, "no GPU telemetry"),
]  # fmt: skip


@pytest.mark.parametrize(("labels", "raw", "passes", "why"), [c[1:] for c in NODE_CASES],
                         ids=[c[0] for c in NODE_CASES])  # fmt: skip
def test_node_data_never_raises_and_gets_a_reason(labels, raw, passes, why):
    annotations = {} if raw is None else {P + "telemetry": raw}
    state = parse_node("bad", labels, annotations)
    good = parse_node("good", HEALTHY, {P + "telemetry": tele()})
    states = {"bad": state, "good": good}
    args = {"Pod": {"metadata": {"annotations": {P + "gpu-memory-mib": "1024"}}},
            "NodeNames": ["bad", "good"]}  # fmt: skip
    result = handle_filter(args, S, states.get, now=NOW)
    assert ("bad" in result["NodeNames"]) is passes, result
    assert "good" in result["NodeNames"]  # the node beside it is judged as before
    if not passes:
        assert why in result["FailedNodes"]["bad"], result["FailedNodes"]["bad"]
    scores = handle_prioritize(args, S, states.get, now=NOW)
    assert {s["Host"] for s in scores} == {"bad", "good"}


# (id, labels map, annotations map): what the scheduler itself may send in Nodes.items
WRONG_TYPES = [
    ("labels a list", ["a"], {}),
    ("annotations a string", HEALTHY, "telemetry"),
    ("label value a number", {P + "gpu.health": 5}, {}),
    ("telemetry a number", HEALTHY, {P + "telemetry": 5}),
    ("telemetry a dict", HEALTHY, {P + "telemetry": {"read_at": READ_AT}}),
    ("None everywhere", None, None),
]


@pytest.mark.parametrize(("labels", "annotations"), [c[1:] for c in WRONG_TYPES],
                         ids=[c[0] for c in WRONG_TYPES])  # fmt: skip
def test_node_objects_of_the_wrong_types(labels, annotations):
    state = parse_node("n", labels, annotations)  # type: ignore[arg-type]
    assert state.name == "n" and state.read_at is None


# ------------------------------------------------------------------------ pod annotations ----

MEM, COUNT = P + "gpu-memory-mib", P + "gpu-count"

# (id, annotations, Need or text expected in the error)
POD_CASES = [
    ("plain MiB", {MEM: "30720"}, Need(30720, 1)),
    ("30Gi", {MEM: "30Gi"}, Need(30720, 1)),
    ("1.5Gi", {MEM: "1.5Gi"}, Need(1536, 1)),
    ("512Mi with spaces", {MEM: " 512Mi "}, Need(512, 1)),
    ("1Ti", {MEM: "1Ti"}, Need(1 << 20, 1)),
    ("30G (decimal) rounds up to whole MiB", {MEM: "30G"}, Need(28611, 1)),
    ("0", {MEM: "0"}, Need(0, 1)),
    ("-1", {MEM: "-1"}, "not a memory size"),
    ("-1Gi", {MEM: "-1Gi"}, "not a memory size"),
    ("1e400", {MEM: "1e400"}, "not a memory size"),
    ("1e3 (bytes as a quantity)", {MEM: "1e3"}, "not a memory size"),
    ("1.5 (plain MiB must be whole)", {MEM: "1.5"}, "not a memory size"),
    ("100m", {MEM: "100m"}, "not a memory size"),
    ("lots", {MEM: "lots"}, "not a memory size"),
    ("empty", {MEM: ""}, "not a memory size"),
    ("1 EiB and more", {MEM: "2Ei"}, "more than"),
    ("10,000 GPUs", {MEM: "1024", COUNT: "10000"}, Need(1024, 10000)),
    ("count 0", {MEM: "1024", COUNT: "0"}, "not a whole number from 1"),
    ("count -1", {MEM: "1024", COUNT: "-1"}, "not a whole number from 1"),
    ("count 1e400", {MEM: "1024", COUNT: "1e400"}, "not a whole number from 1"),
    ("count 2.5", {MEM: "1024", COUNT: "2.5"}, "not a whole number from 1"),
    ("count 10^30", {MEM: "1024", COUNT: "1" + "0" * 30}, "not a whole number from 1"),
    ("count as a JSON number", {MEM: "1024", COUNT: 2}, Need(1024, 2)),
    ("memory as a JSON number", {MEM: 2048}, Need(2048, 1)),
    ("memory 1 MB of digits", {MEM: "9" * (1 << 20)}, "not a memory size"),
]  # fmt: skip


@pytest.mark.parametrize(("annotations", "expected"), [c[1:] for c in POD_CASES],
                         ids=[c[0] for c in POD_CASES])  # fmt: skip
def test_pod_annotations(annotations, expected):
    got = parse_need({"metadata": {"annotations": annotations}})
    if isinstance(expected, str):
        assert got is not None and expected in (got.error or ""), got
        assert len(got.error or "") < 300  # the value is quoted, cut short
    else:
        assert got == expected


def test_ten_thousand_gpus_fit_nowhere_with_the_reason():
    args = {"Pod": {"metadata": {"annotations": {MEM: "1024", COUNT: "10000"}}}, "NodeNames": ["good"]}
    good = parse_node("good", HEALTHY, {P + "telemetry": tele()})
    result = handle_filter(args, S, {"good": good}.get, now=NOW)
    assert result["FailedNodes"] == {"good": "node(s) had no room: pod needs 10000 GPUs with 1024 MiB free (omaticaya.io)"}


@pytest.mark.parametrize("pod", [None, 5, "pod", [], {"metadata": 5}, {"metadata": {"annotations": ["x"]}}])
def test_pods_of_the_wrong_shape_have_no_need(pod):
    assert parse_need(pod) is None  # type: ignore[arg-type]


# ------------------------------------------------------------------------- HTTP bodies ----


@pytest.fixture
def client():
    good = parse_node("good", HEALTHY, {P + "telemetry": tele()})
    ext = Extender(S, {"good": good}.get, clock=lambda: NOW)
    with TestClient(create_app(ext), raise_server_exceptions=False) as c:
        yield c


POD = {"metadata": {"annotations": {MEM: "1024"}}}

# (id, body bytes, status, text in the answer)
BODIES = [
    ("not JSON", b"{nope", 400, "not JSON"),
    ("empty", b"", 400, "not JSON"),
    ("not UTF-8", b"\xff\xfe{", 400, "not JSON"),
    ("a list", b"[1,2]", 400, "not a JSON object"),
    ("a string", b'"x"', 400, "not a JSON object"),
    ("NodeNames a string", json.dumps({"Pod": POD, "NodeNames": "good"}).encode(), 400, "NodeNames"),
    ("NodeNames of numbers", json.dumps({"Pod": POD, "NodeNames": [1, 2]}).encode(), 400, "NodeNames"),
    ("Nodes a list", json.dumps({"Pod": POD, "Nodes": [1]}).encode(), 400, "Nodes"),
    ("Nodes.items a string", json.dumps({"Pod": POD, "Nodes": {"items": "x"}}).encode(), 400, "Nodes"),
    ("Nodes.items of numbers", json.dumps({"Pod": POD, "Nodes": {"items": [5]}}).encode(), 400, "Nodes"),
    ("Pod a number", json.dumps({"Pod": 5, "NodeNames": ["good"]}).encode(), 200, ""),
    ("neither Nodes nor NodeNames", json.dumps({"Pod": POD}).encode(), 200, ""),
    ("a node name with a lone surrogate (orjson refuses it: the standard encoder answers)",
     b'{"Pod":' + json.dumps(POD).encode() + b',"NodeNames":["good","bad\\ud800"]}', 200,
     "bad\\ud800"),
    ("nested 100,000 deep", b'{"Pod":' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "not JSON"),
    ("10 MB of junk", b"x" * (10 << 20), 400, "not JSON"),
    ("over the limit", b"[" + b" " * (MAX_BODY_BYTES + 10) + b"]", 413, "larger than"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "text"), [c[1:] for c in BODIES], ids=[c[0] for c in BODIES])
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_http_bodies(client, verb, body, status, text):
    r = client.post(f"/{verb}", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text[:300]
    assert text in r.text
    # and it keeps serving
    ok = client.post("/filter", json={"Pod": POD, "NodeNames": ["good"]})
    assert ok.status_code == 200 and ok.json()["NodeNames"] == ["good"]


@pytest.mark.slow  # ten megabytes through the real HTTP stack
def test_ten_megabytes_of_node_names_are_answered(client):
    names = [f"node-{i:07d}" for i in range(700_000)]  # ~11 MB of JSON
    body = json.dumps({"Pod": POD, "NodeNames": ["good", *names]}).encode()
    assert len(body) > 10_000_000
    r = client.post("/filter", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    result = r.json()
    assert result["NodeNames"] == ["good"] and len(result["FailedNodes"]) == len(names)

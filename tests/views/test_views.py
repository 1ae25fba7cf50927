"""``omaticaya top``'s pure parts: Nodes -> rows, sort, filter, JSON and the rendered table
(table-driven; the command against the real API server is in tests/views/test_views_cluster.py)."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omaticaya_py.core import schema
from omaticaya_py.core.publish.patch import NodeMeta
from omaticaya_py.core.rules.liveness import LeaseState, Seen
from omaticaya_py.views import fleet
from omaticaya_py.views.top import TopOptions, render, select_rows, top_options

P = "omaticaya.io/"
NOW = 1_800_000_000.0


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu(index: int, free: int = 40960, health: str = "Healthy", **extra) -> dict:
    return {
        "index": index,
        "uuid": f"GPU-{index:08x}-7fda-b7ae-a94e-630097a14ca4",
        "memory_free_mib": free,
        "memory_total_mib": 81559,
        "utilization_pct": 50.0,
        "temperature_c": 50 + index,
        "power_w": 300.0,
        "process_count": 1,
        "health": health,
        "reasons": [] if health == "Healthy" else ["xid-79"],
        **extra,
    }


def telemetry(gpus: list, *, read_at: float = NOW - 5, refresh_s: float | None = 330) -> str:
    doc = {"schema": 2, "health": "Healthy", "read_at": stamp(read_at), "gpus": gpus}
    if refresh_s is not None:
        doc["refresh_s"] = refresh_s
        doc["expires_at"] = stamp(read_at + refresh_s)
    return json.dumps(doc)


def labels(**kv: str) -> dict[str, str]:
    base = {
        "gpu.count": "2",
        "gpu.healthy-count": "2",
        "gpu.health": "Healthy",
        "gpu.memory.free-mib": "40960",
        "gpu.memory.total-mib": "81559",
        "gpu.utilization-pct": "50",
        "gpu.product": "NVIDIA-H100-80GB-HBM3",
    }
    base.update({k.replace("_", "."): v for k, v in kv.items()})
    return {P + k: v for k, v in base.items()}


GOOD = telemetry([gpu(0), gpu(1, free=20480)])

CASES = [
    # id, labels, annotations, expected fields of the row
    ("healthy", labels(), {P + "telemetry": GOOD},
     dict(health="Healthy", gpus=2, healthy=2, free_mib=40960, util_pct=50.0, stale=False,
          problem=None, age_s=5.0, temperature_c=51)),
    ("degraded", labels(**{"gpu.health": "Degraded", "gpu.healthy-count": "1"}),
     {P + "telemetry": telemetry([gpu(0), gpu(1, health="Unhealthy", utilization_pct=90.0)])},
     dict(health="Degraded", gpus=2, healthy=1, util_pct=50.0, stale=False)),
    ("stale past expires_at + grace", labels(),
     {P + "telemetry": telemetry([gpu(0)], read_at=NOW - 400, refresh_s=330)},
     dict(stale=True, age_s=400.0)),
    ("not stale within the grace", labels(),
     {P + "telemetry": telemetry([gpu(0)], read_at=NOW - 380, refresh_s=330)},
     dict(stale=False)),
    ("no expires_at: the TTL", labels(),
     {P + "telemetry": telemetry([gpu(0)], read_at=NOW - 361, refresh_s=None)},
     dict(stale=True)),
    ("labels only (no telemetry)", labels(**{"gpu-0.memory.free-mib": "1024",
                                             "gpu-0.health": "Healthy",
                                             "gpu-0.utilization-pct": "30"}), {},
     dict(health="Healthy", age_s=None, stale=False, util_pct=30.0)),
    ("not JSON", labels(), {P + "telemetry": "{not json"},
     dict(health="Invalid", problem="unreadable telemetry annotation")),
    ("no read_at", labels(), {P + "telemetry": json.dumps({"gpus": []})},
     dict(health="Invalid", problem="telemetry annotation without a valid read_at")),
    ("bad numbers", labels(**{"gpu.count": "many", "gpu.memory.free-mib": "1e9"}),
     {P + "telemetry": telemetry([gpu(0, free="lots", utilization_pct=True), "x", {"index": "y"}])},
     dict(health="Invalid", gpus=1, free_mib=None)),
    ("huge telemetry", labels(), {P + "telemetry": " " * (schema.MAX_TELEMETRY_BYTES + 1)},
     dict(health="Invalid")),
    ("no data", {"kubernetes.io/hostname": "x"}, {}, dict(health="-", known=False)),
    ("telemetry only", {}, {P + "telemetry": GOOD},
     dict(health="Healthy", gpus=2, healthy=2, free_mib=40960)),
]


@pytest.mark.parametrize(("labels_", "annotations", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_node_row(labels_, annotations, expected):
    row = fleet.node_row("n1", labels_, annotations, fleet.RowContext(now=NOW))
    got = {k: getattr(row, k) for k in expected}
    assert got == expected


REF = "omaticaya/omaticaya-node-n1"


class Leases:
    """``fleet.LeaseView`` over a dict: the namespaces in ``watched`` are read."""

    def __init__(self, leases: dict, watched: tuple[str, ...] = ("omaticaya",)) -> None:
        self.leases, self.namespaces = leases, watched

    def watched(self, ref: str) -> bool:
        return ref.partition("/")[0] in self.namespaces

    def lease(self, ref: str):
        return self.leases.get(ref)


def quiet(read_at: float = NOW - 7200, **extra) -> dict[str, str]:
    """A Lease-mode node whose labels last changed two hours ago."""
    doc = json.loads(telemetry([gpu(0)], read_at=read_at, refresh_s=None))
    return {P + "telemetry": json.dumps({**doc, "lease": REF, **extra})}


# id, annotations, Leases (None: not read), expected fields of the row
LEASE_CASES = [
    ("Lease renewed: fresh though labels are 2 h old", quiet(),
     Leases({REF: LeaseState("agent", NOW - 10, 40)}), dict(stale=False, age_s=7200.0, problem=None)),
    ("Lease lapsed", quiet(), Leases({REF: LeaseState("agent", NOW - 101, 40)}),
     dict(stale=True, stale_why=f"Lease {REF} expired at {stamp(NOW - 61)}, grace 60s")),
    ("Lease released", quiet(), Leases({REF: LeaseState("", NOW - 1, 40)}),
     dict(stale=True, stale_why=f"Lease {REF} released (no holder)")),
    ("Lease missing", quiet(), Leases({}), dict(stale=True, stale_why=f"Lease {REF} not found")),
    ("Leases of that namespace not read: read_at", quiet(), Leases({}, watched=()),
     dict(stale=True, stale_why=f"{P}telemetry read_at older than 360s")),
    ("Lease renewTime a year ahead", quiet(), Leases({REF: LeaseState("agent", NOW + 365 * 86400, 40)}),
     dict(stale=False, health="Invalid")),
    ("read_at a year ahead", quiet(read_at=NOW + 365 * 86400), None, dict(stale=False, health="Invalid")),
]  # fmt: skip


@pytest.mark.parametrize(("annotations", "leases", "expected"),
                         [c[1:] for c in LEASE_CASES], ids=[c[0] for c in LEASE_CASES])  # fmt: skip
def test_node_row_by_the_extenders_rule(annotations, leases, expected):
    row = fleet.node_row("n1", labels(), annotations, fleet.RowContext(now=NOW, leases=leases))
    assert {k: getattr(row, k) for k in expected} == expected
    assert row.stale == (row.stale_why is not None)


def test_a_node_ahead_of_the_clock_shows_why():
    row = fleet.node_row("n1", labels(), quiet(read_at=NOW + 365 * 86400), fleet.RowContext(now=NOW))
    assert row.problem.startswith(f"{P}telemetry read_at {stamp(NOW + 365 * 86400)} is 31536000s ahead")
    row = fleet.node_row("n1", labels(), {P + "telemetry": telemetry([gpu(0)]).replace(
        stamp(NOW - 5), "0001-01-01T00:00:00+23:59")}, fleet.RowContext(now=NOW))  # fmt: skip
    assert row.problem == "telemetry annotation without a valid read_at" and not row.stale


def test_an_agent_behind_by_10_minutes_is_fresh_while_top_sees_it_change():
    """``top --watch`` saw ``read_at`` change 5 s ago on its own clock."""
    ann = {P + "telemetry": telemetry([gpu(0)], read_at=NOW - 605, refresh_s=330)}
    assert fleet.node_row("n1", labels(), ann, fleet.RowContext(now=NOW)).stale
    row = fleet.node_row("n1", labels(), ann, fleet.RowContext(now=NOW, now_mono=100.0), seen=Seen(95.0, True))
    assert not row.stale


@pytest.mark.parametrize("hostile", [
    None, {P + "telemetry": None}, {P + "telemetry": 7}, {P + "telemetry": "[]"},
    {P + "telemetry": "[" * 100_000}, {P + "telemetry": '{"read_at": 5, "gpus": 5}'},
    {P + "telemetry": '{"read_at": "2026-01-01T00:00:00Z", "gpus": [{"index": 1e400}]}'},
    {P + "telemetry": '{"read_at": "2026-01-01T00:00:00", "expires_at": "soon"}'},
    {P + "telemetry": '{"read_at": "0001-01-01T00:00:00+23:59", "lease": "a/b",'
                      ' "expires_at": "0001-01-01T00:05:00+23:59"}'},
])
def test_hostile_telemetry_never_raises_and_renders(hostile):
    row = fleet.node_row("n1", {P + "gpu.health": "Healthy"}, hostile, fleet.RowContext(now=NOW))
    text = _text([row], TopOptions()) + _text([row], TopOptions(gpus=True, output="wide"))
    assert "n1" in text
    json.dumps(fleet.to_json([row]))


def test_gpu_rows_from_telemetry():
    row = fleet.node_row("n1", labels(), {P + "telemetry": GOOD}, fleet.RowContext(now=NOW))
    assert [(g.index, g.free_mib, g.health, g.processes) for g in row.gpu_rows] == [
        (0, 40960, "Healthy", 1), (1, 20480, "Healthy", 1)]
    assert fleet.short_uuid(row.gpu_rows[0].uuid) == "00000000"


def test_gpu_rows_name_the_pods_holding_them():
    held = gpu(0, pods=[{"namespace": "ml", "pod": "train-0", "container": "trainer",
                          "memory_used_mib": 30720}], memory_out_of_band_mib=6144)
    mig = gpu(1, mig_enabled=True, mig_devices=[
        {"index": 0, "pods": [{"namespace": "a", "pod": "x", "container": "c"}]},
        {"index": 1, "pods": [{"namespace": "a", "pod": "x", "container": "d"},
                              {"namespace": "b", "pod": "y", "container": "c"}]},
        {"index": 2, "pods": [{"namespace": 5, "pod": None}]},  # untrusted: skipped
    ])
    row = fleet.node_row("n1", labels(), {P + "telemetry": telemetry([held, mig])}, fleet.RowContext(now=NOW))
    assert [(g.pods, g.out_of_band_mib) for g in row.gpu_rows] == [
        (("ml/train-0",), 6144), (("a/x", "b/y"), None)]
    text = _text([row], TopOptions(gpus=True), width=160)
    assert "ml/train-0 +6.0GiB out-of-band" in text and "a/x,b/y" in text
    assert fleet.to_json([row])["nodes"][0]["gpus"][0]["pods"] == ["ml/train-0"]


def test_gpu_rows_show_used_and_limit_of_slices_on_shared_gpus():
    """Issue 25: on a shared GPU, ``top --gpus`` shows each slice's used/limit (``OVER`` when
    a pod holds more than it asked for); a whole GPU's holders show as before."""
    shared = gpu(0, shared=True, share_units=79, pods=[
        {"namespace": "ml", "pod": "a", "container": "s", "limit_mib": 8192,
         "memory_used_mib": 10240, "over_limit": True},
        {"namespace": "ml", "pod": "b", "container": "s", "limit_mib": 20480},  # use unknown
        {"namespace": "ml", "pod": "c", "container": "s", "limit_mib": "x"},  # untrusted
    ])
    whole = gpu(1, pods=[{"namespace": "ml", "pod": "t", "container": "c",
                          "memory_used_mib": 30720}])
    row = fleet.node_row("n1", labels(), {P + "telemetry": telemetry([shared, whole])}, fleet.RowContext(now=NOW))
    g0, g1 = row.gpu_rows
    assert g0.shared and not g1.shared and g1.slices == ()
    assert g0.slices == (
        fleet.SliceRow("ml/a", "s", 8192, 10240, True), fleet.SliceRow("ml/b", "s", 20480),
    )
    text = _text([row], TopOptions(gpus=True), width=200)
    assert "ml/a 10.0/8.0GiB OVER,ml/b -/20.0GiB" in text and "shared" in text
    assert "ml/t" in text
    doc = fleet.to_json([row])["nodes"][0]["gpus"][0]
    assert doc["shared"] is True and doc["slices"][0] == {
        "pod": "ml/a", "container": "s", "limit_mib": 8192, "used_mib": 10240, "over": True}


@pytest.mark.parametrize(("uuid", "short"), [
    ("GPU-178dd196-7fda-b7ae", "178dd196"), ("MIG-abc-def", "abc"), ("plain", "plain"),
    (None, None), ("", None), ("GPU-", None),
])
def test_short_uuid(uuid, short):
    assert fleet.short_uuid(uuid) == short


def _row(name, free=None, util=None, age=None, stale=False, health="Healthy"):
    return fleet.NodeRow(name=name, health=health, free_mib=free, util_pct=util, age_s=age,
                         stale=stale)


ROWS = [_row("b", 100, 10, 5), _row("a", 300, None, 50, stale=True),
        _row("c", None, 90, None, health="Unhealthy"), _row("d", 300, 50, 1)]


@pytest.mark.parametrize(("by", "order"), [
    ("name", "abcd"), ("free", "adbc"), ("util", "cdba"), ("age", "abdc"),
])
def test_sort(by, order):
    assert "".join(r.name for r in fleet.sort_rows(ROWS, by)) == order


def test_sort_rejects_unknown():
    with pytest.raises(ValueError, match="sort by one of"):
        fleet.sort_rows(ROWS, "temperature")


@pytest.mark.parametrize(("unhealthy", "stale", "names"), [
    (False, False, "bacd"), (True, False, "c"), (False, True, "a"), (True, True, "ac"),
])
def test_filter(unhealthy, stale, names):
    assert "".join(r.name for r in fleet.filter_rows(ROWS, unhealthy=unhealthy, stale=stale)) == names


def test_fleet_rows_hides_nodes_without_data_unless_asked():
    nodes = [NodeMeta("plain", labels={"x": "y"}),
             NodeMeta("gpu", labels=labels(), annotations={P + "telemetry": GOOD}),
             NodeMeta("bad", annotations={P + "telemetry": "nope"})]
    assert [r.name for r in fleet.fleet_rows(nodes, fleet.RowContext(now=NOW))] == ["bad", "gpu"]
    assert [r.name for r in fleet.fleet_rows(nodes, fleet.RowContext(now=NOW), include_unknown=True)] == [
        "bad", "gpu", "plain"]
    assert [r.name for r in select_rows(nodes, TopOptions(unhealthy=True), NOW)] == ["bad"]


def test_prefix_is_honoured():
    nodes = [NodeMeta("n", labels={"example.com/gpu.health": "Healthy",
                                   "example.com/gpu.count": "1"})]
    assert fleet.fleet_rows(nodes, fleet.RowContext(now=NOW)) == []
    assert fleet.fleet_rows(nodes, fleet.RowContext(now=NOW, prefix="example.com"))[0].gpus == 1


def test_json_shape():
    row = fleet.node_row("n1", labels(), {P + "telemetry": GOOD}, fleet.RowContext(now=NOW))
    doc = fleet.to_json([row])
    node = doc["nodes"][0]
    assert node["name"] == "n1" and node["gpu_count"] == 2 and node["unhealthy"] is False
    assert node["gpus"][1]["free_mib"] == 20480
    assert node["gpus"][0]["uuid_short"] == "00000000" and node["gpus"][0]["reasons"] == []


def _text(rows, options, width=80):
    buf = io.StringIO()
    from rich.console import Console

    Console(file=buf, width=width, color_system=None, no_color=True).print(render(rows, options))
    return buf.getvalue()


@pytest.mark.parametrize("gpus", [False, True])
def test_table_fits_80_columns_with_long_names(gpus):
    rows = [
        fleet.node_row("ip-10-0-12-34.eu-west-1.compute.internal-with-a-very-long-suffix",
                       labels(), {P + "telemetry": GOOD}, fleet.RowContext(now=NOW)),
        fleet.node_row("stale-node", labels(),
                       {P + "telemetry": telemetry([gpu(0)], read_at=NOW - 7200)},
                       fleet.RowContext(now=NOW)),
    ]
    text = _text(rows, TopOptions(gpus=gpus))
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "\x1b" not in text
    assert "STALE" in text if not gpus else "stale-node" in text


def test_node_table_cells():
    row = fleet.node_row("n1", labels(), {P + "telemetry": GOOD}, fleet.RowContext(now=NOW))
    lines = _text([row], TopOptions()).splitlines()
    assert lines[0].split() == ["NODE", "HEALTH", "GPUS", "FREE", "TOTAL", "UTIL", "TEMP", "AGE"]
    assert lines[2].split() == ["n1", "Healthy", "2/2", "40.0Gi", "79.6Gi", "50%", "51C", "5s"]


def test_empty_says_so():
    assert "No nodes with Omaticaya GPU data." in _text([], TopOptions())


@pytest.mark.parametrize(("flags", "env", "expected"), [
    ({"output": "json", "command": "top", "prefix": None}, {}, dict(output="json",
                                                                    prefix="omaticaya.io")),
    ({"prefix": None}, {"OMATICAYA_PREFIX": "example.com"}, dict(prefix="example.com")),
    ({"prefix": "x.io", "selector": "a=b"}, {"OMATICAYA_PREFIX": "y"}, dict(prefix="x.io",
                                                                            selector="a=b")),
])
def test_top_options(flags, env, expected):
    options = top_options(flags, env)
    assert {k: getattr(options, k) for k in expected} == expected


# -- run_top with a stand-in feed (the real one, a kube.NodeCache: tests/views/test_views_cluster.py) --


class FakeFeed:
    """Built from the options (``selector`` kept); ``start`` answers the first of ``script``
    (the Nodes listed, or an exception to raise), each ``changes`` the next (a batch of
    ``(name, node or None)``); past the script, the command ends with Ctrl-C."""

    def __init__(self, script):
        self.script = list(script)
        self.calls: list[tuple] = []

    def __call__(self, options):
        self.calls.append(("feed", options.selector))
        return self

    def start(self):
        got = self.script.pop(0)
        if isinstance(got, Exception):
            raise got
        self.calls.append(("list",))
        return {n.name: n for n in got}

    def changes(self, timeout_s):
        self.calls.append(("changes", timeout_s))
        if not self.script:
            raise KeyboardInterrupt
        return self.script.pop(0)

    def close(self):
        self.calls.append(("close",))


def _node(name, util=50.0, read_at=NOW - 5):
    return NodeMeta(name, labels=labels(), annotations={
        P + "telemetry": telemetry([gpu(0, utilization_pct=util)], read_at=read_at)})


def _run(options, feed):
    from omaticaya_py.views.top import run_top

    out, err = io.StringIO(), io.StringIO()
    code = run_top(options, stdout=out, stderr=err, clock=lambda: NOW, feeds=feed)
    return code, out.getvalue(), err.getvalue()


def test_run_top_once_json_and_table():
    feed = FakeFeed([[_node("a"), _node("b", 10.0)]])
    code, out, _ = _run(TopOptions(output="json", selector="x=y", sort="util"), feed)
    assert code == 0 and [n["name"] for n in json.loads(out)["nodes"]] == ["a", "b"]
    assert feed.calls == [("feed", "x=y"), ("list",), ("close",)]
    code, out, _ = _run(TopOptions(), FakeFeed([[_node("a")]]))
    assert code == 0 and out.splitlines()[2].split()[:2] == ["a", "Healthy"]


def test_watch_redraws_on_changes_and_every_interval_and_ends_on_ctrl_c():
    a90, b = _node("a", 90.0), _node("b")
    feed = FakeFeed([
        [_node("a")],
        [("a", a90)],
        [("b", b)],
        [("b", None)],
        [("a", _node("a", 1.0)), ("c", _node("c"))],  # the cache listed again (a 410)
        [],  # no change within the interval: a redraw (ages move on)
        [("a", None), ("c", None), ("d", _node("d"))],  # listed again after a dropped watch
    ])
    code, out, _ = _run(TopOptions(output="json", watch=True, interval_s=5), feed)
    assert code == 0
    draws = [[(n["name"], n["util_pct"]) for n in json.loads(line)["nodes"]]
             for line in out.splitlines()]
    assert draws == [
        [("a", 50.0)],
        [("a", 90.0)],
        [("a", 90.0), ("b", 50.0)],
        [("a", 90.0)],
        [("a", 1.0), ("c", 50.0)],  # listed again after the 410
        [("a", 1.0), ("c", 50.0)],  # the quiet interval
        [("d", 50.0)],  # listed again after the dropped watch
    ]
    assert [c[1] for c in feed.calls if c[0] == "changes"] == [5] * 7
    assert feed.calls[-1] == ("close",)


def test_api_failure_is_one_line_and_status_1():
    from omaticaya_py.kube import KubeForbidden

    feed = FakeFeed([KubeForbidden("list nodes: HTTP 403 Forbidden (omaticaya top needs "
                                   "list and watch on nodes)", status=403)])
    code, out, err = _run(TopOptions(), feed)
    assert code == 1 and out == ""
    assert err == ("omaticaya top: list nodes: HTTP 403 Forbidden (omaticaya top needs list "
                   "and watch on nodes)\n")


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=12,
)
_gpu_docs = st.fixed_dictionaries({}, optional={
    k: _json_values for k in ("index", "uuid", "memory_free_mib", "memory_total_mib",
                              "utilization_pct", "temperature_c", "process_count", "health",
                              "reasons", "mig_enabled", "mig_devices")})


@settings(max_examples=150, deadline=None)
@given(
    label_values=st.dictionaries(
        st.sampled_from(["gpu.count", "gpu.health", "gpu.healthy-count", "gpu.memory.free-mib",
                         "gpu.utilization-pct", "gpu-0.health", "gpu-0.memory.free-mib",
                         "gpu-x.health", "gpu-99999999999999999999.health"]),
        st.text(max_size=12), max_size=6),
    doc=st.fixed_dictionaries({}, optional={
        "read_at": st.sampled_from(["2026-11-23T13:00:00Z", "yesterday", 5, None]),
        "expires_at": st.sampled_from(["2026-11-23T13:05:00Z", "2099-01-01T00:00:00Z", 7]),
        "gpus": st.lists(_gpu_docs, max_size=3) | _json_values,
        "health": _json_values,
    }),
)
def test_any_node_content_renders(label_values, doc):
    annotations = {P + "telemetry": json.dumps(doc)}
    row = fleet.node_row("n", {P + k: v for k, v in label_values.items()}, annotations, fleet.RowContext(now=NOW))
    for options in (TopOptions(), TopOptions(gpus=True), TopOptions(output="wide")):
        assert "n" in _text([row], options, width=200 if options.output == "wide" else 80)
    json.dumps(fleet.to_json([row]), allow_nan=False)


class _FakeLeaseCache:
    """Beside the real ``kube.LeaseCache`` (tests/views/test_views_cluster.py): synced at once, or
    failing at once with ``fail``."""

    fail: str | None = None

    def __init__(self, transform, namespace, *, on_error, **kw) -> None:
        self.namespace, self.on_error, self.synced, self.stopped = namespace, on_error, False, False

    def start(self):
        if self.fail:
            from omaticaya_py.kube import KubeError

            self.on_error(KubeError(self.fail))
        else:
            self.synced = True
        return self

    def wait_synced(self, timeout_s):
        return self.synced

    def lease(self, ref):
        return None

    def stop(self, timeout_s=5.0):
        self.stopped = True


def test_top_reads_at_most_a_few_namespaces_of_leases():
    """The nodes' telemetry is untrusted: 20 namespaces named start 8 list+watches, one line."""
    from omaticaya_py.views.leases import MAX_NAMESPACES, TopLeases

    said: list[str] = []
    leases = TopLeases(warn=said.append, factory=_FakeLeaseCache)
    leases.follow(f"ns-{i:02d}" for i in range(20))
    leases.follow(f"ns-{i:02d}" for i in range(20))  # again: nothing new, nothing said
    assert [leases.watched(f"ns-{i:02d}/x") for i in range(20)] == [True] * MAX_NAMESPACES + [False] * 12
    assert said == ["Leases in 12 more namespaces not read (at most 8): their nodes judged by read_at"]


def test_top_says_once_when_leases_cannot_be_read():
    from omaticaya_py.views.leases import TopLeases

    class Refused(_FakeLeaseCache):
        fail = "list leases: HTTP 403 Forbidden"

    said: list[str] = []
    leases = TopLeases(warn=said.append, factory=Refused)
    leases.follow(["agents"])
    leases.follow(["agents"])
    assert not leases.watched("agents/omaticaya-node-a") and leases.lease("agents/x") is None
    assert said == ["Leases in agents not read (list leases: HTTP 403 Forbidden): its nodes judged by read_at"]

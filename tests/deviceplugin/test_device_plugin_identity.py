"""Issue 48, item 1, the device plugin's half: its device IDs are UUIDs, and a GPU whose UUID
NVML does not give in a reading is never guessed from an NVML index that two known GPUs held
(omaticaya_py/deviceplugin/inventory.py; pure, on the agent's reading as ``TickResult``).

The "reboot": GPUs A and B known at indices 3 and 4 (a trace's, or an earlier reading's); the
node comes back without A, B renumbered 3.

And the report of a shared index that names another GPU than at the last start (the DRA
plugin's, made by the device plugin too): the persisted map's form (``core.model.sharing``), the step
(``sources.gpu_indices.check_indices``) as a table, and ``DevicePluginSet``'s start in-process."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from loguru import logger

from omaticaya_py.core.model.sharing import (
    INDICES_FORM,
    IndexMoved,
    gpu_indices,
    parse_indices,
    parse_shared_gpus,
    unit_gpu,
)
from omaticaya_py.core.publish.readings import TickResult
from omaticaya_py.deviceplugin import DevicePluginSet
from omaticaya_py.deviceplugin.config import INDICES_FILE, PluginConfig, Scope, SharingConfig
from omaticaya_py.deviceplugin.inventory import Inventory
from omaticaya_py.deviceplugin.service import CacheFeed
from omaticaya_py.kube.index_moved import MovedGauge
from omaticaya_py.sources.gpu_indices import check_indices, load_indices, save_indices
from tests.helpers import evaluate, gpu, lost, snapshot
from tests.helpers import settings as helper_settings
from tests.waiting import wait_for

A = "GPU-0000000a-7fda-b7ae-a94e-630097a14ca4"
B = "GPU-0000000b-7fda-b7ae-a94e-630097a14ca4"


@dataclass
class Cache:
    last: TickResult | None = None


def states(*readings: list[object]) -> dict[str, tuple[int, bool, tuple[str, ...]]]:
    """The inventory of whole GPUs known as A at 3 and B at 4, after each of ``readings`` (the
    GPUs of one tick) in turn: device ID -> (index, healthy, reasons)."""
    cache = Cache()
    inv = Inventory(cache, Scope(), devices=[(3, A), (4, B)])
    got: dict[str, tuple[int, bool, tuple[str, ...]]] = {}
    for gpus in readings:
        snap = snapshot(*gpus)  # type: ignore[arg-type]
        health, desired = evaluate(snap)
        cache.last = TickResult(snap, health, desired, None, False)
        got = {s.id: (s.index, s.healthy, s.reasons) for s in inv.devices()}
    return got


# (case, the readings after the reboot, what each known device's state is after the last)
CASES = [
    ("B renumbered 3, A gone", [[gpu(3, uuid=B)]], {A: (3, False, ("absent",)), B: (3, True, ())}),
    # a GPU at index 4 with no UUID: the one GPU known there, B, is read at 3 now: not B's (before
    # the fix B took that GPU's state, Unhealthy, though read healthy at 3)
    ("a UUID-less GPU at B's old index", [[gpu(3, uuid=B), lost(4, uuid=None)]],
     {A: (3, False, ("absent",)), B: (3, True, ())}),
    # B seen at 3, then a UUID-less GPU at 3: A and B both held index 3, neither is guessed
    ("a UUID-less GPU where two were", [[gpu(3, uuid=B)], [lost(3, uuid=None)]],
     {A: (3, False, ("absent",)), B: (3, False, ("absent",))}),
]  # fmt: skip


@pytest.mark.parametrize(("readings", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_uuidless_gpu_is_never_guessed_from_a_shifted_index(readings, want) -> None:
    got = states(*readings)
    assert {k: v[:2] for k, v in got.items()} == {k: v[:2] for k, v in want.items()}
    for k, (_, _, reasons) in want.items():
        assert set(reasons) <= set(got[k][2]), (k, got[k])


def test_a_uuidless_gpu_at_its_own_index_is_still_its_own() -> None:
    """Within one boot a GPU whose UUID read failed is the one known GPU at its index."""
    got = states([lost(3, uuid=None), gpu(4, uuid=B)])
    assert got[A][:2] == (3, False) and "lost" in got[A][2]


# -- a shared GPU index that names another GPU than at the last start ------------------------
#
# The device plugin's half of the report the DRA plugin makes (tests/dra/test_dra_plugin.py): the
# map of the last start is <device-plugins dir>/omaticaya-gpu-indices.json; a start whose first
# readable reading shows another GPU at a shared index logs it, sets the gauge and reports it
# (the Event SharedGpuIndexMoved through kube.index_moved.post_index_moved, whose document on the
# real kube-apiserver is checked by test_dra_plugin.py::test_a_moved_shared_index_is_an_event_on_the_node).

C = "GPU-0000000c-7fda-b7ae-a94e-630097a14ca4"

# (case, the JSON document read back, the map it gives or the error's start)
INDEX_DOCS = [
    ("two GPUs", {"version": 1, "gpus": {"0": A, "1": B}}, {0: A, 1: B}),
    ("none", {"version": 1, "gpus": {}}, {}),
    ("a bad index or UUID left out", {"version": 1, "gpus": {"x": A, "-1": A, "12345": A, "2": 7, "3": C}},
     {3: C}),
    ("another version", {"version": 2, "gpus": {"0": A}}, "not a version 1 file"),
    ("gpus a list", {"version": 1, "gpus": [A]}, "not a version 1 file"),
    ("a list", [A], "not a version 1 file"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "want"), [c[1:] for c in INDEX_DOCS], ids=[c[0] for c in INDEX_DOCS]
)
def test_parse_indices(doc: object, want: object) -> None:
    if isinstance(want, str):
        with pytest.raises(ValueError, match=want) as err:
            parse_indices(doc)
        assert INDICES_FORM in str(err.value)
    else:
        assert parse_indices(doc) == want


def test_gpu_indices_leaves_out_a_gpu_without_uuid() -> None:
    assert gpu_indices([gpu(3, uuid=B), lost(4, uuid=None), gpu(5, uuid=C)]) == {3: B, 5: C}


# (case, OMATICAYA_SHARED_GPUS, the last start's map (None: no file), the GPUs now, moved, log lines)
CHECKS = [
    ("A lost: index 0 is B now", "0", {0: A, 1: B}, {0: B}, [IndexMoved(0, A, B)], 1),
    ("by UUID: never reported", A.lower(), {0: A, 1: B}, {0: B}, [], 0),
    ("all: never reported", "all", {0: A, 1: B}, {0: B}, [], 0),
    ("index 1 gone", "0-1", {0: A, 1: B}, {0: A}, [IndexMoved(1, B, None)], 1),
    ("first start: no file", "0", None, {0: B}, [], 0),
    ("same GPUs", "0,1", {0: A, 1: B}, {0: A, 1: B}, [], 0),
]  # fmt: skip


@pytest.mark.parametrize(("shared", "before", "now", "moved", "lines"), [c[1:] for c in CHECKS],
                         ids=[c[0] for c in CHECKS])  # fmt: skip
def test_check_indices(tmp_path: Path, shared: str, before: dict[int, str] | None, now: dict[int, str],
                       moved: list[IndexMoved], lines: int) -> None:  # fmt: skip
    path = tmp_path / INDICES_FILE
    if before is not None:
        save_indices(path, before)
    with logged() as logs:
        assert check_indices(path, parse_shared_gpus(shared), now, "device plugin") == tuple(moved)
    said = [m for m in logs if "device plugin: OMATICAYA_SHARED_GPUS names GPU index" in m]
    assert len(said) == lines, logs
    assert load_indices(path) == now  # this start's map, for the next


@contextmanager
def logged() -> Iterator[list[str]]:
    """The loguru messages logged inside the block."""
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")
    try:
        yield lines
    finally:
        logger.remove(sink)


def tick(feed: CacheFeed, *gpus: object, error: str | None = None) -> None:
    """A tick of the agent: ``cache.last`` set, then each listener called (as ``agent.Agent``
    does on its tick's thread)."""
    snap = snapshot(*gpus, error=error)  # type: ignore[arg-type]
    health, desired = evaluate(snap)
    result = TickResult(snap, health, desired, None, False)
    feed.cache.last = result
    for listener in list(feed.on_tick):
        listener(result)


def shared_set(
    folder: Path, feed: CacheFeed, reported: list[IndexMoved], shared: str = "0"
) -> DevicePluginSet:
    config = PluginConfig(plugin_dir=folder, sharing=SharingConfig(parse_shared_gpus(shared)))
    return DevicePluginSet(feed, config, report=reported.append)


def test_a_start_whose_shared_index_names_another_gpu_reports_it(tmp_path: Path) -> None:
    """OMATICAYA_SHARED_GPUS=0 by index, and the device plugin on. The last start saw A at 0 and
    B at 1; the node came back without A, B renumbered 0. The start reports it before any plugin
    serves: a log line, the gauge, the report (the Event); the file holds this start's map. The
    sharing follows the index (B's units are served), and the next start reports nothing.
    Before the fix the device plugin compared nothing: B was shared silently."""
    save_indices(tmp_path / INDICES_FILE, {0: A, 1: B})
    feed = CacheFeed(Cache())
    tick(feed, gpu(0, uuid=B))
    reported: list[IndexMoved] = []
    plugins = shared_set(tmp_path, feed, reported)
    with logged() as logs:
        plugins.start()
        try:
            assert plugins.moved == (IndexMoved(0, A, B),)
            wait_for("the report", lambda: reported == [IndexMoved(0, A, B)], 5)
            assert any(
                f"GPU index 0, which was GPU {A}" in m and f"is GPU {B} now" in m for m in logs
            ), logs
            (gauge,) = MovedGauge(lambda: plugins.moved).collect()
            assert gauge.name == "omaticaya_shared_gpu_index_moved"
            assert [(s.labels, s.value) for s in gauge.samples] == [
                ({"index": "0", "before": A, "now": B}, 1.0)
            ]
            assert json.loads((tmp_path / INDICES_FILE).read_text()) == {
                "version": 1,
                "gpus": {"0": B},
            }
            assert plugins.shared_plugin is not None
            assert {unit_gpu(d.id) for d in plugins.shared_plugin.devices()} == {B}
            assert plugins.check_indices() is None  # once per start
        finally:
            plugins.stop(0)
    again: list[IndexMoved] = []
    later = shared_set(tmp_path, feed, again)
    assert later.check_indices() == () and later.moved == () and again == []


def test_the_indices_are_compared_at_the_first_readable_tick(tmp_path: Path) -> None:
    """Started before any reading: nothing compared while NVML cannot be read (the map of the
    last start kept), the first readable tick compares and reports."""
    save_indices(tmp_path / INDICES_FILE, {0: A, 1: B})
    feed = CacheFeed(Cache())
    reported: list[IndexMoved] = []
    plugins = shared_set(tmp_path, feed, reported, shared="0-1")
    plugins.start()
    try:
        assert not plugins.indices_checked
        tick(feed, error="NVMLError_DriverNotLoaded")
        assert not plugins.indices_checked
        assert load_indices(tmp_path / INDICES_FILE) == {0: A, 1: B}
        tick(feed, gpu(0, uuid=B))
        assert plugins.moved == (IndexMoved(0, A, B), IndexMoved(1, B, None))
        wait_for("the report", lambda: reported == list(plugins.moved), 5)
        assert load_indices(tmp_path / INDICES_FILE) == {0: B}
    finally:
        plugins.stop(0)


def test_from_settings_reports_through_the_agents_node_session(tmp_path: Path) -> None:
    """``omaticaya run``: the Event goes through the agent's Node client's session to the Node
    named by NODE_NAME; ``omaticaya device-plugin`` (no Node client) has no report."""

    @dataclass
    class Node:
        session: object

    @dataclass
    class Feed(CacheFeed):
        node: Node | None = None

    s = helper_settings(device_plugin_dir=tmp_path, shared_gpus="0", node_name="gpu-node-1")
    with_node = DevicePluginSet.from_settings(Feed(Cache(), node=Node(session := object())), s)
    report = with_node._report
    assert isinstance(report, functools.partial) and report.args == (session, "gpu-node-1")
    assert DevicePluginSet.from_settings(Feed(Cache()), s)._report is None
    assert with_node.config.indices_file == tmp_path / "omaticaya-gpu-indices.json"


#: the multi-GPU trace's GPU 0, and a GPU this node no longer has
TRACE_GPU0 = "GPU-00000000-7fda-b7ae-a94e-630097a14ca4"
GONE = "GPU-0000000f-7fda-b7ae-a94e-630097a14ca4"


@pytest.mark.slow
def test_the_daemons_metrics_show_a_moved_index(tmp_path: Path) -> None:
    """``omaticaya device-plugin`` on the multi-GPU trace, ``--shared-gpus 0``, after a start at
    which index 0 was another GPU: its ``/metrics`` carries the gauge (the collector is wired in
    ``cli.daemon``, before the plugin set exists) and its log the warning. No kubelet: the
    plugins retry their registration meanwhile."""
    import subprocess
    import sys
    import urllib.request

    from tests.helpers import free_port

    (tmp_path / INDICES_FILE).write_text(json.dumps({"version": 1, "gpus": {"0": GONE}}))
    port = free_port()
    trace = Path(__file__).resolve().parents[1] / "data" / "multi-gpu-trace.json"
    log = tmp_path / "daemon.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "omaticaya_py", "device-plugin", "--trace", str(trace),
             "--plugin-dir", str(tmp_path), "--shared-gpus", "0", "--metrics-port", str(port)],
            stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:

        def gauge() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                return None
            lines = [x for x in text.splitlines() if x.startswith("omaticaya_shared_gpu_index_moved{")]
            return lines[0] if lines else None

        line = wait_for("the gauge on /metrics", gauge, 30)
        assert f'before="{GONE}"' in line and 'index="0"' in line and f'now="{TRACE_GPU0}"' in line
        assert line.endswith(" 1.0"), line
        assert json.loads((tmp_path / INDICES_FILE).read_text())["gpus"]["0"] == TRACE_GPU0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert f"which was GPU {GONE}" in log.read_text()

"""The label table (``core.schema.names.LABELS``) is the one place a label is declared: what
``core.publish.render`` writes, which way ``core.publish.budget`` calls worse, what is kept on exit, and the
README's (and docs') label tables all agree with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from omaticaya_py.core.model.snapshot import MigReading
from omaticaya_py.core.publish.budget import name_of, worse
from omaticaya_py.core.publish.render import is_static, render
from omaticaya_py.core.rules.attribution import GpuAttribution
from omaticaya_py.core.rules.health import assess
from omaticaya_py.core.schema import LABELS, STATIC_NAMES, Label
from tests.helpers import PREFIX, gpu, settings, snapshot

ROOT = Path(__file__).resolve().parents[3]
PROFILE = "1g.10gb"


def _mig(index: int) -> MigReading:
    return MigReading(
        index=index, uuid=f"MIG-{index:08d}-0000-0000-0000-000000000000", profile=PROFILE,
        memory_total_mib=9984, memory_used_mib=984, memory_free_mib=9000, process_count=0,
    )  # fmt: skip


def _row_of(name: str) -> tuple[str, str]:
    """(scope, name) of a label name as written: ``gpu-3.health`` -> ``("gpu", "health")``,
    ``mig-1g.10gb.count`` -> ``("mig", "count")``, ``gpu.health`` -> ``("node", ...)``;
    ``gpu-N.`` and ``mig-<profile>.`` as the docs write them read the same."""
    if m := re.match(r"^gpu-(?:\d+|N)\.(.+)$", name):
        return "gpu", m.group(1)
    if m := re.match(r"^mig-(?:<profile>|\d+g\.\d+gb(?:[-+]me)?)\.(.+)$", name):
        return "mig", m.group(1)
    return "node", name


def _table() -> set[tuple[str, str]]:
    return {(row.scope, row.name) for row in LABELS}


def test_every_label_render_writes_is_in_the_table_and_every_row_is_written() -> None:
    """One node with every kind of GPU (two products, one MIG, one shared, one with memory of
    processes in no pod), every optional label on: render writes exactly the table's labels."""
    snap = snapshot(
        gpu(0, process_count=0, sm_active_pct=12.0),
        gpu(1, utilization_pct=None, mig_enabled=True, mig_devices=(_mig(0),)),
        gpu(2),
        gpu(3, product="NVIDIA A100-SXM4-40GB"),
    )
    uuid3 = snap.gpus[3].uuid or ""
    att = {uuid3: GpuAttribution(device_id=uuid3, out_of_band_memory_mib=4096)}
    s = settings(temperature_labels=True, sm_active_labels=True, shared_gpus="2")
    labels = render(snap, assess(snap, (), None), s, attribution=att).labels
    written = {_row_of(key.removeprefix(PREFIX + "/")) for key in labels}
    assert written == _table()


def _key(row: Label) -> str:
    where = {"node": "", "gpu": "gpu-0.", "mig": f"mig-{PROFILE}."}[row.scope]
    return f"{PREFIX}/{where}{row.name}"


@pytest.mark.parametrize("row", LABELS, ids=lambda row: f"{row.scope}:{row.name}")
def test_the_budget_calls_worse_what_the_table_says(row: Label) -> None:
    key = name_of(_key(row))
    if row.worse == "less":
        assert worse(key, "2", "1") and not worse(key, "1", "2")
    elif row.worse == "more":
        assert worse(key, "1", "2") and not worse(key, "2", "1")
    elif row.worse == "health":
        assert worse(key, "Healthy", "Unhealthy") and not worse(key, "Unhealthy", "Healthy")
    elif row.worse == "neutral":
        assert not worse(key, "1", "2") and not worse(key, "2", "1") and not worse(key, "1", None)
    else:  # changed: a value that changes may mislead a scheduler, one that appears does not
        assert worse(key, "a", "b") and not worse(key, None, "a")
    if row.worse != "neutral":
        assert worse(key, "1", None)  # a key gone is worse, whatever it is


@pytest.mark.parametrize("row", LABELS, ids=lambda row: f"{row.scope}:{row.name}")
def test_what_is_kept_on_exit_is_what_the_table_says(row: Label) -> None:
    assert is_static(_key(row), PREFIX) is (row.static and row.scope == "node")
    assert (row.name in STATIC_NAMES) is row.static


def _documented() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """The label tables (header ``| key | example | meaning |``) of README.md and docs/*.md:
    the names in their first column, and those named anywhere in their rows (``name`` or
    ``name=value``)."""
    keys: set[tuple[str, str]] = set()
    named: set[tuple[str, str]] = set()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        in_table = False
        for line in path.read_text().splitlines():
            if not line.startswith("|"):
                in_table = False
                continue
            cells = [cell.strip() for cell in line.split("|")[1:-1]]
            if cells[:2] == ["key", "example"]:
                in_table = True
            elif in_table:
                keys.update(_row_of(name) for name in re.findall(r"`([^`]+)`", cells[0]))
                for span in re.findall(r"`([^`=]+)(?:=[^`]*)?`", line):
                    if re.match(r"^(gpu|cuda|mig)[-.][A-Za-z0-9<>.+-]+$", span):
                        named.add(_row_of(span))
    return keys, named


def test_the_docs_label_tables_list_the_table() -> None:
    keys, named = _documented()
    assert keys - _table() == set(), "a label table's key is not in LABELS"
    assert _table() - named == set(), "in LABELS but named in no README or docs label table"

"""Typed ResourceSlice devices (``core.publish.slice_device``) and the attribute table
(``core.schema.attributes``): each device renders its attributes in the table's order, under
the table's names, and no attribute name is spelled anywhere else in the package."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from omaticaya_py.core.model.sharing import Sharing, parse_shared_gpus
from omaticaya_py.core.publish.dra import TAINT_MPS, TAINT_UNHEALTHY, inventory
from omaticaya_py.core.publish.slice_device import (
    DeviceTaint,
    SliceDevice,
    TaintRule,
    slice_devices,
)
from omaticaya_py.core.rules.health import assess
from omaticaya_py.core.schema import attributes
from omaticaya_py.core.schema.attributes import ATTRIBUTES
from omaticaya_py.sources.replay import TraceReader

PACKAGE = Path(__file__).resolve().parents[3] / "omaticaya_py"
ORDER = [a.name for a in ATTRIBUTES]


def devices(trace: str, rule: TaintRule | None = None) -> list[SliceDevice]:
    snapshot = TraceReader(trace, loop=False).read()
    sharing = Sharing(parse_shared_gpus("0,1"), 1024)
    return slice_devices(inventory(snapshot, assess(snapshot), sharing, 1024, 10), snapshot, rule)


@pytest.mark.parametrize("trace", ["tests/data/multi-gpu-trace.json", "tests/data/mig-mixed-trace.json"])
def test_attributes_come_in_the_tables_order_and_types(trace):
    for d in devices(trace):
        attrs = d.render()["attributes"]
        assert list(attrs) == [n for n in ORDER if n in attrs]
        for a in ATTRIBUTES:
            if a.name in attrs:
                assert list(attrs[a.name]) == [a.type]
        assert (attributes.MIG_INDEX in attrs) is (d.device_type == "mig")


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (SliceDevice("gpu-a", "gpu", False, 3), {
            "name": "gpu-a",
            "attributes": {"type": {"string": "gpu"}, "shared": {"bool": False}, "index": {"int": 3}},
        }),
        (SliceDevice("gpu-a", "gpu", True, 0, free_memory_mib=0, memory_mib=2048, unit_mib=1024), {
            "name": "gpu-a",
            "attributes": {"type": {"string": "gpu"}, "shared": {"bool": True},
                           "index": {"int": 0}, "freeMemoryMiB": {"int": 0}},
            "capacity": {"memory": {"value": "2048Mi", "requestPolicy": {
                "default": "1024Mi", "validRange": {"min": "1024Mi", "step": "1024Mi"}}}},
            "allowMultipleAllocations": True,
        }),
        (SliceDevice("gpu-a-mig-1", "mig", False, 0, mig_index=1, profile="1g.10gb",
                     taints=(DeviceTaint(TAINT_UNHEALTHY, "xid-79", "NoExecute", "T"),
                             DeviceTaint(TAINT_MPS, "down", "NoSchedule"))), {
            "name": "gpu-a-mig-1",
            "attributes": {"type": {"string": "mig"}, "shared": {"bool": False},
                           "index": {"int": 0}, "migIndex": {"int": 1},
                           "profile": {"string": "1g.10gb"}},
            "taints": [{"key": TAINT_UNHEALTHY, "value": "xid-79", "effect": "NoExecute",
                        "timeAdded": "T"},
                       {"key": TAINT_MPS, "value": "down", "effect": "NoSchedule"}],
        }),
    ],
    ids=["bare", "shared", "mig-tainted"],
)
def test_render(device, expected):
    assert device.render() == expected


def test_taint_times_kept_and_new_ones_now():
    first = devices("tests/data/faults-trace.json")
    name = first[0].name
    rule = TaintRule("NoSchedule", {d.parent_uuid or d.uuid or "": "down" for d in first},
                     {(name, TAINT_MPS): "then"}, now="now")  # fmt: skip
    shared = [d for d in devices("tests/data/faults-trace.json", rule) if d.shared]
    assert [t.time_added for d in shared for t in d.taints] == ["then", "now"]


def test_no_attribute_name_is_spelled_outside_the_table():
    """The camelCase attribute names are ours alone: spelled only in ``core/schema/attributes.py``
    (the short ones, ``type``, ``uuid``, ``index``..., are common words, not checked)."""
    names = [a.name for a in ATTRIBUTES if re.search(r"[A-Z]", a.name)]
    #: the same word in another schema, named here: cmd/driverfiles' JSON output has a key
    #: driverVersion (the driver the toolkit found), read by dra/drivermounts.py
    other_schemas = {("dra/drivermounts.py", "driverVersion")}
    found = [
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "attributes.py"
        for name in names
        if f'"{name}"' in path.read_text() or f"'{name}'" in path.read_text()
        if (str(path.relative_to(PACKAGE)), name) not in other_schemas
    ]
    assert found == []


def test_docs_dra_md_lists_the_attribute_table():
    """docs/dra.md's attribute table is the attribute table: every name once, with its type
    (a new attribute fails here until the docs say what it is and where it comes from)."""
    text = (PACKAGE.parent / "docs" / "dra.md").read_text()
    rows = re.findall(r"^\| `([A-Za-z./]+)` \| (string|int|bool|version) \|", text, re.MULTILINE)
    assert sorted(rows) == sorted((a.name, a.type) for a in ATTRIBUTES)

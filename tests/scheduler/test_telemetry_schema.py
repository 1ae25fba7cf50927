"""The telemetry's ``schema`` is checked (issue 38: a schema-99 document was read as version 2).

A document of a schema newer than this reader's ``TELEMETRY_VERSION`` may mean anything: it is
refused as unreadable bad input is (``Telemetry.parse`` gives the problem, never raises), so
the extender fails the node with that reason, logs it once and counts it in
``node_problems_total{problem}``. The versions this reader knows (and a document without a
``schema``, or one of the wrong type, read leniently as before) still parse."""

from __future__ import annotations

import json
from typing import Any

import pytest

from omaticaya_py.core.schema import TELEMETRY_VERSION
from omaticaya_py.core.schema.telemetry import Telemetry
from omaticaya_py.scheduler import ExtenderSettings, parse_node
from omaticaya_py.scheduler.app import NodeProblems
from omaticaya_py.scheduler.protocol import handle_filter

P = "omaticaya.io/"
READ_AT = "2026-01-01T00:00:00Z"
NOW = 1767225600.0 + 10  # READ_AT + 10 s
S = ExtenderSettings(_env_file=None)  # type: ignore[call-arg]
HEALTHY = {P + "gpu.health": "Healthy"}
NEWER = "telemetry annotation of an unknown newer schema"
ABSENT = object()


def tele(schema: Any) -> str:
    doc: dict[str, Any] = {"read_at": READ_AT, "health": "Healthy",
                           "gpus": [{"index": 0, "memory_free_mib": 40960, "health": "Healthy"}]}  # fmt: skip
    if schema is not ABSENT:
        doc["schema"] = schema
    return json.dumps(doc)


# (id, the document's "schema", parsed (True) or refused as newer (False))
CASES = [
    ("this reader's version", TELEMETRY_VERSION, True),
    ("version 1", 1, True),
    ("no schema (lenient, as before)", ABSENT, True),
    ("schema null", None, True),
    ("schema of the wrong type (a list)", [2], True),
    ("schema a boolean", True, True),
    ("schema 0 (not newer)", 0, True),
    ("schema as text of a known version", "2", True),
    ("the next version", TELEMETRY_VERSION + 1, False),
    ("schema 99", 99, False),
    ("schema 99 as text", "99", False),
    ("schema 2.5", 2.5, False),
    ("schema 10^30", 10**30, False),
    ("schema Infinity", float("inf"), False),
]


@pytest.mark.parametrize(("schema", "parsed"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_schema_is_checked(schema: Any, parsed: bool) -> None:
    raw = tele(schema)
    doc, problem = Telemetry.parse(raw)
    state = parse_node("n", HEALTHY, {P + "telemetry": raw})
    problems = NodeProblems()
    problems.seen(state)
    args = {"Pod": {"metadata": {"annotations": {P + "gpu-memory-mib": "1024"}}}, "NodeNames": ["n"]}
    result = handle_filter(args, S, {"n": state}.get, now=NOW)
    if parsed:
        assert problem is None and doc is not None and [g.index for g in doc.gpus] == [0]
        assert state.problem is None and [g.free_mib for g in state.gpus] == [40960]
        assert result["NodeNames"] == ["n"], result
        assert not problems.counts
    else:
        assert doc is None and problem is not None and problem.startswith(NEWER), problem
        assert str(TELEMETRY_VERSION) in problem  # says what this reader knows
        assert state.problem == problem and state.gpus == ()  # skipped, with the reason
        assert result["NodeNames"] == [] and problem in result["FailedNodes"]["n"], result
        assert problems.counts == {problem: 1}  # counted, under one bounded name

"""Every Event reason the product posts is one row of core/schema/events.py's table, named
nowhere else as a string, and documented: docs/agent.md's Events table has its row with its
type and the objects it is posted on (issue 49, item 8: a new Event's recipe)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from omaticaya_py.core.schema.events import EVENTS

REPO = Path(__file__).resolve().parents[3]
TABLE = REPO / "omaticaya_py" / "core" / "schema" / "events.py"


def _doc_rows(page: str) -> dict[str, tuple[str, str]]:
    text = (REPO / "docs" / page).read_text()
    rows = re.findall(r"^\| `([A-Za-z]+)` \| (Warning|Normal) \| ([^|]+) \|", text, re.MULTILINE)
    return {reason: (kind, on.strip()) for reason, kind, on in rows}


def test_reasons_are_unique():
    reasons = [e.reason for e in EVENTS]
    assert len(reasons) == len(set(reasons))


@pytest.mark.parametrize("event", EVENTS, ids=[e.reason for e in EVENTS])
def test_each_reason_is_documented_with_its_type_and_objects(event):
    rows = _doc_rows(event.docs)
    assert event.reason in rows, f"docs/{event.docs} has no row for {event.reason}"
    kind, on = rows[event.reason]
    assert kind == event.type
    assert on == " and ".join(event.on), (event.reason, on)


def test_no_reason_is_spelled_outside_the_table():
    """A poster imports the reason's constant: a string literal elsewhere would drift."""
    reasons = {e.reason for e in EVENTS}
    found = []
    for path in (REPO / "omaticaya_py").rglob("*.py"):
        if path == TABLE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in reasons:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value}")
    assert found == []

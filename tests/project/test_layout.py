"""The tests' layout (issue 49, item 7): a folder per system as the package is, no test file at
the top of tests/, and no test file importing another (what several share is in a support
module or a helper)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _test_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def test_every_test_file_is_in_a_system_folder():
    assert [p.name for p in TESTS.glob("test_*.py")] == []
    assert len(_test_files()) > 150


def test_no_test_file_imports_another():
    found = []
    for path in _test_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            modules = []
            if isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            found += [f"{path.relative_to(TESTS)}: {m}" for m in modules
                      if m.startswith("tests.") and m.rsplit(".", 1)[-1].startswith("test_")]  # fmt: skip
    assert found == []


def test_every_folder_is_a_package():
    """A test module's name is its path (tests.agent.test_metrics): two test files of one name
    in two folders never collide."""
    for path in _test_files():
        for folder in path.relative_to(TESTS).parents:
            if str(folder) != ".":
                assert (TESTS / folder / "__init__.py").is_file(), folder

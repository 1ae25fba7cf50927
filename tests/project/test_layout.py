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


#: what brings up the machine's one kubelet: tests/kubelet.py's fixture helper, and the dev
#: cluster's kubelet and --full starts
_KUBELET_CALLS = ("kubelet_node(", ".start_kubelet(", ".start_full(", "kubelet_sock_in_use(")


def _tests_modules(path: Path) -> set[Path]:
    """The tests/ modules (support modules, helpers) the file at ``path`` imports."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests."):
            out.add(TESTS.parent / (node.module.replace(".", "/") + ".py"))
    return {p for p in out if p.is_file()}


def _uses_kubelet(path: Path, seen: frozenset[Path] = frozenset()) -> bool:
    text = path.read_text()
    if path.name != "kubelet.py" and any(call in text for call in _KUBELET_CALLS):
        return True
    return any(_uses_kubelet(m, seen | {path}) for m in _tests_modules(path) - seen
               if m.name.endswith("_support.py"))  # fmt: skip


def test_every_module_that_starts_the_kubelet_is_marked_kubelet():
    """The machine has one kubelet: under pytest-xdist, tests/conftest.py runs the modules marked
    ``kubelet`` on one worker. A module that starts it (itself or through its support module)
    without the mark could run beside another on a second worker and skip ("another kubelet
    serves ..."), or fail."""
    unmarked, marked = [], []
    for path in _test_files():
        if path != Path(__file__).resolve() and _uses_kubelet(path):
            (marked if "pytest.mark.kubelet" in path.read_text() else unmarked).append(path.name)
    assert unmarked == []
    assert len(marked) >= 12

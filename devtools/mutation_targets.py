"""The pure modules ``scripts/mutation`` mutates, and the tests of each.

A pure module decides without I/O: every module of ``omaticaya_py.core`` (the import contract
forbids it the I/O libraries) and the pure rules outside it (``OUTSIDE_CORE``). Its tests are
the test files that import it (``from omaticaya_py.x.y import ...``, ``import
omaticaya_py.x.y``, or ``from omaticaya_py.x import y``), read with ``ast``; ``scripts/mutation``
runs them with the ``cluster``, ``slow`` and ``nvml`` markers deselected (in-process only).

    python -m devtools.mutation_targets              # one line per module: path and test files
    python -m devtools.mutation_targets PATH         # the test files of one module
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "omaticaya_py"
TESTS = ROOT / "tests"

#: pure rules outside the core: the scheduler's fit, need and preemption choices, the device
#: plugin's choice of a slice's GPU
OUTSIDE_CORE = (
    "omaticaya_py/scheduler/fit.py",
    "omaticaya_py/scheduler/need.py",
    "omaticaya_py/scheduler/container_asks.py",
    "omaticaya_py/scheduler/victims.py",
    "omaticaya_py/scheduler/deadline.py",
    "omaticaya_py/scheduler/inflight.py",
    "omaticaya_py/scheduler/reasons.py",
    "omaticaya_py/deviceplugin/slices.py",
)


def pure_modules() -> list[str]:
    """Every pure module's path from the repository root (``__init__.py`` files left out),
    sorted: the core's, then ``OUTSIDE_CORE``'s that exist."""
    core = sorted(
        str(p.relative_to(ROOT)) for p in (PACKAGE / "core").rglob("*.py") if p.name != "__init__.py"
    )
    return core + [p for p in OUTSIDE_CORE if (ROOT / p).is_file()]


def _dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


@cache
def _reexports(package: str) -> dict[str, str]:
    """Name -> the module of ``package`` it comes from, for the names its ``__init__.py``
    imports from its own modules (``from .snapshot import GpuInfo``); empty for a module."""
    init = ROOT / package.replace(".", "/") / "__init__.py"
    if not init.is_file():
        return {}
    out: dict[str, str] = {}
    for node in ast.walk(ast.parse(init.read_text(), str(init))):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            out.update((a.asname or a.name, f"{package}.{node.module}") for a in node.names)
    return out


@cache
def _imports(test: Path) -> frozenset[str]:
    """The ``omaticaya_py`` modules a test file imports: ``from a.b import c`` counts ``a.b``,
    ``a.b.c`` (``c`` may be a module) and, where ``a.b`` is a package that re-exports ``c``,
    the module ``c`` comes from."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(test.read_text(), str(test))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
            origin = _reexports(node.module)
            found.update(origin[a.name] for a in node.names if a.name in origin)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return frozenset(m for m in found if m.startswith("omaticaya_py"))


def _direct_tests(dotted: str) -> set[str]:
    return {str(t.relative_to(ROOT)) for t in TESTS.rglob("test_*.py") if dotted in _imports(t)}


@cache
def _module_imports(path: Path) -> frozenset[str]:
    """The ``omaticaya_py`` modules the module at ``path`` imports, relative imports resolved."""
    here = _dotted(str(path.relative_to(ROOT))).rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
            module = f"{base}.{node.module}" if node.level else node.module
            found.add(module)
    return frozenset(found)


def tests_of(path: str) -> list[str]:
    """The test files (``tests/**/test_*.py``, from the repository root) that import the
    module at ``path``; for a module no test imports itself (one that another module
    re-exports or builds on: ``core/config/agent.py``), those of the modules that import it.
    Sorted."""
    dotted = _dotted(path)
    found = _direct_tests(dotted)
    if not found:
        for module in PACKAGE.rglob("*.py"):
            if dotted in _module_imports(module):
                found |= _direct_tests(_dotted(str(module.relative_to(ROOT))))
    return sorted(found)


def main(argv: list[str]) -> int:
    if argv:
        print(" ".join(tests_of(argv[0])))
        return 0
    for path in pure_modules():
        tests = tests_of(path)
        print(f"{path}: {' '.join(tests) if tests else '(none)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""scripts/mutation knows every pure module and its tests (issue 49, item 7): the core's modules
and the pure rules outside it, each with at least one test file that imports it (or, for a
module others build on, the tests of those)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools.mutation_targets import OUTSIDE_CORE, ROOT, pure_modules
from devtools.mutation_targets import tests_of as module_tests

MODULES = pure_modules()


def test_every_core_module_is_pure_and_listed():
    core = {str(p.relative_to(ROOT)) for p in (ROOT / "omaticaya_py" / "core").rglob("*.py")
            if p.name != "__init__.py"}  # fmt: skip
    assert core <= set(MODULES)
    assert set(OUTSIDE_CORE) <= set(MODULES), "a pure rule outside the core moved: update OUTSIDE_CORE"


@pytest.mark.parametrize("path", MODULES)
def test_each_pure_module_has_tests(path):
    tests = module_tests(path)
    assert tests, f"{path}: no test file imports it"
    assert all(Path(ROOT / t).is_file() and Path(t).name.startswith("test_") for t in tests)


def test_a_module_found_only_through_its_importer():
    """core/config/agent.py is imported by no test: its tests are core/config/settings.py's."""
    assert "tests/core/config/test_settings.py" in module_tests("omaticaya_py/core/config/agent.py")

"""The CLI outside the repository (issue 52 item 4), as the README's "The CLI outside the
repository" installs it: the wheel built from a copy of the sources, installed with its
dependencies (from PyPI, or pip's configured find-links) into a fresh virtual environment
(``python -m venv``, no system site-packages), then both console scripts run from a folder
outside the checkout. ``show --trace`` runs the agent's whole read-and-render path on the
installed dependencies alone: a dependency missing from pyproject.toml fails it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import H100_TRACE

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``argv`` in ``cwd`` with no trace of this checkout's environment (no PYTHONPATH, no
    active venv, no OMATICAYA_* setting); at most 300 s; the exit status checked by callers."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NODE_NAME") and not k.startswith("OMATICAYA_")}  # fmt: skip
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` folder of a fresh venv with the wheel of this checkout installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "omaticaya"  # a copy: the build's own folders never land in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "omaticaya_py", source / "omaticaya_py",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
    done = _run(sys.executable, "-m", "venv", tmp / "venv", cwd=tmp)
    assert done.returncode == 0, done.stderr
    python = tmp / "venv" / "bin" / "python"
    done = _run(
        python, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp / "dist", source, cwd=tmp
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp / "dist").glob("omaticaya-*-py3-none-any.whl")
    done = _run(python, "-m", "pip", "install", "-q", "--no-compile", wheel, cwd=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    return tmp / "venv" / "bin"


def test_the_wheel_installs_the_package_into_the_venv(installed):
    done = _run(installed / "python", "-c", "import omaticaya_py; print(omaticaya_py.__file__)",
                cwd=installed)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(installed.parent), done.stdout
    done = _run(installed / "omaticaya", "--version", cwd=installed)
    assert done.returncode == 0 and done.stdout.startswith("omaticaya "), done.stderr


def test_the_installed_cli_runs_its_commands(installed):
    done = _run(installed / "omaticaya", "cleanup", "--help", cwd=installed)
    assert done.returncode == 0 and "--dry-run" in done.stdout, done.stderr
    done = _run(installed / "omaticaya", "show", "--trace", H100_TRACE, "--trace-at", "14",
                "--schedule", "@every 2s", cwd=installed)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "omaticaya.io/gpu.utilization-pct=100" in done.stdout


def test_the_installed_kubectl_plugin_names_itself(installed):
    done = _run(installed / "kubectl-omaticaya", "--help", cwd=installed)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: kubectl omaticaya top "), done.stdout

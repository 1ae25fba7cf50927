"""``scripts/dev-cluster build`` where it cannot work says why in one line and exits non-zero,
and caches nothing as done: no Go toolchain, the Go module proxy unreachable, a release the
project does not pin. Each case runs the real script with an empty cache of its own."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.devcluster import REPO_ROOT

BUILD = REPO_ROOT / "scripts" / "dev-cluster-build"


def _build(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    cache = tmp_path / "cache"
    full_env = dict(os.environ, OMATICAYA_CACHE=str(cache), **env)
    return subprocess.run(
        [str(BUILD), *args], env=full_env, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL, check=False,
    )


def _one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("[dev-cluster] ERROR: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def _nothing_done(tmp_path: Path) -> None:
    assert not list((tmp_path / "cache").rglob(".complete")), "a failed build left a stamp"


def test_no_go_toolchain(tmp_path: Path) -> None:
    go = shutil.which("go")
    path = ":".join(d for d in os.environ["PATH"].split(":")
                    if not go or Path(d).resolve() != Path(go).resolve().parent)
    error = _one_error(_build(tmp_path, {"PATH": path}))
    assert "no Go toolchain" in error and "'go' is not on PATH" in error, error
    _nothing_done(tmp_path)


def test_module_proxy_unreachable(tmp_path: Path) -> None:
    if not shutil.which("go"):
        pytest.skip("no Go toolchain here (the case above covers it)")
    env = {
        "GOPROXY": "http://127.0.0.1:9",  # discard port: refused at once
        "GOMODCACHE": str(tmp_path / "modcache"),  # empty: every module must be fetched
        "GOFLAGS": "",
    }
    error = _one_error(_build(tmp_path, env))
    assert "the Go module proxy is unreachable (http://127.0.0.1:9)" in error, error
    _nothing_done(tmp_path)
    subprocess.run(["chmod", "-R", "u+w", str(tmp_path / "modcache")], check=False)


def test_a_release_the_project_does_not_pin(tmp_path: Path) -> None:
    if not shutil.which("go"):
        pytest.skip("no Go toolchain here")
    error = _one_error(_build(tmp_path, {}, "--kubernetes-version", "v1.20.2"))
    assert "v1.20.2 is not a release this project pins" in error, error
    _nothing_done(tmp_path)

"""The stand-in of ``nvidia-cuda-mps-control`` (devtools/mps-standin, shipped in the image at
/opt/omaticaya/standin/): the CLI contract of NVIDIA's program that ``omaticaya mps`` relies
on, so that tests against it mean something. Real processes, a real unix socket."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import wait_for

STANDIN = (
    Path(__file__).resolve().parents[2] / "devtools" / "mps-standin" / "nvidia-cuda-mps-control"
)


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    """The MPS environment of a short folder (a unix socket's path is at most 107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="om-standin-", dir="/tmp"))
    (root / "pipe").mkdir()
    yield {"PATH": os.environ["PATH"], "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"),
           "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}  # fmt: skip
    try:
        _client({"PATH": os.environ["PATH"], "CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe")}, "quit")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _client(env: dict[str, str], *lines: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(STANDIN)], input="".join(f"{x}\n" for x in lines), env=env,
                          capture_output=True, text=True, timeout=20, check=False)  # fmt: skip


def _daemon(env: dict[str, str], flag: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(STANDIN), flag], env=env, capture_output=True, text=True,
                          timeout=20, check=False)  # fmt: skip


def test_it_says_it_is_a_stand_in():
    head = STANDIN.read_text()[:600]
    assert head.startswith("#!/usr/bin/env python3") and "TEST STAND-IN" in head
    assert os.access(STANDIN, os.X_OK)


def test_background_daemon_commands_and_quit(env: dict[str, str]):
    assert _daemon(env, "-d").returncode == 0
    pipe, log = Path(env["CUDA_MPS_PIPE_DIRECTORY"]), Path(env["CUDA_MPS_LOG_DIRECTORY"])
    pid = int((pipe / "nvidia-cuda-mps-control.pid").read_text())
    assert (pipe / "control").is_socket()
    done = _client(
        env, "get_server_list", "get_default_device_pinned_mem_limit 0",
        "set_default_device_pinned_mem_limit 0 8192M", "get_default_device_pinned_mem_limit 0",
        "set_default_device_pinned_mem_limit 1 8G", "get_default_device_pinned_mem_limit 1",
        "set_default_active_thread_percentage 25", "get_default_active_thread_percentage",
        "no_such_command",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "0", "8192M", "8G", "25.0", "25.0", "Unrecognized command: no_such_command",
    ]  # fmt: skip
    # a second daemon on the same pipe folder is refused
    again = _daemon(env, "-f")
    assert again.returncode == 1 and "already running" in again.stderr
    assert _client(env, "quit").returncode == 0
    wait_for("the daemon gone", lambda: not Path(f"/proc/{pid}").exists(), 5)
    assert not (pipe / "control").exists() and not (pipe / "nvidia-cuda-mps-control.pid").exists()
    assert "set_default_device_pinned_mem_limit 0 8192M" in (log / "control.log").read_text()


def test_client_without_a_daemon_and_daemon_without_its_folder(env: dict[str, str]):
    done = _client(env, "get_server_list")
    assert done.returncode == 1 and "Cannot find MPS control daemon" in done.stderr
    missing = {**env, "CUDA_MPS_PIPE_DIRECTORY": env["CUDA_MPS_PIPE_DIRECTORY"] + "-missing"}
    refused = _daemon(missing, "-f")
    assert refused.returncode == 1 and "does not exist" in refused.stderr


def test_a_bad_limit_is_an_error_line(env: dict[str, str]):
    assert _daemon(env, "-d").returncode == 0
    done = _client(env, "set_default_device_pinned_mem_limit 0 lots",
                   "get_default_device_pinned_mem_limit 0")  # fmt: skip
    assert done.stdout.splitlines() == ["Invalid device or limit: 0 lots", "0"]

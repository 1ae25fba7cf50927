"""A command loads only what it uses (issue 26, item 12; figures in docs/benchmarks.md, 4b).

Each case imports in a fresh interpreter, as the command would, and lists which of the heavy
packages ended up in ``sys.modules``: grpc (~9 MiB of RSS) only with a kubelet socket, pydantic
and pydantic-settings only for the commands whose flags come from settings classes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("grpc", "google.protobuf", "pydantic", "pydantic_settings", "kubernetes", "uvicorn")


def loaded_after(code: str) -> list[str]:
    """The ``HEAVY`` packages in ``sys.modules`` once ``code`` ran in a fresh interpreter."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        # the command line alone, and the commands whose flags are written out
        ("import omaticaya_py.cli", []),
        ("from omaticaya_py.cli.parser import build_parser\nbuild_parser().parse_args(['top'])", []),
        (
            "from omaticaya_py.cli.parser import build_parser\n"
            "build_parser().parse_args(['stop-daemonset', '--namespace', 'n', '--name', 'd'])",
            [],
        ),
        # the agent's commands: flags from Settings (pydantic-settings)
        (
            "from omaticaya_py.cli.parser import build_parser\nbuild_parser().parse_args(['run'])",
            ["pydantic", "pydantic_settings"],
        ),
    ],
    ids=["import cli", "parse top", "parse stop-daemonset", "parse run"],
)
def test_the_parser_loads_settings_only_for_the_commands_that_have_them(code, expected):
    assert loaded_after(code) == expected


def test_the_agent_loads_grpc_only_when_a_kubelet_socket_is_there(tmp_path):
    """Everything ``omaticaya run`` imports, then a PodResources list on a missing socket: no
    grpc (the agent's attribution asks each tick); the same list on a socket loads it."""
    run_imports = (
        "import omaticaya_py.cli.agent, omaticaya_py.cli.daemon, omaticaya_py.agent, "
        "omaticaya_py.agent.metrics, omaticaya_py.kube, omaticaya_py.sources.replay\n"
        "from omaticaya_py.kube.podresources import PodResourcesAbsent, PodResourcesClient\n"
    )
    absent = run_imports + (
        f"try:\n    PodResourcesClient({str(tmp_path / 'kubelet.sock')!r}).list()\n"
        "except PodResourcesAbsent:\n    pass\n"
    )
    assert "grpc" not in loaded_after(absent)

    import socket

    sock_path = tmp_path / "kubelet.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))  # a socket nobody answers on: the call fails, grpc was loaded
    try:
        present = run_imports + (
            "from omaticaya_py.kube.podresources import PodResourcesCallFailed\n"
            f"try:\n    PodResourcesClient({str(sock_path)!r}, timeout_s=0.5).list()\n"
            "except PodResourcesCallFailed:\n    pass\n"
        )
        assert "grpc" in loaded_after(present)
    finally:
        server.close()


def test_the_command_keeps_kubernetes_validate_out(tmp_path):
    """``kubernetes/__init__`` imports ``kubernetes.dynamic``, which loads kubernetes-validate
    (jsonschema, referencing, attrs: ~1.8 MiB) where it is installed, as in the dev venv; the
    ``omaticaya`` command keeps it out (issue 31: the agent's peak RSS back under 60 MiB), while
    ``main`` called inside another process leaves that process's imports alone."""
    pytest.importorskip("kubernetes_validate")  # the test extras install it
    once = ("['once', '--dry-run', '--trace', 'tests/data/h100-trace.json', '--trace-at', '1', "
            "'--node', 'n', '--pod-resources-socket', '']")

    def after(entry: str) -> list[str]:
        code = (f"import sys\nsys.argv = ['omaticaya'] + {once}\nfrom omaticaya_py import cli\n"
                f"try:\n    cli.{entry}()\nexcept SystemExit:\n    pass\n"
                "print('VALIDATE', 'kubernetes_validate' in sys.modules and "
                "sys.modules['kubernetes_validate'] is not None, 'kubernetes' in sys.modules)")
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                              text=True, timeout=60, check=True)  # fmt: skip
        return proc.stdout.splitlines()[-1].split()[1:]

    assert after("console_main") == ["False", "True"]
    assert after("main") == ["True", "True"]

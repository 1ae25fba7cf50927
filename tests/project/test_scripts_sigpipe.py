"""The shell scripts never end a pipe with ``grep -q`` under ``set -o pipefail``.

``grep -q`` exits at its first match; the command before it then dies of SIGPIPE if it still has
output to write, and with ``pipefail`` the whole pipe fails although the line was there
(``ctr images ls -q | grep -qx IMAGE`` failed ``scripts/dev-cluster up --full`` right after the
image import, and passed when run again). ``grep -c ... >/dev/null`` reads all its input.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: ``| grep`` with ``-q`` among its short options (``-q``, ``-qx``, ``-xq``, ``-q --``)
PIPE_INTO_GREP_Q = re.compile(r"\|\s*grep\s+(-[A-Za-z]*q[A-Za-z]*\b|--quiet|--silent)")


def shell_scripts() -> list[Path]:
    out = []
    for folder in ("scripts", ".ci"):
        for path in sorted((REPO / folder).iterdir()):
            if (
                path.is_file()
                and path.read_bytes()[:64].startswith(b"#!")
                and b"sh" in path.read_bytes()[:64].split(b"\n")[0]
            ):
                out.append(path)
    return out


def test_there_are_scripts_to_check():
    assert any(p.name == "dev-cluster" for p in shell_scripts())


@pytest.mark.parametrize("path", shell_scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_pipe_into_grep_q(path):
    bad = [
        f"{path.name}:{n}: {line.strip()}"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PIPE_INTO_GREP_Q.search(line) and not line.lstrip().startswith("#")
    ]
    assert not bad, "pipe into grep -q under pipefail (use grep -c ... >/dev/null):\n" + "\n".join(
        bad
    )


@pytest.mark.parametrize(
    ("line", "caught"),
    [
        ('ctr images ls -q | grep -qx "$IMAGE"', True),
        ("ip addr | grep -q inet", True),
        ("ls | grep --quiet x", True),
        ('ctr images ls -q | grep -cx "$IMAGE" >/dev/null', False),
        ("grep -q '^A=' file", False),
        ("a | grep -x q", False),
    ],
)
def test_the_pattern(line, caught):
    assert bool(PIPE_INTO_GREP_Q.search(line)) is caught

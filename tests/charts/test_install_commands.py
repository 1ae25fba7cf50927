"""Every install command the docs show, as written (issue 52, item 1).

The commands are taken from the markdown itself: each ``helm install``, ``helm upgrade
--install`` or ``helm template`` of ``charts/omaticaya`` in a fenced ``bash``/``sh`` block of
README.md and docs/*.md, and each one in the header comment of an ``examples/install/`` file.
Each is run by the real helm (``tests/chart.py``) exactly as written, turned into ``helm
template`` (``--create-namespace`` and ``--wait`` dropped: they act on a cluster), from a folder
that has the repository's ``charts/`` and ``examples/`` and an empty ``my-values.yaml`` (the
user's file, which only adds), with the shell's variables the page defines set to a sample
value. A command that passes a goal file is rendered once per goal, with each layer file.

The rules checked: every command renders; every command that passes a goal file passes a layer
for the NVIDIA stack after it (the DRA goal included: without ``runtimeClassName: nvidia`` the
agent has no NVML library and publishes ``gpu.health=Unknown``); the layer files' headers name
every goal file; the goal files' headers count the goals install.md's table lists."""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.chart import REPO

INSTALL = REPO / "examples" / "install"
LAYERS = ("gpu-operator.yaml", "nvidia-device-plugin.yaml")
#: install.md's goals, in its table's order
GOALS = ("labels.yaml", "scheduler.yaml", "device-plugin.yaml", "whole-stack.yaml", "dra.yaml")
#: the shell variables the pages set before their commands, and a sample value each
SHELL_VARIABLES = {
    "NODE": "gpu-node-1",
    "STATE": "/tmp/omaticaya-dev",
    "$(kubectl version -o json | jq -r .serverVersion.gitVersion)": "v1.37.2",
}
HELM_CHART = re.compile(r"^helm (install|upgrade --install|template) \S+ charts/omaticaya\b")


@dataclass(frozen=True)
class Command:
    """One install command: ``where`` (``file:line``) and its words after the shell's parsing
    (continuation lines joined, quotes removed, variables set)."""

    where: str
    argv: tuple[str, ...]

    def goal(self) -> str | None:
        """The goal file it passes (``examples/install/<goal>``), if any."""
        return next((Path(a).name for a in self.argv if Path(a).name in GOALS), None)

    def layers(self) -> list[str]:
        """The layer files it passes, in order."""
        return [Path(a).name for a in self.argv if Path(a).name in LAYERS]


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """``(first line number, language, body)`` of each fenced code block of ``text``."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^\s*```(\S*)", lines[i])
        if fence:
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
                body.append(lines[i])
                i += 1
            out.append((start, fence.group(1), "\n".join(body)))
        i += 1
    return out


def shell_words(line: str) -> tuple[str, ...]:
    """The words of one shell command line, up to a redirection or a comment."""
    for name, value in SHELL_VARIABLES.items():
        line = line.replace(name if name.startswith("$(") else f"${name}", value)
    words = shlex.split(line, comments=True)
    return tuple(words[: words.index(">")] if ">" in words else words)


def commands_in(where: str, lines: list[tuple[int, str]]) -> list[Command]:
    """The chart's install commands among ``lines`` (``(line number, text)``, continuations
    already joined)."""
    return [
        Command(f"{where}:{n}", shell_words(line))
        for n, line in lines
        if HELM_CHART.match(" ".join(line.split()))
    ]


def joined(body: str, first: int) -> list[tuple[int, str]]:
    """``body``'s command lines with ``\\`` continuations joined, each with its line number."""
    out: list[tuple[int, str]] = []
    pending, at = "", first
    for n, line in enumerate(body.splitlines(), start=first):
        if not pending:
            at = n
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((at, pending + line))
        pending = ""
    return out


def doc_commands() -> list[Command]:
    """Every install command of README.md and docs/*.md (fenced bash/sh blocks)."""
    found: list[Command] = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text()
        for start, lang, body in fenced_blocks(text):
            if lang in ("bash", "sh", "shell", ""):
                where = str(page.relative_to(REPO))
                found += commands_in(where, joined(body, start + 1))
    return found


def header_commands() -> list[Command]:
    """The install command in each examples/install/ file's header comment."""
    found: list[Command] = []
    for path in sorted(INSTALL.glob("*.yaml")):
        header = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            header.append(line[1:].strip())
        where = str(path.relative_to(REPO))
        found += commands_in(where, joined("\n".join(header), 1))
    return found


DOCS = doc_commands()
HEADERS = header_commands()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's folder: the repository's charts/ and examples/, and an empty my-values.yaml."""
    home = tmp_path_factory.mktemp("user")
    for name in ("charts", "examples"):
        (home / name).symlink_to(REPO / name)
    (home / "my-values.yaml").write_text("# the user's own values\n")
    return home


def as_template(command: Command) -> list[str]:
    """``command`` as ``helm template`` with the same release, chart and values."""
    argv = list(command.argv)
    if argv[1:3] == ["upgrade", "--install"]:
        argv[1:3] = ["template"]
    elif argv[1] == "install":
        argv[1] = "template"
    return [a for a in argv if a not in ("--create-namespace", "--wait")]


def render(helm: dict, workdir: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm["path"], *argv[1:]], cwd=workdir, env=helm["env"],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def test_the_docs_show_an_install_command_for_every_goal_and_layer() -> None:
    """The extraction finds the commands the pages are known to show (a failing extraction
    must not pass as "nothing to check")."""
    assert len(DOCS) >= 8, [c.where for c in DOCS]
    assert {c.goal() for c in HEADERS} == set(GOALS)
    assert {layer for c in DOCS for layer in c.layers()} == set(LAYERS)
    assert any(c.where.startswith("docs/dra.md") for c in DOCS)


@pytest.mark.parametrize("command", DOCS + HEADERS, ids=lambda c: c.where)
def test_every_install_command_renders_as_written(helm, workdir: Path, command: Command) -> None:
    proc = render(helm, workdir, as_template(command))
    assert proc.returncode == 0, f"{command.where}: {' '.join(command.argv)}\n{proc.stderr}"
    assert "kind: DaemonSet" in proc.stdout


@pytest.mark.parametrize("command", DOCS + HEADERS, ids=lambda c: c.where)
def test_a_command_with_a_goal_passes_the_nvidia_layer_after_it(command: Command) -> None:
    goal = command.goal()
    if goal is None:
        return  # the bare chart, a trace replay, a dev cluster: no goal, no layer
    files = [Path(a).name for a in command.argv if a.endswith(".yaml")]
    assert command.layers(), f"{command.where} passes {goal} without a layer ({LAYERS})"
    assert files.index(command.layers()[0]) > files.index(goal), command.where


@pytest.mark.parametrize("goal", GOALS)
@pytest.mark.parametrize("layer", LAYERS)
def test_each_documented_goal_command_renders_for_every_goal(helm, workdir: Path, goal: str, layer: str) -> None:
    """install.md shows its commands with one goal ("with your goal's file"): the same
    command with each goal and each layer renders."""
    base = next(c for c in DOCS if c.goal() and c.where.startswith("docs/install.md"))
    argv = [f"examples/install/{goal}" if Path(a).name in GOALS
            else f"examples/install/{layer}" if Path(a).name in LAYERS else a
            for a in as_template(base)]  # fmt: skip
    proc = render(helm, workdir, argv)
    assert proc.returncode == 0, proc.stderr


def test_the_layer_files_headers_name_every_goal_file() -> None:
    for layer in LAYERS:
        header = "".join(x for x in (INSTALL / layer).read_text().splitlines() if x.startswith("#"))
        missing = [g for g in GOALS if g not in header]
        assert not missing, f"{layer}'s header does not name {missing}"


def test_the_goal_files_count_the_goals_install_md_lists() -> None:
    table = [row for row in (REPO / "docs" / "install.md").read_text().splitlines()
             if row.startswith("|") and "examples/install/" in row]  # fmt: skip
    listed = [g for row in table for g in GOALS if f"examples/install/{g}" in row]
    assert listed == list(GOALS)
    for n, goal in enumerate(GOALS, start=1):
        first = (INSTALL / goal).read_text().splitlines()[0]
        assert first.startswith(f"# Goal {n} of {len(GOALS)}"), f"{goal}: {first}"

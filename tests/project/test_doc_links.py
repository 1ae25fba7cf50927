"""README.md and docs/*.md: every relative link, every anchor and every repository path named in
backticks resolves.

Anchors follow GitHub's heading slugs: lowercased, punctuation dropped (letters, digits, spaces,
``-`` and ``_`` kept), each space a ``-``, and a repeated heading suffixed ``-1``, ``-2``, ...
Paths in backticks are checked when they start with one of the repository's top-level folders
(``tests/``, ``omaticaya_py/``, ``bench/``, ...); a ``*`` in one is a glob that must match a file,
and ``folder/module.name`` names a name in ``folder/module.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_TOP_DIRS = (
    "omaticaya_py/",
    "tests/",
    "bench/",
    "scripts/",
    "examples/",
    "charts/",
    "docs/",
    ".ci/",
)
_PATH = re.compile(r"^[A-Za-z0-9_.*/-]+$")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The (line number, line) pairs outside fenced code blocks."""
    out: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before the duplicate suffix)."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)  # code spans keep their text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links keep their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, duplicates suffixed as GitHub does."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(path.read_text()):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("Who uses each GPU", "who-uses-each-gpu"),
        ("Exact free memory: never above the truth", "exact-free-memory-never-above-the-truth"),
        ("6. Label churn (`bench/label_churn.py`)", "6-label-churn-benchlabel_churnpy"),
        (
            "The scheduler extender: `omaticaya extender`",
            "the-scheduler-extender-omaticaya-extender",
        ),
        (
            "Issue 24: kept verdicts and orjson, before vs after",
            "issue-24-kept-verdicts-and-orjson-before-vs-after",
        ),
    ],
)
def test_slug_follows_github(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def _links(path: Path) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for number, line in _prose_lines(path.read_text()):
        for match in _LINK.finditer(line):
            out.append((number, match.group(1)))
    return out


def _broken_links(path: Path, root: Path = REPO) -> list[str]:
    """Each relative link of ``path`` whose file or anchor does not resolve, as text."""
    broken: list[str] = []
    for number, target in _links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where} (no heading with that anchor)")
    return broken


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_code_fences_are_closed(path: Path) -> None:
    """An unclosed fence would hide every link after it from the checks below (and GitHub would
    show the rest of the page as code)."""
    fences = [line for line in path.read_text().splitlines() if _FENCE.match(line)]
    assert len(fences) % 2 == 0, f"{path.relative_to(REPO)}: a code fence is not closed"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(path: Path) -> None:
    assert _broken_links(path) == []


def _missing_paths(path: Path, root: Path = REPO) -> list[str]:
    """Each repository path named in backticks in ``path`` that no file under ``root`` has."""
    missing: list[str] = []
    for number, line in _prose_lines(path.read_text()):
        for match in _CODE_SPAN.finditer(line):
            token = match.group(1).strip().rstrip(".,:;")
            if not token.startswith(_TOP_DIRS) or not _PATH.match(token):
                continue
            found = any(root.glob(token)) if "*" in token else (root / token).exists()
            if not found and "." in token.rsplit("/", 1)[-1]:  # `bench/burst_data.max_packed`
                found = (root / f"{token.split('.', 1)[0]}.py").exists()
            if not found:
                missing.append(f"{path.relative_to(root)}:{number}: {token}")
    return missing


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_repository_paths_in_backticks_exist(path: Path) -> None:
    assert _missing_paths(path) == []


def test_a_broken_link_and_a_missing_path_are_found(tmp_path: Path) -> None:
    """The checks themselves, on a small tree: a dead file link, a dead anchor, a missing path;
    links inside a code fence and the ones that resolve are not reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_here.py").write_text("")
    (tmp_path / "README.md").write_text("# Top\n\n## Two words: `code`\n")
    page = tmp_path / "docs" / "probe.md"
    page.write_text(
        "# Probe\n\n## Probe\n\n[ok](#probe) [dup](#probe-1) [gone](no-such.md)\n"
        "[bad](../README.md#no-such-heading) [good](../README.md#two-words-code)\n"
        "`tests/no_such_test.py` `tests/test_here.py` `tests/test_h*.py` `tests/x*.py`\n"
        "```\n[in a fence](nowhere.md) `tests/fenced.py`\n```\n"
    )
    assert _broken_links(page, tmp_path) == [
        "docs/probe.md:5: no-such.md (no such file)",
        "docs/probe.md:6: ../README.md#no-such-heading (no heading with that anchor)",
    ]
    assert _missing_paths(page, tmp_path) == [
        "docs/probe.md:7: tests/no_such_test.py",
        "docs/probe.md:7: tests/x*.py",
    ]


def _layout_block(text: str) -> str:
    """The ``omaticaya_py/`` tree drawn in docs/development.md's Layout section."""
    start = text.index("```\nomaticaya_py/")
    return text[start : text.index("\n```", start + 3)]


def test_the_layout_names_only_modules_that_exist() -> None:
    """Each ``name.py`` in docs/development.md's layout is a file of the repository (by name:
    the tree's indentation says where), so a rename that forgets the layout fails here."""
    block = _layout_block((REPO / "docs" / "development.md").read_text())
    named = set(re.findall(r"\b([a-z_0-9]+\.py)\b", block))
    here = {
        path.name
        for top in ("omaticaya_py", "tests", "scripts", "bench", "devtools")
        for path in (REPO / top).rglob("*.py")
    }
    assert sorted(named - here) == []

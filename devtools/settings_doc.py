"""docs/commands.md's settings tables and ``.env.example``, generated from the settings sections.

A program's settings class is sections combined (``core.config.settings``); each section has
one table in docs/commands.md, between ``<!-- settings:KEY -->`` and ``<!-- /settings:KEY -->``,
and one block in ``.env.example``, in the order of ``SECTIONS``. A row per field of the section,
in declaration order: the environment variable (``field_env_names``' first, as the program
that reads it names it; former names after it), the default as the environment writes it, and
the field's description. tests/core/config/test_settings_doc.py fails when the files and the models
disagree; rewrite both with:

    .venv/bin/python -m devtools.settings_doc
"""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parent.parent
COMMANDS_MD = ROOT / "docs" / "commands.md"
ENV_EXAMPLE = ROOT / ".env.example"

#: example values of settings without a default, shown commented out in .env.example
EXAMPLES = {
    "NODE_NAME": "gpu-node-1",
    "OMATICAYA_TRACE": "tests/data/h100-trace.json",
    "OMATICAYA_PROC_ROOT": "/proc",
    "OMATICAYA_EXTENDER_STALE_POLICY": "reject",
    "OMATICAYA_EXTENDER_UNKNOWN_POLICY": "reject",
    "OMATICAYA_EXTENDER_KUBECONFIG": "/root/.kube/config",
    "OMATICAYA_MPS_HOST_ROOT": "/host/run/omaticaya/mps",
}

ENV_HEADER = """\
# Omaticaya settings, generated from the settings sections (python -m devtools.settings_doc;
# docs/commands.md says which program reads which section). Copy to .env (read from the working
# directory) or export them; command-line flags win over both. Every value below is the
# built-in default; a setting without one is commented out, with an example.
# In the Helm chart these are chart values (docs/chart.md); there NODE_NAME comes from the
# downward API and OMATICAYA_LOG_JSON defaults to true.
"""


@dataclass(frozen=True)
class Section:
    """One section as the docs show it: its ``key`` (the marker in docs/commands.md), a
    ``title`` for .env.example, the ``program`` class that names its variables, and the
    ``section`` class whose own fields it lists (``fields``: ``section``'s and, for
    ``with_common``, the common ones first)."""

    key: str
    title: str
    program: type[BaseSettings]
    section: type[BaseSettings]
    with_common: bool = False

    def fields(self) -> list[str]:
        from omaticaya_py.core.config.settings import CommonSettings, section_fields

        common = section_fields(CommonSettings) if self.with_common else []
        return common + section_fields(self.section)


def sections() -> list[Section]:
    """Every section, in the order the docs show them."""
    from omaticaya_py.core.config import settings as s
    from omaticaya_py.mps.settings import MpsSection, MpsSettings
    from omaticaya_py.scheduler.settings import ExtenderSection, ExtenderSettings

    return [
        Section("agent", "the agent", s.Settings, s.AgentSection, with_common=True),
        Section("node", "every program on a GPU node", s.Settings, s.NodeSection),
        Section("placement", "placement: the agent's plugins and the extender alike",
                s.Settings, s.PlacementSection),  # fmt: skip
        Section("sharing", "GPU sharing by memory", s.Settings, s.SharingSection),
        Section("device-plugin", "the device plugin", s.Settings, s.DevicePluginSection),
        Section("dra", "the DRA driver", s.Settings, s.DraSection),
        Section("mps-paths", "the MPS folders (the plugins and omaticaya mps)", s.Settings,
                s.MpsPathsSection),  # fmt: skip
        Section("mps", "omaticaya mps", MpsSettings, MpsSection),
        Section("extender", "omaticaya extender", ExtenderSettings, ExtenderSection,
                with_common=True),  # fmt: skip
    ]


def default_text(value: Any) -> str:
    """A default as one would write it in the environment: ``true``, ``10``, ``13,31``;
    ``—`` for none (unset)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (frozenset, set)):
        return ",".join(str(v) for v in sorted(value))
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    text = str(value)
    return text if text else "(empty)"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _names(cls: type[BaseSettings], name: str) -> tuple[str, list[str], list[str]]:
    """``(variable, other names read alike, former names)`` of field ``name`` of ``cls``:
    the former names are a ``Renamed`` setting's (read with a warning)."""
    from omaticaya_py.core.config.settings_base import Renamed, field_env_names

    first, *rest = field_env_names(cls, name)
    if isinstance(cls.model_fields[name].validation_alias, Renamed):
        return first, [], rest
    return first, rest, []


def table(sec: Section) -> str:
    """The markdown table of one section: variable (former names after it), default, meaning."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name in sec.fields():
        field = sec.program.model_fields[name]
        first, alike, old = _names(sec.program, name)
        variable = " or ".join(f"`{v}`" for v in (first, *alike)) + (
            " (formerly " + ", ".join(f"`{v}`" for v in old) + ")" if old else ""
        )
        rows.append(
            f"| {variable} | `{_cell(default_text(field.default))}` | "
            f"{_cell(field.description or '')} |"
        )
    return "\n".join(rows)


def render(text: str) -> str:
    """``text`` (docs/commands.md) with each section's table regenerated. Raises ``ValueError``
    when a section's markers are missing."""
    for sec in sections():
        pattern = re.compile(
            rf"(<!-- settings:{sec.key} -->\n)(?:.*?\n)?(<!-- /settings:{sec.key} -->)", re.DOTALL
        )
        if not pattern.search(text):
            raise ValueError(f"docs/commands.md has no <!-- settings:{sec.key} --> block")
        rows = table(sec)
        text = pattern.sub(lambda m, rows=rows: m.group(1) + rows + "\n" + m.group(2), text)
    return text


def env_example() -> str:
    """``.env.example``: a block per section, each setting with its description as a comment
    above ``NAME=default`` (``# NAME=example`` for one without a default)."""
    out = [ENV_HEADER]
    for sec in sections():
        out.append(f"\n# ==== {sec.title} " + "=" * max(4, 90 - len(sec.title)) + "\n")
        for name in sec.fields():
            field = sec.program.model_fields[name]
            first, _, old = _names(sec.program, name)
            about = (field.description or name).strip()
            if old:
                about += f" (Formerly {', '.join(old)}: still read, with a warning.)"
            out.append("\n" + "\n".join(_comment(about)) + "\n")
            if field.default is None:
                out.append(f"# {first}={EXAMPLES.get(first, '')}\n")
            else:
                value = default_text(field.default)
                out.append(f"{first}={'' if value == '(empty)' else value}\n")
    return "".join(out)


def _comment(text: str, width: int = 98) -> list[str]:
    """``text`` as ``# `` comment lines of at most ``width`` characters, a short last line
    (under 20) joined to the one before: the line above a setting says something."""
    lines = textwrap.wrap(text, width - 2)
    if len(lines) > 1 and len(lines[-1]) < 20:
        lines[-2:] = [lines[-2] + " " + lines[-1]]
    return ["# " + line for line in lines]


def main() -> int:
    """Rewrite docs/commands.md and .env.example; exit 0."""
    COMMANDS_MD.write_text(render(COMMANDS_MD.read_text()))
    ENV_EXAMPLE.write_text(env_example())
    for path in (COMMANDS_MD, ENV_EXAMPLE):
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

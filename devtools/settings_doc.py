"""docs/commands.md's settings tables, generated from the settings models.

Each table sits between ``<!-- settings:NAME -->`` and ``<!-- /settings:NAME -->`` in
docs/commands.md: ``agent`` from ``core.config.settings.Settings`` (every command but the extender),
``extender`` from ``scheduler.settings.ExtenderSettings``. A row per field, in declaration
order: the environment variables (``field_env_names``), the default as the environment writes
it, and the field's description. tests/test_settings_doc.py fails when the file and the models
disagree; rewrite the file with:

    .venv/bin/python -m devtools.settings_doc
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parent.parent
COMMANDS_MD = ROOT / "docs" / "commands.md"


def _models() -> dict[str, type[BaseSettings]]:
    from omaticaya_py.core.config.settings import Settings
    from omaticaya_py.mps.settings import MpsSettings
    from omaticaya_py.scheduler.settings import ExtenderSettings

    return {"agent": Settings, "extender": ExtenderSettings, "mps": MpsSettings}


def own_fields(key: str, cls: type[BaseSettings]) -> list[str]:
    """The fields of ``cls`` its table lists: all, except for ``mps`` (``omaticaya mps``),
    whose table lists only what the agent's does not (it reads the agent's too)."""
    if key != "mps":
        return list(cls.model_fields)
    from omaticaya_py.core.config.settings import Settings

    return [f for f in cls.model_fields if f not in Settings.model_fields]


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


def table(cls: type[BaseSettings], fields: list[str] | None = None) -> str:
    """The markdown table of one settings class (of ``fields`` of it; all by default):
    variable, default, meaning."""
    from omaticaya_py.core.config.settings_base import field_env_names

    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name, field in cls.model_fields.items():
        if fields is not None and name not in fields:
            continue
        variable = " or ".join(f"`{v}`" for v in field_env_names(cls, name))
        rows.append(
            f"| {variable} | `{_cell(default_text(field.default))}` | "
            f"{_cell(field.description or '')} |"
        )
    return "\n".join(rows)


def render(text: str) -> str:
    """``text`` (docs/commands.md) with each marked table regenerated. Raises ``ValueError``
    when a model's markers are missing."""
    for key, cls in _models().items():
        pattern = re.compile(
            rf"(<!-- settings:{key} -->\n)(?:.*?\n)?(<!-- /settings:{key} -->)", re.DOTALL
        )
        if not pattern.search(text):
            raise ValueError(f"docs/commands.md has no <!-- settings:{key} --> block")
        rows = table(cls, own_fields(key, cls))
        text = pattern.sub(lambda m, rows=rows: m.group(1) + rows + "\n" + m.group(2), text)
    return text


def main() -> int:
    """Rewrite docs/commands.md; exit 0."""
    COMMANDS_MD.write_text(render(COMMANDS_MD.read_text()))
    print(f"wrote {COMMANDS_MD.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

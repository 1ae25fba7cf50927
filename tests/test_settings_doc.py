"""docs/commands.md lists every setting of the agent, the extender and the MPS supervisor, generated from the
settings models (devtools/settings_doc.py), so the docs cannot drift from the code (issue 31:
the device-plugin, sharing, PodResources and proc-root settings were missing)."""

from __future__ import annotations

import re

from devtools.settings_doc import COMMANDS_MD, default_text, own_fields, render
from omaticaya_py.core.config.settings import Settings
from omaticaya_py.core.config.settings_base import env_names, field_env_names
from omaticaya_py.mps.settings import MpsSettings
from omaticaya_py.scheduler.settings import ExtenderSettings


def test_commands_md_is_what_the_models_generate():
    text = COMMANDS_MD.read_text()
    assert render(text) == text, (
        "docs/commands.md's settings tables differ from the settings models: run "
        "`.venv/bin/python -m devtools.settings_doc`"
    )


def test_every_variable_is_in_the_tables_once():
    text = COMMANDS_MD.read_text()
    rows = re.findall(r"^\| (`[A-Z_]+`(?: or `[A-Z_]+`)?) \|", text, re.MULTILINE)
    named = [v for row in rows for v in re.findall(r"`([A-Z_]+)`", row)]
    # once per table; a setting both programs read (the placement policy) is in both
    both = env_names(Settings) & env_names(ExtenderSettings)
    assert sorted(v for v in set(named) if named.count(v) > 1) == sorted(
        v for v in both if named.count(v) == 2
    )
    mps_own = {v for f in own_fields("mps", MpsSettings) for v in field_env_names(MpsSettings, f)}
    assert mps_own and not mps_own & env_names(Settings)
    assert set(named) == env_names(Settings) | env_names(ExtenderSettings) | mps_own
    for field in ("device_plugin", "shared_gpus", "pod_resources_socket", "proc_root"):
        assert f"`OMATICAYA_{field.upper()}`" in text


def test_default_text():
    assert [default_text(v) for v in (None, True, 10.0, 2.5, frozenset({31, 13}), ("a", "b"), "")] \
        == ["—", "true", "10", "2.5", "13,31", "a,b", "(empty)"]

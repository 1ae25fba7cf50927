"""docs/commands.md and .env.example list every setting of the agent, the extender and the MPS
supervisor, section by section, generated from the settings sections (devtools/settings_doc.py),
so the docs cannot drift from the code (issue 31: settings were missing; issue 49: one section
per system, one name per fact)."""

from __future__ import annotations

import re

import pytest

from devtools.settings_doc import (
    COMMANDS_MD,
    ENV_EXAMPLE,
    default_text,
    env_example,
    render,
    sections,
)
from omaticaya_py.core.config.settings import (
    AgentSection,
    DevicePluginSettings,
    PlacementSection,
    Settings,
    section_fields,
)
from omaticaya_py.core.config.settings import sections as sections_of
from omaticaya_py.core.config.settings_base import env_names, field_env_names
from omaticaya_py.mps.settings import MpsSettings
from omaticaya_py.scheduler.settings import ExtenderSettings


def test_commands_md_is_what_the_sections_generate():
    text = COMMANDS_MD.read_text()
    assert render(text) == text, (
        "docs/commands.md's settings tables differ from the settings sections: run "
        "`.venv/bin/python -m devtools.settings_doc`"
    )


def test_env_example_is_what_the_sections_generate():
    assert ENV_EXAMPLE.read_text() == env_example(), (
        ".env.example differs from the settings sections: run "
        "`.venv/bin/python -m devtools.settings_doc`"
    )


def _variables(text: str) -> list[str]:
    rows = re.findall(r"^\| (`[A-Z_]+`.*?) \| `", text, re.MULTILINE)
    return [v for row in rows for v in re.findall(r"`([A-Z_]+)`", row.split(" (formerly ")[0])]


def test_every_variable_is_in_the_tables_once():
    """One row per fact: a setting the agent and the extender share is in the placement table
    only, and every variable a program reads is in some table."""
    named = _variables(COMMANDS_MD.read_text())
    assert sorted(v for v in set(named) if named.count(v) > 1) == []
    readers = (Settings, ExtenderSettings, MpsSettings)
    assert set(named) == frozenset().union(*(env_names(c) for c in readers)) - {
        v for c in readers for f, i in c.model_fields.items()
        for v in field_env_names(c, f)[1:] if type(i.validation_alias).__name__ == "Renamed"
    }  # fmt: skip
    for field in ("device_plugin", "shared_gpus", "pod_resources_socket", "proc_root"):
        assert f"`OMATICAYA_{field.upper()}`" in COMMANDS_MD.read_text()


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        (Settings, ["CommonSettings", "AgentSection", "NodeSection", "PlacementSection",
                    "SharingSection", "DevicePluginSection", "DraSection", "MpsPathsSection"]),
        (DevicePluginSettings, ["CommonSettings", "NodeSection", "PlacementSection",
                                "SharingSection", "DevicePluginSection", "DraSection",
                                "MpsPathsSection"]),
        (MpsSettings, ["CommonSettings", "MpsSection", "NodeSection", "PlacementSection",
                       "SharingSection", "DevicePluginSection", "DraSection", "MpsPathsSection"]),
        (ExtenderSettings, ["CommonSettings", "ExtenderSection", "PlacementSection"]),
    ],
    ids=["agent", "device-plugin", "mps", "extender"],
)  # fmt: skip
def test_each_program_reads_its_sections(program, expected):
    assert [c.__name__ for c in sections_of(program)] == expected
    # every field of the program is declared by exactly one of its sections
    fields = [f for c in sections_of(program) for f in section_fields(c)]
    assert sorted(fields) == sorted(program.model_fields)


def test_every_documented_section_is_a_section_of_its_program():
    for sec in sections():
        assert sec.section in sections_of(sec.program), sec.key
        assert sec.fields(), sec.key


def test_a_shared_fact_has_one_name_in_both_programs():
    for field in section_fields(PlacementSection):
        assert field_env_names(Settings, field) == field_env_names(ExtenderSettings, field), field
        assert field_env_names(Settings, field)[0].startswith("OMATICAYA_")
        assert not field_env_names(Settings, field)[0].startswith("OMATICAYA_EXTENDER_")
    assert not set(section_fields(AgentSection)) & set(ExtenderSettings.model_fields)


def test_default_text():
    assert [default_text(v) for v in (None, True, 10.0, 2.5, frozenset({31, 13}), ("a", "b"), "")] \
        == ["—", "true", "10", "2.5", "13,31", "a,b", "(empty)"]


@pytest.mark.parametrize("program", [Settings, MpsSettings, ExtenderSettings],
                         ids=["agent", "mps", "extender"])  # fmt: skip
def test_no_two_sections_of_a_program_name_a_validator_alike(program):
    """pydantic collects validators by attribute name: a section's ``_check_x`` of the same
    name as another's would silently replace it in the combined class (OMATICAYA_TRACE='' was
    refused once, the agent's ``_empty_is_none`` shadowing the node section's)."""
    seen: dict[str, str] = {}
    for section in sections_of(program):
        decorators = section.__pydantic_decorators__
        own = {**decorators.field_validators, **decorators.model_validators}
        for name in own:
            if name in vars(section):
                assert name not in seen, f"{name}: in {seen.get(name)} and {section.__name__}"
                seen[name] = section.__name__

"""The device plugin's placement policy is the one setting the extender reads too
(``OMATICAYA_PLACEMENT_POLICY``, issue 38): its old name ``OMATICAYA_SHARE_POLICY`` is still read,
and both set to different values is an error naming both and the expected form."""

from __future__ import annotations

import os

import pytest

from omaticaya_py.core.config.settings import (
    DevicePluginSettings,
    Settings,
    SettingsError,
    load_settings,
)
from omaticaya_py.deviceplugin.config import plugin_config

NEW, OLD = "OMATICAYA_PLACEMENT_POLICY", "OMATICAYA_SHARE_POLICY"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> pytest.MonkeyPatch:
    for key in list(os.environ):
        if key.upper().startswith("OMATICAYA_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no .env
    return monkeypatch


@pytest.mark.parametrize(
    ("given", "policy"),
    [
        ({}, "binpack"),
        ({NEW: "spread"}, "spread"),
        ({OLD: "spread"}, "spread"),  # the old name alone: still read
        ({NEW: "spread", OLD: "Spread"}, "spread"),  # both, alike
    ],
)
def test_the_plugins_policy_is_the_placement_policy(env, given, policy) -> None:
    for key, value in given.items():
        env.setenv(key, value)
    settings = load_settings()
    assert settings.placement_policy == policy
    assert plugin_config(settings).sharing.policy == policy


def test_both_names_set_differently_is_one_error_naming_both(env) -> None:
    env.setenv(NEW, "spread")
    env.setenv(OLD, "binpack")
    with pytest.raises(SettingsError) as err:
        load_settings()
    line = str(err.value)
    assert "\n" not in line and NEW in line and OLD in line
    assert "'binpack' or 'spread'" in line


def test_a_bad_policy_names_the_variable_it_came_from(env) -> None:
    env.setenv(NEW, "pack")
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert f"{NEW}='pack'" in str(err.value)


def test_the_device_plugin_section_is_one_model() -> None:
    """The plugin's settings are a section of their own that the agent's settings include."""
    from omaticaya_py.core.config.settings_base import CommonSettings

    section = set(DevicePluginSettings.model_fields) - set(CommonSettings.model_fields)
    assert section == {
        "device_plugin", "device_plugin_resource", "device_plugin_dir", "shared_gpus",
        "share_unit_mib", "shared_resource", "placement_policy", "settle_s",
        "device_list_strategy", "share_enforcement", "mps_root", "mps_state_dir",
        "mps_thread_share", "mps_stale_s", "dra", "dra_plugin_dir", "dra_registry_dir",
        "dra_cdi_dir", "dra_dev_root", "dra_taint_effect", "dra_driver_files", "dra_driver_root",
        "dra_driver_host_root", "trace", "metrics_address",
    }
    assert issubclass(Settings, DevicePluginSettings)

"""Settings: environment ``OMATICAYA_*``, a ``.env`` file, and CLI flags (which win).

A program's settings class is the sections it reads, combined (each a settings class of its
own, parsed by pydantic-settings; one environment name per fact):

- ``CommonSettings`` (``settings_base``): the key prefix and logging, every program's;
- ``AgentSection`` (``agent``): the agent's own: schedule, labels, health, the write budget;
- ``NodeSection`` (``node``): what every node program reads (``OMATICAYA_TRACE``,
  ``OMATICAYA_METRICS_ADDRESS``);
- ``PlacementSection`` (``sharing``): the facts the scheduler extender and the node's plugins
  share (resources, ``OMATICAYA_PLACEMENT_POLICY``, ``OMATICAYA_SETTLE_S``);
- ``SharingSection`` (``sharing``): GPU sharing by memory;
- ``DevicePluginSection``, ``DraSection``, ``MpsPathsSection`` (``plugins``): the kubelet
  plugins and the MPS folders.

``Settings`` (the agent, its device plugin and DRA plugin) reads them all; ``DevicePluginSettings``
the node's plugin sections (``omaticaya mps``'s ``MpsSettings`` builds on it);
``scheduler.settings.ExtenderSettings`` the placement section and its own. ``sections`` lists a
program's sections in the order docs/commands.md and ``.env.example`` show them.

A bad value raises ``SettingsError`` whose message is one line per bad setting naming the
variable and the expected form; the CLI prints it and exits with status 2, without a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .agent import AgentSection
from .node import NodeSection
from .plugins import DEVICE_LIST_STRATEGIES, DevicePluginSection, DraSection, MpsPathsSection
from .schedule import Schedule, parse_schedule
from .settings_base import RESERVED_PREFIXES, CommonSettings, SettingsError, check_prefix, load
from .sharing import PlacementSection, SharingSection, check_resource_name

__all__ = [
    "DEVICE_LIST_STRATEGIES",
    "RESERVED_PREFIXES",
    "AgentSection",
    "CommonSettings",
    "DevicePluginSection",
    "DevicePluginSettings",
    "DraSection",
    "MpsPathsSection",
    "NodeSection",
    "PlacementSection",
    "Schedule",
    "Settings",
    "SettingsError",
    "SharingSection",
    "check_prefix",
    "check_resource_name",
    "load",
    "load_settings",
    "parse_schedule",
    "sections",
    "stuck_after_s",
]


class DevicePluginSettings(NodeSection, PlacementSection, SharingSection, DevicePluginSection,
                           DraSection, MpsPathsSection):  # fmt: skip
    """The node's plugin sections (``deviceplugin.config.plugin_config`` and the DRA plugin read
    them; ``omaticaya mps`` too): the device plugin, the DRA driver, the MPS folders, sharing
    and placement. Raises ``ValueError`` (``SettingsError`` through ``load``) on a bad value,
    naming the variable, and when both kubelet plugins are on."""

    model_config = SettingsConfigDict(env_prefix="OMATICAYA_", populate_by_name=True)

    @model_validator(mode="after")
    def _one_plugin(self) -> DevicePluginSettings:
        if self.dra and self.device_plugin:
            raise ValueError(
                "OMATICAYA_DRA and OMATICAYA_DEVICE_PLUGIN are both true: a GPU is served by one "
                "of the two on a node (the kubelet would hand it out twice); set one to false"
            )
        return self


class Settings(AgentSection, DevicePluginSettings):
    """Every setting of the agent (``omaticaya run``, ``once``, ``show``, ``cleanup``,
    ``device-plugin``): its own section and the node's plugin sections
    (``DevicePluginSettings``). Environment names are ``OMATICAYA_<FIELD>`` in upper case, except
    the Node name, which is ``NODE_NAME`` as the downward API sets it, and the placement
    section's (one name for the agent and the extender)."""

    model_config = SettingsConfigDict(env_prefix="OMATICAYA_", populate_by_name=True)


def sections(cls: type[BaseSettings]) -> list[type[CommonSettings]]:
    """The sections of settings class ``cls`` (the ``CommonSettings`` subclasses in its MRO that
    declare fields of their own, ``cls`` included), ``CommonSettings`` first, then in the order
    of the bases (``Settings``: common, agent, node, placement, sharing, device plugin, DRA,
    MPS paths). Pure."""
    own = [c for c in cls.__mro__ if isinstance(c, type) and issubclass(c, CommonSettings)
           and section_fields(c)]  # fmt: skip
    common = [c for c in own if c is CommonSettings]
    return common + [c for c in own if c is not CommonSettings]


def section_fields(cls: type[BaseSettings]) -> list[str]:
    """The fields section ``cls`` declares itself (not those of its bases), in order."""
    declared = vars(cls).get("__annotations__", {})
    return [name for name in declared if name in cls.model_fields]


def stuck_after_s(settings: Settings) -> float:
    """The stuck-reading bound, seconds: ``stuck_tick_periods`` (``OMATICAYA_STUCK_TICK_PERIODS``)
    schedule periods plus the jitter (``jitter_s``). No tick finished for this long, the agent's
    ``/healthz`` fails (``SnapshotCache.tick_overdue``); a reading this old, the device plugin
    reports every device Unhealthy (``stale-reading``). Pure."""
    return settings.stuck_tick_periods * settings.schedule.period_s() + settings.jitter_s


def load_settings(flag_names: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """``load(Settings, ...)``: the agent's settings (see ``load``)."""
    return load(Settings, flag_names, **overrides)

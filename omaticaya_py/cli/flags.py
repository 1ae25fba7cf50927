"""Settings flags: one command-line flag per field of a settings class, generated from its fields.

A field ``memory_step_mib`` of ``Settings`` becomes ``--memory-step-mib`` (a ``bool`` field:
``--x``/``--no-x``), whose help is the field's description, its environment variable and its
default. The flag's value goes to the settings class unparsed, so the class checks flags and
environment alike, and a bad flag is named in the error (``SettingsError``) as the flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from ..core.settings_base import field_env_names

__all__ = ["SettingsFlags", "env_name", "say_unknown_variables"]


@dataclass(frozen=True)
class SettingsFlags:
    """The flags of one sub-command that set fields of ``model``.

    Every field of ``model`` except those in ``skip`` has the flag ``--<field-with-dashes>``;
    ``names`` gives a field another name, which comes first (``{"node_name": "--node"}``: the
    flags ``--node`` and ``--node-name``; errors name ``--node``). The flag's destination in the
    parsed ``Namespace`` is the field's name; a flag not given is ``None`` there (the settings
    class then takes the environment, ``.env`` or its default)."""

    model: type[BaseSettings]
    skip: frozenset[str] = frozenset()
    names: Mapping[str, str] = field(default_factory=dict)

    def fields(self) -> list[str]:
        """The fields that have a flag, in the model's order."""
        return [name for name in self.model.model_fields if name not in self.skip]

    def option_strings(self, name: str) -> list[str]:
        """The flags of field ``name``: its name in ``names`` (if any), then ``--<name>``."""
        generated = "--" + name.replace("_", "-")
        given = self.names.get(name)
        return [generated] if given in (None, generated) else [given, generated]

    def flag_names(self) -> dict[str, str]:
        """Field -> the flag that sets it (the first one): how errors name a flag's value."""
        return {name: self.option_strings(name)[0] for name in self.fields()}

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add the flags to ``parser``: a ``bool`` field as ``--x``/``--no-x``, any other as a
        flag taking one value, handed to the settings class as text."""
        for name in self.fields():
            info = self.model.model_fields[name]
            kwargs: dict[str, Any] = {"dest": name, "default": None, "help": self._help(name, info)}
            if info.annotation is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            parser.add_argument(*self.option_strings(name), **kwargs)

    def overrides(self, args: argparse.Namespace) -> dict[str, Any]:
        """Field -> the value its flag was given in ``args`` (``None``: not given)."""
        return {name: getattr(args, name, None) for name in self.fields()}

    def _help(self, name: str, info: FieldInfo) -> str:
        default = _shown(info.get_default(call_default_factory=True))
        where = env_name(self.model, name) + (f"; default {default}" if default else "")
        text = f"{info.description or ''} [{where}]".strip()
        return text.replace("%", "%%")  # argparse formats help with %


def env_name(model: type[BaseSettings], name: str) -> str:
    """The environment variable of field ``name`` (``core.settings_base.field_env_names``'
    first: ``NODE_NAME``, else the model's ``env_prefix`` and the name in upper case)."""
    return field_env_names(model, name)[0]


def say_unknown_variables(
    program: str, *models: type[BaseSettings], others: tuple[str, ...] = ()
) -> None:
    """Log one warning per ``OMATICAYA_*`` environment variable that no field of ``models``
    reads (a misspelt one does nothing otherwise), with the closest known name
    (``core.settings_base.unknown_variables``); ``others``: prefixes another program reads
    (the agent leaves ``OMATICAYA_EXTENDER_`` to the extender)."""
    import os

    from loguru import logger

    from ..core.settings_base import env_names, unknown_variable_lines, unknown_variables

    known = frozenset().union(*(env_names(m) for m in models))
    for line in unknown_variable_lines(unknown_variables(os.environ, known, others=others), program):
        logger.warning(line)


def _shown(value: Any) -> str:
    """A default as a user would write it ('' for none)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        return str(value)
    return ",".join(str(v) for v in sorted(value))

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

from ..core.config.settings_base import field_env_names

__all__ = ["SettingsFlags", "env_name", "say_unknown_variables"]


@dataclass(frozen=True)
class SettingsFlags:
    """The flags of one sub-command that set fields of ``model``.

    Every field of ``model`` except those in ``skip`` has the flag ``--<field-with-dashes>``;
    ``names`` gives a field another name, which comes first (``{"node_name": "--node"}``: the
    flags ``--node`` and ``--node-name``; errors name ``--node``). The flag's destination in the
    parsed ``Namespace`` is the field's name; a flag not given is ``None`` there (the settings
    class then takes the environment, ``.env`` or its default). ``old`` gives a field its
    former flags, kept as deprecated aliases left out of the help: given, one warns in one
    line on stderr and sets the field as the new flag does
    (``{"placement_policy": ("--share-policy",)}``: ``--share-policy`` warns)."""

    model: type[BaseSettings]
    skip: frozenset[str] = frozenset()
    names: Mapping[str, str] = field(default_factory=dict)
    old: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def fields(self) -> list[str]:
        """The fields that have a flag, in the model's order."""
        return [name for name in self.model.model_fields if name not in self.skip]

    def option_strings(self, name: str) -> list[str]:
        """The flags of field ``name``: its name in ``names`` (if any), then ``--<name>``."""
        generated = "--" + name.replace("_", "-")
        given = self.names.get(name)
        if given in (None, generated):
            return [generated]
        return [given, generated]

    def deprecated_flags(self, name: str) -> tuple[str, ...]:
        """The deprecated aliases of field ``name`` (``old``), none by default."""
        return tuple(self.old.get(name, ()))

    def flag_names(self, args: argparse.Namespace | None = None) -> dict[str, str]:
        """Field -> the flag that sets it (the first one; with ``args``, the deprecated alias
        where that was the one given): how errors name a flag's value."""
        used = getattr(args, _ALIAS_USED, {}) if args is not None else {}
        return {name: used.get(name, self.option_strings(name)[0]) for name in self.fields()}

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """Add the flags to ``parser``: a ``bool`` field as ``--x``/``--no-x``, any other as a
        flag taking one value, handed to the settings class as text; a deprecated alias as a
        hidden flag that warns (``_DeprecatedAlias``). Raises ``ValueError`` for a ``bool``
        field with an alias (not supported)."""
        for name in self.fields():
            info = self.model.model_fields[name]
            kwargs: dict[str, Any] = {"dest": name, "default": None, "help": self._help(name, info)}
            if info.annotation is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif name in self.names:  # the value named as the flag is: --node NODE
                kwargs["metavar"] = self.names[name].lstrip("-").replace("-", "_").upper()
            parser.add_argument(*self.option_strings(name), **kwargs)
            for alias in self.deprecated_flags(name):
                if info.annotation is bool:
                    raise ValueError(f"{alias}: a bool setting cannot have a deprecated alias")
                parser.add_argument(
                    alias, dest=name, default=None, help=argparse.SUPPRESS,
                    action=_DeprecatedAlias, new=self.option_strings(name)[0],
                    env=env_name(self.model, name),
                )  # fmt: skip

    def overrides(self, args: argparse.Namespace) -> dict[str, Any]:
        """Field -> the value its flag was given in ``args`` (``None``: not given)."""
        return {name: getattr(args, name, None) for name in self.fields()}

    def _help(self, name: str, info: FieldInfo) -> str:
        default = _shown(info.get_default(call_default_factory=True))
        where = env_name(self.model, name) + (f"; default {default}" if default else "")
        aliases = self.deprecated_flags(name)
        if aliases:
            where += f"; {', '.join(aliases)}, its old flag, is deprecated"
        text = f"{info.description or ''} [{where}]".strip()
        return text.replace("%", "%%")  # argparse formats help with %


#: the ``Namespace`` attribute where ``_DeprecatedAlias`` notes field -> the alias given
_ALIAS_USED = "deprecated_flags_given"


class _DeprecatedAlias(argparse.Action):
    """A deprecated flag: stores its value as the new flag ``new`` does, notes which flag was
    given (errors name it), and says once, on stderr, in one line, which flag to use."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, env: str,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(option_strings, dest, **kwargs)
        self.new = new
        self.env = env

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:  # fmt: skip
        import sys

        used = getattr(namespace, _ALIAS_USED, None)
        if used is None:
            used = {}
            setattr(namespace, _ALIAS_USED, used)
        if self.dest not in used:
            print(f"{parser.prog}: warning: {option_string} is deprecated: use {self.new} "
                  f"(it sets {self.env})", file=sys.stderr)  # fmt: skip
        used[self.dest] = option_string or self.new
        setattr(namespace, self.dest, values)


def env_name(model: type[BaseSettings], name: str) -> str:
    """The environment variable of field ``name`` (``core.config.settings_base.field_env_names``'
    first: ``NODE_NAME``, else the model's ``env_prefix`` and the name in upper case)."""
    return field_env_names(model, name)[0]


def say_unknown_variables(
    program: str, *models: type[BaseSettings], others: tuple[str, ...] = ()
) -> None:
    """Log one warning per ``OMATICAYA_*`` environment variable that no field of ``models``
    reads (a misspelt one does nothing otherwise), with the closest known name
    (``core.config.variables.unknown_variables``); ``others``: prefixes another program reads
    (the agent leaves ``OMATICAYA_EXTENDER_`` to the extender). Then one per former name of a
    setting of ``models[0]`` (the program's own) set in the environment or ``.env``, naming
    the new one (``deprecated_variable_lines``)."""
    import os

    from loguru import logger

    from ..core.config.settings_base import env_names
    from ..core.config.variables import (
        deprecated_variable_lines,
        unknown_variable_lines,
        unknown_variables,
    )

    known = frozenset().union(*(env_names(m) for m in models))
    for line in unknown_variable_lines(unknown_variables(os.environ, known, others=others), program):
        logger.warning(line)
    for line in deprecated_variable_lines(models[0], _environment(models[0])):
        logger.warning(line)


def _environment(model: type[BaseSettings]) -> dict[str, str]:
    """The variables ``model`` reads: the ``.env`` file of the working directory (read by
    pydantic-settings' own source, names in lower case), the environment over it."""
    import os

    from pydantic_settings import DotEnvSettingsSource

    dotenv = DotEnvSettingsSource(model, env_file=".env").env_vars
    return {**{k: v for k, v in dotenv.items() if v is not None}, **os.environ}


def _shown(value: Any) -> str:
    """A default as a user would write it ('' for none)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        return str(value)
    return ",".join(str(v) for v in sorted(value))

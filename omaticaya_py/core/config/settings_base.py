"""The settings base every Omaticaya service shares, and how settings are loaded.

``CommonSettings`` (key prefix, logging; a ``.env`` file beside the environment, values frozen,
``inf``/``nan`` refused) is what the agent's ``Settings`` and the extender's
``ExtenderSettings`` build on; ``load`` reads either, turning pydantic's errors into one line per
bad setting that names its variable (or flag) and the expected form (``SettingsError``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

__all__ = [
    "DNS_SUBDOMAIN",
    "RESERVED_PREFIXES",
    "CommonSettings",
    "Renamed",
    "SettingsError",
    "check_bind_address",
    "check_prefix",
    "check_trace",
    "env_names",
    "field_env_names",
    "load",
]

class SettingsError(ValueError):
    """A setting has a bad value; ``str()`` is one line per bad setting, ready to print."""


S = TypeVar("S", bound=BaseSettings)

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class Renamed(AliasChoices):
    """The validation alias of a setting read from one variable that has older names still
    accepted: ``Renamed("OMATICAYA_PLACEMENT_POLICY", "OMATICAYA_EXTENDER_STRATEGY")``. The
    first name wins when several are set alike; set to different values, loading fails with a
    ``SettingsError`` naming them and the expected form (``CommonSettings``' sources). The
    field's own name is taken too (flags), with ``populate_by_name`` in the model's config."""

    def __init__(self, name: str, *old: str) -> None:
        super().__init__(name, *old)

    @property
    def names(self) -> tuple[str, ...]:
        """The variables, the one to use first."""
        return tuple(c for c in self.choices if isinstance(c, str))


def _expected_form(info: FieldInfo) -> str:
    """``expected 'binpack' or 'spread'`` for a ``Literal`` or ``Enum`` field (the form
    pydantic's own message gives), else empty."""
    annotation = info.annotation
    if get_origin(annotation) is Literal:
        return "expected " + " or ".join(repr(a) for a in get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "expected " + " or ".join(repr(a.value) for a in annotation)
    return ""


class _RenamedAgree(PydanticBaseSettingsSource):
    """Reads nothing: refuses, before the values are merged, a ``Renamed`` setting whose
    names are set to different values (the environment over ``.env``, as pydantic-settings
    reads them, without regard to case), unless a flag gives the setting. pydantic-settings
    would take the first name silently; a user who set the old name on one side and the new
    one on the other gets told instead."""

    def __init__(self, settings_cls: type[BaseSettings], init: PydanticBaseSettingsSource,
                 *sources: PydanticBaseSettingsSource) -> None:  # fmt: skip
        super().__init__(settings_cls)
        self._init = init
        self._sources = sources

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def _value(self, name: str) -> str | None:
        for source in self._sources:
            found = getattr(source, "env_vars", {})
            for key in (name, name.lower()):
                if found.get(key) is not None:
                    return str(found[key])
        return None

    def __call__(self) -> dict[str, Any]:
        given = getattr(self._init, "init_kwargs", {})
        lines = []
        for field_name, info in self.settings_cls.model_fields.items():
            alias = info.validation_alias
            if not isinstance(alias, Renamed) or field_name in given or (
                set(alias.names) & set(given)
            ):
                continue
            set_ = [(n, v) for n in alias.names if (v := self._value(n)) is not None]
            if len({v.strip().lower() for _, v in set_}) < 2:
                continue
            shown = " and ".join(f"{n}={v!r}" for n, v in set_)
            old = [n for n, _ in set_ if n != alias.names[0]]
            form = _expected_form(info)
            lines.append(
                f"invalid settings: {shown} differ: set {alias.names[0]} alone ({', '.join(old)} "
                f"{'is its old name' if len(old) == 1 else 'are its old names'})"
                + (f", {form}" if form else "")
            )
        if lines:
            raise SettingsError("\n".join(lines))
        return {}


class CommonSettings(BaseSettings):
    """What every Omaticaya service is configured with, and how: the key prefix and logging;
    a ``.env`` file beside the environment, values frozen once loaded, ``inf``/``nan`` refused.
    ``Settings`` (the agent, ``OMATICAYA_*``) and the extender's ``ExtenderSettings``
    (``OMATICAYA_EXTENDER_*``) build on it; ``load`` reads either."""

    model_config = SettingsConfigDict(
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
        validate_default=True,
        allow_inf_nan=False,  # 'inf' and 'nan' parse as floats: no setting means them
    )

    prefix: str = Field(
        default="omaticaya.io",
        description="Label/annotation key prefix, a DNS subdomain: keys are <prefix>/<name>, "
        "and every key under it is the agent's (kubernetes.io, k8s.io, nvidia.com and their "
        "subdomains are refused).",
    )
    log_json: bool = Field(default=False, description="Log JSON lines instead of text.")
    log_level: Literal["TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"] = (
        Field(
            default="INFO",
            description="Log level: TRACE, DEBUG, INFO, SUCCESS, WARNING, ERROR or CRITICAL.",
        )
    )

    def __init__(self, **values: Any) -> None:
        """Build from the sources (``settings_customise_sources``), ``values`` on top: fields by
        name (``load`` passes flags so) or by a validation alias, and pydantic-settings' own
        ``_env_file``-style arguments. Raises ``TypeError`` for a name that is none of those:
        the environment's unknown variables are only warned of (``unknown_variables``), but a
        caller's misspelt or renamed keyword (``strategy=`` for ``placement_policy``) would
        otherwise be dropped without a word."""
        unknown = sorted(k for k in values if not k.startswith("_") and k not in _init_names(type(self)))
        if unknown:
            raise TypeError(f"{type(self).__name__}: no setting named {', '.join(unknown)}")
        super().__init__(**values)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """pydantic-settings' sources in its order, behind a check that a ``Renamed``
        setting's names agree (``_RenamedAgree``)."""
        agree = _RenamedAgree(settings_cls, init_settings, env_settings, dotenv_settings)
        return init_settings, agree, env_settings, dotenv_settings, file_secret_settings

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        return check_prefix(value)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: Any) -> Any:
        return value.strip().upper() if isinstance(value, str) else value


def _init_names(cls: type[BaseSettings]) -> frozenset[str]:
    """The keywords ``cls`` takes: its fields' names and their validation aliases' names."""
    names: set[str] = set(cls.model_fields)
    for info in cls.model_fields.values():
        alias = info.validation_alias
        choices = (alias,) if isinstance(alias, str) else getattr(alias, "choices", ())
        names.update(c for c in choices if isinstance(c, str))
    return frozenset(names)


_EXPECTED = {
    "bool_parsing": "expected true or false",
    "int_parsing": "expected an integer",
    "float_parsing": "expected a number",
    "literal_error": None,
}


#: prefixes that belong to others: Kubernetes (the kubelet's ``kubernetes.io/hostname``,
#: ``node.kubernetes.io/*``, node-feature-discovery's ``feature.node.kubernetes.io/*``) and
#: NVIDIA (GPU Feature Discovery's ``nvidia.com/*``). The agent deletes every key under its
#: prefix that it does not produce, so it must never be given one of these or a subdomain.
RESERVED_PREFIXES = ("kubernetes.io", "k8s.io", "nvidia.com")


def check_bind_address(value: str, example: str = "'0.0.0.0' or '::'") -> str:
    """An IP address to bind a port to. Raises ``ValueError`` naming the form (``example``)
    for anything else (a host name, an empty string)."""
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"expected an IP address to bind, like {example}") from None
    return value


def check_trace(value: Path | None) -> Path | None:
    """A trace file's path (``None``: none). Raises ``ValueError`` when it is no file."""
    if value is not None and not value.is_file():
        raise ValueError("expected an existing trace file (JSON, format version 1 or 2)")
    return value


def check_prefix(value: str) -> str:
    """A label key prefix, trimmed of spaces and a trailing ``/``.

    Raises ``ValueError`` when it is ``RESERVED_PREFIXES`` or a subdomain of one (in any case),
    or unless it is a DNS subdomain of at most 253 characters."""
    value = value.strip().rstrip("/")
    lowered = value.lower()
    for reserved in RESERVED_PREFIXES:
        if lowered == reserved or lowered.endswith("." + reserved):
            raise ValueError(
                f"expected a prefix this agent owns, like 'omaticaya.io', not {reserved} or a "
                f"subdomain of it: every key under the prefix is removed when no longer produced"
            )
    if len(value) > 253 or not DNS_SUBDOMAIN.match(value):
        raise ValueError("expected a DNS subdomain of at most 253 characters, like 'omaticaya.io'")
    return value


def load(cls: type[S], flag_names: Mapping[str, str] | None = None, **overrides: Any) -> S:
    """Build a settings class from the environment and ``.env``, with ``overrides`` (CLI flags)
    on top; ``None`` overrides are ignored, so unset flags fall back to the environment.

    Raises ``SettingsError``: one line per bad setting, naming where the value came from (the
    flag in ``flag_names`` for an override, else its environment variable ``<env_prefix><FIELD>``
    or ``NODE_NAME``) and the expected form."""
    given = {k: v for k, v in overrides.items() if v is not None}
    flags = {k: v for k, v in (flag_names or {}).items() if k in given}
    try:
        return cls(**given)
    except ValidationError as exc:
        env_prefix = cls.model_config.get("env_prefix", "")
        lines = []
        for err in exc.errors():
            if not err["loc"]:  # a rule across settings: its message names the variables
                lines.append("invalid settings: " + err["msg"].removeprefix("Value error, "))
                continue
            name = str(err["loc"][0])
            field = _field_of(cls, name)
            if field in flags:
                var = flags[field]
            elif name in _NODE_NAME_ALIASES:
                var = "NODE_NAME"
            elif field in cls.model_fields:
                var = _variable_of(cls, field, given=field in given)
            else:
                var = f"{env_prefix}{name.upper()}"
            expected = _EXPECTED.get(err["type"]) or err["msg"].removeprefix("Value error, ")
            lines.append(f"invalid setting {var}={err.get('input')!r}: {expected}")
        raise SettingsError("\n".join(lines)) from None


_NODE_NAME_ALIASES = ("node_name", "NODE_NAME", "OMATICAYA_NODE_NAME")


def _variable_of(cls: type[BaseSettings], field: str, *, given: bool) -> str:
    """The variable to name for a bad value of ``field``: its first name
    (``field_env_names``), or, for a ``Renamed`` setting not given by a flag, the first of its
    names set in the environment (where the value came from: an old name too)."""
    import os

    names = field_env_names(cls, field)
    if len(names) > 1 and not given:
        upper = {k.upper() for k in os.environ}
        for name in names:
            if name.upper() in upper:
                return name
    return names[0]


def _field_of(cls: type[BaseSettings], loc: str) -> str:
    """The field an error's location names: the field itself, or the field one of whose
    ``Renamed`` variables it is (pydantic locates an aliased field's error by the alias its
    value came under)."""
    if loc in cls.model_fields:
        return loc
    for name, info in cls.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, Renamed) and loc in alias.names:
            return name
    return loc


def field_env_names(cls: type[BaseSettings], name: str) -> tuple[str, ...]:
    """The environment variables field ``name`` of a settings class is read from, first the one
    to name in messages: its upper-case string validation aliases (``NODE_NAME``,
    ``OMATICAYA_NODE_NAME``), else ``<env_prefix><NAME>``."""
    alias = cls.model_fields[name].validation_alias
    choices = (alias,) if isinstance(alias, str) else getattr(alias, "choices", ())
    upper = tuple(c for c in choices if isinstance(c, str) and c.isupper())
    return upper or (f"{cls.model_config.get('env_prefix', '')}{name.upper()}",)


def env_names(cls: type[BaseSettings]) -> frozenset[str]:
    """Every environment variable a settings class reads (``field_env_names`` of each field)."""
    return frozenset(v for name in cls.model_fields for v in field_env_names(cls, name))

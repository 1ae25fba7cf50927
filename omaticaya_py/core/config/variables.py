"""The environment's ``OMATICAYA_*`` variables against the settings (pure): the unknown ones (a
misspelt name, said at start with the closest known one) and the former names of renamed
settings (said with the new one). The CLI logs the lines (``cli.flags.say_unknown_variables``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from pydantic_settings import BaseSettings

from .settings_base import Renamed

__all__ = ["NOT_SETTINGS", "deprecated_variable_lines", "unknown_variable_lines", "unknown_variables"]

#: ``OMATICAYA_*`` names that are no setting of a program but are ours: what the device plugin
#: sets in a slice's containers, and what the project's own scripts read (scripts/, devtools/:
#: the dev cluster, bootstrap, tests). ``unknown_variables`` does not report them.
NOT_SETTINGS = frozenset({
    "OMATICAYA_GPU_MEMORY_LIMIT_MIB",
    "OMATICAYA_CACHE", "OMATICAYA_DEBIAN_MIRROR", "OMATICAYA_DEV_DIR", "OMATICAYA_HELM_WAIT_S",
    "OMATICAYA_IMAGE_NAME", "OMATICAYA_KUBELET_NODE", "OMATICAYA_KUBELET_READY_TIMEOUT",
    "OMATICAYA_POD_BRIDGE", "OMATICAYA_POD_SUBNET", "OMATICAYA_READY_TIMEOUT",
    "OMATICAYA_RELOCK_BASE", "OMATICAYA_SKIP_CLUSTER", "OMATICAYA_TOOLS_DOWNLOAD_TIMEOUT",
    "OMATICAYA_UV", "OMATICAYA_WRITE_ADMISSION_DATA",
})  # fmt: skip


def unknown_variables(
    environ: Mapping[str, str], known: Iterable[str], *, prefix: str = "OMATICAYA_",
    others: tuple[str, ...] = (),
) -> list[tuple[str, str | None]]:
    """``(name, closest known name or None)`` for each variable in ``environ`` under ``prefix``
    that is neither in ``known`` nor in ``NOT_SETTINGS`` nor under one of ``others`` (prefixes
    another program reads, e.g. the extender's ``OMATICAYA_EXTENDER_`` for the agent), sorted
    by name. pydantic-settings ignores such a variable: this is how a misspelt one
    (``OMATICAYA_SHEDULE``) gets said at start instead of silently doing nothing. Closest:
    ``difflib``'s best match of at least 0.6 similarity, the shared prefix left out.

    Names are compared as pydantic-settings reads them, without regard to case (its
    ``case_sensitive`` is off): a known variable spelt in another case
    (``OMATICAYA_Memory_Step_MIB``) is applied, so it comes back with its known name as the
    closest (``unknown_variable_lines`` says it is read as that name, not that it is ignored),
    and a prefix or ``others`` match in any case counts. ``NOT_SETTINGS`` are read by scripts,
    which match case: only their exact spelling is left out."""
    known = frozenset(known)
    by_upper = {k.upper(): k for k in known}
    upper_prefix = prefix.upper()
    upper_others = tuple(o.upper() for o in others)
    # compared without the prefix every name shares, which would make any two look alike
    by_rest = {k.upper().removeprefix(upper_prefix): k for k in sorted(known)}
    out: list[tuple[str, str | None]] = []
    for name in sorted(environ):
        upper = name.upper()
        if (
            not upper.startswith(upper_prefix) or name in known or name in NOT_SETTINGS
            or upper.startswith(upper_others)
        ):
            continue
        if upper in by_upper:  # applied: a spelling of a known name
            out.append((name, by_upper[upper]))
            continue
        rest = upper.removeprefix(upper_prefix)
        close = difflib.get_close_matches(rest, by_rest, n=1, cutoff=0.6)
        out.append((name, by_rest[close[0]] if close else None))
    return out


def unknown_variable_lines(unknown: Iterable[tuple[str, str | None]], program: str) -> list[str]:
    """One warning line per ``unknown_variables`` entry, naming the variable and the closest
    known one: ``OMATICAYA_SHEDULE is not a setting of omaticaya run and is ignored; did you
    mean OMATICAYA_SCHEDULE?``; a known name in another case is applied, and said so:
    ``OMATICAYA_Memory_Step_MIB is read as OMATICAYA_MEMORY_STEP_MIB (names are not
    case-sensitive); spell it OMATICAYA_MEMORY_STEP_MIB``."""
    lines = []
    for name, close in unknown:
        if close is not None and close.upper() == name.upper():
            lines.append(f"{name} is read as {close} (names are not case-sensitive); spell it "
                         f"{close}")  # fmt: skip
            continue
        lines.append(
            f"{name} is not a setting of {program} and is ignored"
            + (f"; did you mean {close}?" if close else " (docs/commands.md lists every setting)")
        )
    return lines


def deprecated_variable_lines(cls: type[BaseSettings], environ: Mapping[str, str]) -> list[str]:
    """One warning line per former name of a ``Renamed`` setting of ``cls`` set in ``environ``
    (names compared without regard to case, as pydantic-settings reads them), naming the one to
    use: ``OMATICAYA_EXTENDER_SETTLE_S is deprecated: it is read as OMATICAYA_SETTLE_S, the
    setting's one name (for the agent and the extender alike); rename it``. Sorted by name.
    Pure."""
    upper = {k.upper() for k in environ}
    lines = []
    for info in cls.model_fields.values():
        alias = info.validation_alias
        if not isinstance(alias, Renamed):
            continue
        new, *old = alias.names
        for name in old:
            if name.upper() in upper:
                lines.append(f"{name} is deprecated: it is read as {new}, the "
                             "setting's one name (for the agent and the extender alike); "
                             "rename it")  # fmt: skip
    return sorted(lines)

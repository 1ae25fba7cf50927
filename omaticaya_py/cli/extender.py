"""``omaticaya extender``: the kube-scheduler extender, configured from its flags and
``OMATICAYA_EXTENDER_*``, served until SIGTERM."""

from __future__ import annotations

import argparse

from ..core.config.settings import SettingsError
from .errors import print_lines
from .parser import extender_settings_flags

__all__ = ["extender_command"]


def extender_command(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; the exit status of ``scheduler.serve``. Exit 2 with one line
    per bad setting, naming its ``OMATICAYA_EXTENDER_*`` variable (also for a flag's value)."""
    from ..scheduler.server import serve
    from ..scheduler.settings import load_extender_settings

    try:
        settings = load_extender_settings(**extender_settings_flags().overrides(args))
    except SettingsError as err:
        print_lines("omaticaya extender: ", err)
        return 2
    from ..logs import setup_logging

    setup_logging(settings.log_level, settings.log_json)
    from ..core.config.settings import Settings
    from ..scheduler.settings import ExtenderSettings
    from .flags import say_unknown_variables

    say_unknown_variables("omaticaya extender", ExtenderSettings, Settings)  # knows both sets
    # uvicorn handles SIGTERM/SIGINT in the main thread: it stops accepting, finishes the
    # requests in flight and returns
    return serve(settings)

"""``main``: parse the command line and hand it to its sub-command."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .parser import build_parser

__all__ = ["console_main", "main"]

#: modules the ``kubernetes`` package imports when installed that no command uses:
#: ``kubernetes.dynamic`` (imported by ``kubernetes/__init__``) loads ``kubernetes_validate``
#: (jsonschema, referencing, attrs: ~1.8 MiB of the agent's ~61 MiB in a dev venv, where the
#: test extras install it; the image does not)
UNUSED_IMPORTS = ("kubernetes_validate",)


def console_main() -> int:
    """The ``omaticaya`` console script and ``python -m omaticaya_py``: ``main`` in a process of
    its own, with ``UNUSED_IMPORTS`` kept out (``None`` in ``sys.modules``: the importer's
    ``try: import`` sees ImportError, as where the package is absent). ``main`` called in
    another program's process (tests) leaves that process's imports alone."""
    for name in UNUSED_IMPORTS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    return main()


def main(argv: Sequence[str] | None = None, prog: str = "omaticaya") -> int:
    """Entry point of the ``omaticaya`` console script: ``argv`` (default ``sys.argv[1:]``)
    parsed, then run. Returns the exit status (argparse exits 2 itself on unknown flags).
    ``prog``: the program's name in usage lines and argparse's errors (``kubectl
    omaticaya`` for the kubectl plugin)."""
    args = build_parser(prog).parse_args(argv)
    if args.command == "extender":  # a separate service with its own settings
        from .extender import extender_command

        return extender_command(args)
    if args.command == "mps":  # the MPS daemons' supervisor: settings of its own
        from .mps import mps_command

        return mps_command(args)
    if args.command == "check-labels":  # the chart's helm test
        from .checks import check_labels_command

        return check_labels_command(args)
    if args.command in ("record", "top", "stop-daemonset", "delete-resourceslices"):  # no Node
        from . import tools

        run = {
            "record": tools.record_command,  # NVML to a file
            "top": tools.top_command,  # a viewer: list/watch Nodes
            "stop-daemonset": tools.stop_daemonset_command,  # the chart's pre-delete hook
            "delete-resourceslices": tools.delete_resourceslices_command,  # and with DRA, this
        }[args.command]
        return run(args)
    from .agent import agent_command

    return agent_command(args)

"""``main``: parse the command line and hand it to its sub-command."""

from __future__ import annotations

from collections.abc import Sequence

from .parser import build_parser

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``omaticaya`` console script: ``argv`` (default ``sys.argv[1:]``)
    parsed, then run. Returns the exit status (argparse exits 2 itself on unknown flags)."""
    args = build_parser().parse_args(argv)
    if args.command == "extender":  # a separate service with its own settings
        from .extender import extender_command

        return extender_command(args)
    if args.command in ("record", "top", "stop-daemonset"):  # no Node, no settings
        from . import tools

        run = {
            "record": tools.record_command,  # NVML to a file
            "top": tools.top_command,  # a viewer: list/watch Nodes
            "stop-daemonset": tools.stop_daemonset_command,  # the chart's pre-delete hook
        }[args.command]
        return run(args)
    from .agent import agent_command

    return agent_command(args)

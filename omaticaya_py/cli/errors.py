"""How the command line reports bad use: ``UsageError``, and errors printed as prefixed lines."""

from __future__ import annotations

import sys

__all__ = ["UsageError", "print_lines"]


class UsageError(Exception):
    """Bad command-line use; printed as one line, exit status 2."""


def print_lines(prefix: str, error: BaseException | str) -> None:
    """Print ``error`` on stderr, each of its lines after ``prefix`` (``"omaticaya: "``)."""
    for line in str(error).splitlines():
        print(f"{prefix}{line}", file=sys.stderr)

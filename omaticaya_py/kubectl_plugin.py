"""``kubectl-omaticaya``: the kubectl plugin (``kubectl omaticaya top``).

kubectl runs ``kubectl-omaticaya`` from ``PATH`` with the words after ``kubectl omaticaya``;
this hands them to ``omaticaya top``, whose flags follow kubectl's conventions
(``--kubeconfig``, ``--context``, ``-l``, ``-o json|wide``). ``kubectl omaticaya`` alone, or with
flags only, means ``top``. Usage lines and errors name it ``kubectl omaticaya``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["PROG", "main"]

#: the plugin's name as its user types it: usage lines and argparse's errors say it
PROG = "kubectl omaticaya"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kubectl-omaticaya`` console script: ``argv`` (default
    ``sys.argv[1:]``) run as ``omaticaya top``. Returns the exit status (2 for another
    command)."""
    from .cli import main as omaticaya

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        args = ["top", *args]
    if args[0] != "top":
        print(
            f"kubectl omaticaya: unknown command {args[0]!r}: the plugin has one, "
            "'top' (kubectl omaticaya top --help)",
            file=sys.stderr,
        )
        return 2
    return omaticaya(args, prog=PROG)

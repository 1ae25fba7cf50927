"""``omaticaya check-labels``: the chart's ``helm test``."""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["check_labels_command"]


def check_labels_command(args: argparse.Namespace) -> int:
    """``omaticaya check-labels``: did the agent label every Node its DaemonSet runs on
    (``kube.agent_nodes``)? One line per Node on stdout, then the verdict; exit 0 when all are
    labelled, 1 with one line per problem on stderr (or an API failure)."""
    from ..kube import ApiSession, KubeError
    from ..kube.agent_nodes import check_agent_nodes

    prefix = args.prefix or os.environ.get("OMATICAYA_PREFIX") or "omaticaya.io"
    try:
        session = ApiSession(kubeconfig=args.kubeconfig)
        try:
            result = check_agent_nodes(session, args.namespace, args.name, prefix)
        finally:
            session.close()
    except KubeError as exc:
        print(f"omaticaya: {exc}", file=sys.stderr)
        return 1
    for line in result.lines():
        print(line)
    problems = result.problems()
    for problem in problems:
        print(f"omaticaya: {problem}", file=sys.stderr)
    return 1 if problems else 0

"""The flags of the commands the chart's hooks run: ``stop-daemonset`` and
``delete-resourceslices`` (``helm uninstall``), ``check-labels`` (``helm test``). ``parser``
builds the tree and adds them; ``--kubeconfig`` is every API command's."""

from __future__ import annotations

import argparse

__all__ = [
    "KUBECONFIG_HELP",
    "check_labels_flags",
    "delete_resourceslices_flags",
    "kubeconfig_flag",
    "stop_daemonset_flags",
]

KUBECONFIG_HELP = "kubeconfig path (default: in-cluster or $KUBECONFIG)"


def kubeconfig_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help=KUBECONFIG_HELP)


def delete_resourceslices_flags(p: argparse.ArgumentParser) -> None:
    """``omaticaya delete-resourceslices``'s flags."""
    p.add_argument("--driver", default="gpu.omaticaya.io",
                   help="the DRA driver whose slices go (default gpu.omaticaya.io)")  # fmt: skip
    kubeconfig_flag(p)


def stop_daemonset_flags(p: argparse.ArgumentParser) -> None:
    """``omaticaya stop-daemonset``'s flags (the chart's pre-delete hook passes them)."""
    p.add_argument("--namespace", required=True, help="the DaemonSet's namespace")
    p.add_argument("--name", required=True, help="the DaemonSet's name")
    p.add_argument(
        "--timeout-s", dest="timeout_s", type=float, default=120.0,
        help="give up after this many seconds (default 120)",
    )  # fmt: skip
    kubeconfig_flag(p)


def check_labels_flags(p: argparse.ArgumentParser) -> None:
    """``omaticaya check-labels``'s flags (the chart's ``helm test`` passes them)."""
    p.add_argument("--namespace", required=True, help="the agent DaemonSet's namespace")
    p.add_argument("--name", required=True, help="the agent DaemonSet's name")
    p.add_argument("--prefix", help="label key prefix (default $OMATICAYA_PREFIX or omaticaya.io)")
    kubeconfig_flag(p)

"""The tools beside the agent: ``record`` (a trace from NVML), ``top`` (the fleet's GPUs) and
``stop-daemonset`` (the chart's pre-delete hook); none reads settings beyond its flags."""

from __future__ import annotations

import argparse
import sys

from .errors import UsageError

__all__ = ["record_command", "stop_daemonset_command", "top_command"]


def record_command(args: argparse.Namespace) -> int:
    """``omaticaya record``: sample NVML every ``--interval`` for ``--duration`` into the trace
    ``--output``. Exit 0 with one line on stdout; 2 for a bad duration; 1 when NVML cannot be
    read or the file cannot be written."""
    from pathlib import Path

    from ..logs import setup_logging
    from ..sources.record import RecordError, record

    setup_logging(args.log_level)

    try:
        duration_s = _duration_s("--duration", args.duration)
        interval_s = _duration_s("--interval", args.interval)
    except UsageError as exc:
        print(f"omaticaya: {exc}", file=sys.stderr)
        return 2
    output = Path(args.output)
    try:
        doc = record(output, duration_s=duration_s, interval_s=interval_s)
    except RecordError as exc:
        print(f"omaticaya: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"omaticaya: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(
        f"recorded {len(doc['samples'])} samples of {doc.get('device_count', 0)} GPUs "
        f"every {interval_s:g}s to {output}"
    )
    return 0


def _duration_s(flag: str, text: str) -> float:
    """A Go duration (``60s``, ``1m30s``, ``250ms``) in seconds; ``UsageError`` naming ``flag``."""
    from ..core.config.settings import parse_schedule

    try:
        return parse_schedule(f"@every {text}").interval_s or 0.0
    except ValueError:
        raise UsageError(
            f"{flag}: {text!r} is not a duration: expected a Go duration of at least 100ms, "
            "like 60s, 1m30s or 250ms"
        ) from None


def top_command(args: argparse.Namespace) -> int:
    """``omaticaya top`` (and ``kubectl omaticaya top``): list/watch the Nodes and show their
    GPUs; the exit status of ``views.top.run_top``."""
    from ..views.top import run_top, top_options

    return run_top(top_options(vars(args)))


def stop_daemonset_command(args: argparse.Namespace) -> int:
    """``omaticaya stop-daemonset``: one line on stdout (done, exit 0) or stderr (exit 1 on a
    timeout or an API failure; 2 for a ``--timeout-s`` that is not a positive number)."""
    import math

    from ..kube import ApiSession, KubeError, StopWait, stop_daemonset

    if not math.isfinite(args.timeout_s) or args.timeout_s <= 0:
        print(
            f"omaticaya: --timeout-s: {args.timeout_s:g} is not a positive number of seconds",
            file=sys.stderr,
        )
        return 2
    try:
        session = ApiSession(kubeconfig=args.kubeconfig)
        try:
            result = stop_daemonset(session, args.namespace, args.name, StopWait(args.timeout_s))
        finally:
            session.close()
    except KubeError as exc:
        print(f"omaticaya: {exc}", file=sys.stderr)
        return 1
    if not result.stopped:
        print(f"omaticaya: {result.line()}", file=sys.stderr)
        return 1
    print(result.line())
    return 0


def delete_resourceslices_command(args: argparse.Namespace) -> int:
    """``omaticaya delete-resourceslices``: delete every ResourceSlice of a DRA driver (the
    chart's uninstall hook); one line on stdout (done or not served, exit 0) or stderr (some
    left, or an API failure: exit 1)."""
    from ..kube import ApiSession, KubeError
    from ..kube.resourceslice import delete_driver_slices

    try:
        session = ApiSession(kubeconfig=args.kubeconfig)
        try:
            result = delete_driver_slices(session, args.driver)
        finally:
            session.close()
    except KubeError as exc:
        print(f"omaticaya: deleting the ResourceSlices of {args.driver}: {exc}", file=sys.stderr)
        return 1
    if result.left:
        print(f"omaticaya: {result.line()}", file=sys.stderr)
        return 1
    print(result.line())
    return 0

"""The agent's sub-commands: settings from flags and environment, then ``once``, ``show`` and
``cleanup`` here, ``run`` and ``device-plugin`` in ``daemon``; bad input exits 2, an API
failure 1."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..core.config.settings import Settings, SettingsError, load_settings
from ..core.schema import TELEMETRY, parse_gpu_readings
from .errors import UsageError, print_lines
from .flags import say_unknown_variables
from .inputs import node_client, reader
from .parser import AGENT_SETTINGS_FLAGS

__all__ = ["agent_command", "cleanup_text", "show_text"]


def agent_command(args: argparse.Namespace) -> int:
    """``omaticaya run|once|show|cleanup|device-plugin``. Returns the exit status: 2 with one
    line per problem for bad settings, flags or a bad trace; 1 for an API failure."""
    from ..kube import KubeError
    from ..logs import setup_logging
    from ..sources.replay import TraceError

    flags = AGENT_SETTINGS_FLAGS[args.command]
    try:
        settings = load_settings(flags.flag_names(args), **flags.overrides(args))
        setup_logging(settings.log_level, settings.log_json)
        say_unknown_variables(
            f"omaticaya {args.command}", Settings, others=("OMATICAYA_EXTENDER_",)
        )
        return _dispatch(args, settings)
    except (SettingsError, TraceError, UsageError) as exc:
        print_lines("omaticaya: ", exc)
        return 2
    except KubeError as exc:
        print(f"omaticaya: {exc}", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    from ..agent import Agent, NodeApi
    from .daemon import run_daemon

    if args.command == "show":
        agent = Agent(settings, reader(settings, args), NodeApi(None, dry_run=True))
        print(show_text(agent.evaluate(), args.json))
        return 0
    if args.command == "cleanup":
        return _cleanup(args, settings)
    if args.command == "once":
        return _once(args, settings)
    if args.command == "device-plugin":  # the plugin alone: read and serve, label no Node
        return run_daemon(
            args, settings.model_copy(update={"device_plugin": True}), label_node=False
        )
    return run_daemon(args, settings)


def _cleanup(args: argparse.Namespace, settings: Settings) -> int:
    """Remove every key under the prefix from the Node, and the agent's Lease, whoever holds
    it, where the agent's namespace is known (``POD_NAMESPACE``); with ``--dry-run``, read the
    Node and the Lease (GET only) and print what would go. Raises ``KubeError``."""
    import os

    from ..agent.heartbeat import make_lease
    from ..agent.node_writer import remove_keys

    node = node_client(settings, args)
    patch, _ = remove_keys(node, settings.prefix, keep_static=False, dry_run=args.dry_run)
    lease = make_lease(settings, node, os.environ, settings.heartbeat_s, dry_run=False)
    if args.dry_run:
        there = lease.ref if lease is not None and lease.get() is not None else None
        print(cleanup_text(settings.node_name or "", settings.prefix, patch, there, dry_run=True))
        return 0
    deleted = lease.ref if lease is not None and lease.delete() else None
    print(cleanup_text(settings.node_name or "", settings.prefix, patch, deleted, dry_run=False))
    return 0


def cleanup_text(
    node: str, prefix: str, patch: dict[str, Any] | None, lease: str | None, *, dry_run: bool
) -> str:
    """What ``omaticaya cleanup`` says. ``patch``: the removal merge patch
    (``core.publish.patch.removal_patch``: ``{"metadata": {"labels"|"annotations": {key: None}}}``,
    ``None`` when nothing is under the prefix); ``lease``: ``namespace/name`` of the agent's
    Lease deleted (or, in a dry run, there to delete), ``None`` for none. Done: one line, the
    count of keys removed. ``dry_run``: a line saying nothing was changed, then one line per
    key (``label KEY`` / ``annotation KEY``, sorted) and one for the Lease."""
    meta = (patch or {}).get("metadata", {})
    keys = [
        (kind[:-1], key) for kind in ("labels", "annotations") for key in sorted(meta.get(kind, {}))
    ]
    if not dry_run:
        return (f"removed {len(keys)} keys under {prefix}/ from Node {node}"
                + (f" and Lease {lease}" if lease else ""))  # fmt: skip
    lines = [
        f"dry run, nothing changed: would remove {len(keys)} keys under {prefix}/ from Node "
        f"{node}" + (f" and delete Lease {lease}" if lease else "")
    ]
    lines += [f"  {kind} {key}" for kind, key in keys]
    if lease:
        lines.append(f"  lease {lease}")
    return "\n".join(lines)


def _once(args: argparse.Namespace, settings: Settings) -> int:
    """One tick; with ``--dry-run``, print the patch (diffing against an empty Node when there
    is no API server) instead of sending it."""
    from loguru import logger

    from ..agent import Agent, NodeApi
    from ..kube import KubeError

    node = None
    if settings.node_name or not args.dry_run:
        try:
            node = node_client(settings, args)
        except KubeError as exc:
            if not args.dry_run:
                raise
            logger.warning("no API server ({}): diffing against an empty Node", exc)
    agent = Agent(settings, reader(settings, args), NodeApi(node, dry_run=args.dry_run))
    try:
        result = agent.tick()
    except KubeError:
        if not args.dry_run:
            raise
        agent.node = None
        result = agent.tick()
    if args.dry_run:
        print(json.dumps(result.patch, indent=2, sort_keys=True) if result.patch else "no change")
    else:
        changed = len((result.patch or {}).get("metadata", {}).get("labels", {}))
        print(
            f"Node {settings.node_name}: health {result.health.state}, "
            + (f"{changed} labels changed" if result.sent else "no change")
        )
    return 0


def show_text(result: Any, as_json: bool) -> str:
    """``omaticaya show``'s output for ``Agent.evaluate()``'s (snapshot, health, desired):
    a table of the GPUs and the labels, or with ``as_json`` the labels and annotations."""
    snap, health, desired = result
    if as_json:
        return json.dumps(
            {"labels": desired.labels, "annotations": desired.annotations}, indent=2, sort_keys=True
        )
    lines = [
        f"source {snap.source}  read_at {snap.read_at.isoformat(timespec='seconds')}  "
        f"driver {snap.driver_version or '-'}  health {health.state}"
        + (f"  error {snap.error}" if snap.error else ""),
        "",
        f"{'GPU':>3}  {'PRODUCT':<24} {'FREE MiB':>9} {'TOTAL MiB':>9} {'UTIL %':>6} "
        f"{'TEMP C':>6} {'POWER W':>7}  HEALTH",
    ]
    # who holds each GPU: the telemetry's pods (when the agent could ask the kubelet)
    held = {
        r.index: ",".join(f"{p.namespace}/{p.pod}" for p in r.pods or ())
        + (f" +{r.memory_out_of_band_mib}MiB out-of-band" if r.memory_out_of_band_mib else "")
        for key in desired.annotations
        if key.endswith("/" + TELEMETRY)
        for r in parse_gpu_readings(desired.annotations, key.rpartition("/")[0])
    }

    def cell(v: Any, fmt: str = "{}") -> str:
        return "-" if v is None else fmt.format(v)

    for g in snap.gpus:
        gh = health.gpus[g.index]
        state = str(gh.state) + (f" ({','.join(gh.reasons)})" if gh.reasons else "")
        lines.append(
            f"{g.index:>3}  {(g.product or '-')[:24]:<24} {cell(g.memory_free_mib):>9} "
            f"{cell(g.memory_total_mib):>9} {cell(g.utilization_pct, '{:.0f}'):>6} "
            f"{cell(g.temperature_c):>6} {cell(g.power_w, '{:.0f}'):>7}  {state}"
            + (f"  pods {held[g.index]}" if held.get(g.index) else "")
        )
    lines += ["", "LABELS"]
    lines += [f"  {k}={v}" for k, v in sorted(desired.labels.items())]
    return "\n".join(lines)

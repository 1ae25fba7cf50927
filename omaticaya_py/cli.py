"""The ``omaticaya`` command: ``run``, ``once``, ``show``, ``cleanup``, ``extender``,
``device-plugin``, ``record``, ``top``, ``stop-daemonset``.

Flags override the environment (``OMATICAYA_*``, ``NODE_NAME``) and ``.env``. Bad input ends
with exit status 2 and one line per problem, never a traceback; an API failure in ``once`` or
``cleanup`` ends with status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from .core.settings import Settings, SettingsError, load_settings

__all__ = ["main", "build_parser"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", dest="node_name", help="Node to label (default: $NODE_NAME)")
    p.add_argument("--trace", type=str, help="replay this NVML trace instead of reading NVML")
    p.add_argument("--schedule", help="crontab, 6-field cron or '@every 10s'")
    p.add_argument("--prefix", help="label key prefix (default omaticaya.io)")
    p.add_argument("--memory-step-mib", type=str, help="memory labels round down to this")
    p.add_argument("--utilization-step-pct", type=str, help="utilisation labels round to this")
    p.add_argument(
        "--per-gpu-labels", action=argparse.BooleanOptionalAction, default=None,
        help="publish gpu-N.* labels",
    )
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster or $KUBECONFIG)")
    p.add_argument("--log-level", help="TRACE, DEBUG, INFO, WARNING, ERROR")
    p.add_argument(
        "--log-json", action=argparse.BooleanOptionalAction, default=None, help="JSON log lines"
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (sub-commands and their flags)."""
    parser = argparse.ArgumentParser(
        prog="omaticaya",
        description="Publish live NVIDIA GPU state (NVML) as Kubernetes Node labels.",
    )
    parser.add_argument("--version", action="version", version=f"omaticaya {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="the agent: tick on the schedule until SIGTERM")
    _common(run)
    run.add_argument(
        "--cleanup-on-exit", action=argparse.BooleanOptionalAction, default=None,
        help="remove dynamic labels on SIGTERM (default on)",
    )
    run.add_argument("--metrics-port", type=str, help="port of /metrics /healthz /readyz; 0: off")
    run.add_argument("--trace-speed", type=float, default=1.0, help="replay speed factor")

    once = sub.add_parser("once", help="one tick, then exit")
    _common(once)
    once.add_argument("--trace-at", type=float, help="trace time in seconds to read")
    once.add_argument("--dry-run", action="store_true", help="print the patch, do not send it")

    show = sub.add_parser("show", help="print the snapshot and labels (no API call)")
    _common(show)
    show.add_argument("--trace-at", type=float, help="trace time in seconds to read")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")

    cleanup = sub.add_parser("cleanup", help="remove every key under the prefix from the Node")
    _common(cleanup)

    _extender_parser(sub)
    _device_plugin_parser(sub)  # defined here: the plugin module loads grpc, only when it runs
    _record_parser(sub)
    _top_parser(sub)
    _stop_daemonset_parser(sub)
    return parser


def _extender_parser(sub: Any) -> None:
    """Add ``omaticaya extender`` to the CLI's sub-parsers."""
    p = sub.add_parser(
        "extender", help="kube-scheduler extender: filter/prioritize pods by live GPU state"
    )
    p.set_defaults(command="extender")
    p.add_argument("--address", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=str, help="port to listen on (default 8888)")
    p.add_argument("--strategy", help="binpack (default) or spread")
    p.add_argument("--ttl-s", dest="ttl_s", type=str, help="telemetry TTL in seconds (default 300)")
    p.add_argument(
        "--grace-s", dest="grace_s", type=str, help="grace on top of the TTL (default 60)"
    )
    p.add_argument(
        "--fail-open",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let nodes with unknown or stale GPU state pass (default: fail closed)",
    )
    p.add_argument("--prefix", help="label key prefix (default omaticaya.io)")
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster or $KUBECONFIG)")
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR")
    p.add_argument(
        "--log-json", action=argparse.BooleanOptionalAction, default=None, help="JSON log lines"
    )

def _extender(args: argparse.Namespace) -> int:
    """``omaticaya extender``: serve until SIGTERM/SIGINT. Exit 2 with one line per bad setting."""
    from .scheduler.server import serve
    from .scheduler.settings import ExtenderSettings, load_extender_settings

    fields = set(ExtenderSettings.model_fields)
    overrides = {k: v for k, v in vars(args).items() if k in fields}
    try:
        settings = load_extender_settings(**overrides)
    except SettingsError as err:
        print(f"omaticaya extender: {err}".replace("\n", "\nomaticaya extender: "), file=sys.stderr)
        return 2
    from .logs import setup_logging

    setup_logging(settings.log_level, settings.log_json)
    # uvicorn handles SIGTERM/SIGINT in the main thread: it stops accepting, finishes the
    # requests in flight and returns
    return serve(settings)


def _record_parser(sub: Any) -> None:
    """Add ``omaticaya record`` to the CLI's sub-parsers."""
    rec = sub.add_parser(
        "record", help="write a trace of this node's GPUs from NVML (replay it with --trace)"
    )
    rec.add_argument("--duration", default="60s", help="how long to record (Go duration: 60s, 2m)")
    rec.add_argument("--interval", default="250ms", help="time between samples (at least 100ms)")
    rec.add_argument("-o", "--output", required=True, help="trace file to write (JSON)")
    rec.add_argument("--log-level", help="TRACE, DEBUG, INFO, WARNING, ERROR")


def _top_parser(sub: Any) -> None:
    """Add ``omaticaya top`` to the CLI's sub-parsers (also ``kubectl omaticaya top``)."""
    p = sub.add_parser(
        "top", help="the fleet's GPUs: a table of every node's live GPU state (list/watch nodes)"
    )
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster or $KUBECONFIG)")
    p.add_argument("--context", help="kubeconfig context to use")
    p.add_argument("-l", "--selector", help="label selector of the nodes (kubectl's -l)")
    p.add_argument(
        "-o", "--output", choices=("table", "wide", "json"), default="table",
        help="table (default), wide (more columns) or json",
    )
    p.add_argument(
        "--sort", choices=("name", "free", "util", "age"), default="name",
        help="name; free: most free memory first; util: busiest first; age: oldest first",
    )
    p.add_argument("--gpus", action="store_true", help="one row per GPU")
    p.add_argument("--unhealthy", action="store_true", help="only nodes not all healthy")
    p.add_argument("--stale", action="store_true", help="only nodes whose reading is stale")
    p.add_argument(
        "-A", "--all", dest="all_nodes", action="store_true",
        help="also nodes without Omaticaya data",
    )
    p.add_argument("-w", "--watch", action="store_true", help="redraw on every change")
    p.add_argument(
        "--interval", dest="interval_s", type=float, default=10.0,
        help="with --watch: redraw at least this often, seconds (default 10)",
    )
    p.add_argument("--prefix", help="label key prefix (default $OMATICAYA_PREFIX or omaticaya.io)")


def _stop_daemonset_parser(sub: Any) -> None:
    """Add ``omaticaya stop-daemonset`` to the CLI's sub-parsers (the chart's pre-delete hook)."""
    p = sub.add_parser(
        "stop-daemonset",
        help="delete a DaemonSet (foreground) and wait until its pods are gone",
        description="Delete the DaemonSet with propagationPolicy Foreground and wait until "
        "every pod it owns is gone, so that each agent's SIGTERM cleanup runs while the "
        "release's RBAC still exists. Exit 0 when they are gone (or the DaemonSet is not "
        "there), 1 on a timeout or an API failure, with one line.",
    )
    p.add_argument("--namespace", required=True, help="the DaemonSet's namespace")
    p.add_argument("--name", required=True, help="the DaemonSet's name")
    p.add_argument(
        "--timeout-s", dest="timeout_s", type=float, default=120.0,
        help="give up after this many seconds (default 120)",
    )
    p.add_argument("--kubeconfig", help="kubeconfig path (default: in-cluster or $KUBECONFIG)")


def _stop_daemonset(args: argparse.Namespace) -> int:
    """``omaticaya stop-daemonset``: one line on stdout (done) or stderr (timeout, failure)."""
    import math

    from .kube import ApiSession, KubeError, stop_daemonset

    if not math.isfinite(args.timeout_s) or args.timeout_s <= 0:
        print(
            f"omaticaya: --timeout-s: {args.timeout_s:g} is not a positive number of seconds",
            file=sys.stderr,
        )
        return 2
    try:
        session = ApiSession(kubeconfig=args.kubeconfig)
        try:
            result = stop_daemonset(session, args.namespace, args.name, timeout_s=args.timeout_s)
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


def _duration_s(flag: str, text: str) -> float:
    """A Go duration (``60s``, ``1m30s``, ``250ms``) in seconds; ``UsageError`` naming ``flag``."""
    from .core.settings import parse_schedule

    try:
        return parse_schedule(f"@every {text}").interval_s or 0.0
    except ValueError:
        raise UsageError(
            f"{flag}: {text!r} is not a duration: expected a Go duration of at least 100ms, "
            "like 60s, 1m30s or 250ms"
        ) from None


def _record(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .sources.record import RecordError, record

    duration_s = _duration_s("--duration", args.duration)
    interval_s = _duration_s("--interval", args.interval)
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


def _device_plugin_parser(sub: Any) -> None:
    """Add ``omaticaya device-plugin`` to the CLI's sub-parsers."""
    p = sub.add_parser(
        "device-plugin",
        help="serve the GPUs to the kubelet as a device plugin (no Node labels)",
        description="Read the GPUs on the schedule and serve them to the kubelet as the "
        "extended resource OMATICAYA_DEVICE_PLUGIN_RESOURCE, with live health.",
    )
    p.add_argument("--trace", type=str, help="replay this NVML trace instead of reading NVML")
    p.add_argument("--trace-speed", type=float, default=1.0, help="replay speed factor")
    p.add_argument("--schedule", help="crontab, 6-field cron or '@every 10s'")
    p.add_argument(
        "--resource", dest="device_plugin_resource", help="extended resource (nvidia.com/gpu)"
    )
    p.add_argument(
        "--plugin-dir",
        dest="device_plugin_dir",
        help="the kubelet's device-plugins folder (/var/lib/kubelet/device-plugins)",
    )
    p.add_argument("--metrics-port", type=str, help="port of /metrics /healthz /readyz; 0: off")
    p.add_argument("--log-level", help="TRACE, DEBUG, INFO, WARNING, ERROR")
    p.add_argument(
        "--log-json", action=argparse.BooleanOptionalAction, default=None, help="JSON log lines"
    )


def _settings(args: argparse.Namespace, flags: dict[str, str]) -> Settings:
    fields = set(Settings.model_fields)
    overrides = {k: v for k, v in vars(args).items() if k in fields}
    return load_settings(flags, **overrides)


def _flag_names(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """Setting name -> the flag that sets it in ``command`` (for error messages)."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps sub-parsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            sub = action.choices[command]
            return {a.dest: a.option_strings[0] for a in sub._actions if a.option_strings}  # noqa: SLF001
    return {}


class UsageError(Exception):
    """Bad command-line use; printed as one line, exit status 2."""


def _reader(settings: Settings, args: argparse.Namespace) -> Any:
    at_s = getattr(args, "trace_at", None)
    if settings.trace is not None:
        from .sources.replay import TraceReader

        return TraceReader(
            settings.trace,
            at_s=at_s,
            window_s=settings.schedule.period_s(),
            speed=getattr(args, "trace_speed", 1.0),
        )
    if at_s is not None:
        raise UsageError("--trace-at needs --trace or OMATICAYA_TRACE")
    from .sources.nvml import NvmlReader

    return NvmlReader(watch_xid=args.command in ("run", "device-plugin"))


def _node(settings: Settings, args: argparse.Namespace) -> Any:
    if not settings.node_name:
        raise UsageError(
            "NODE_NAME is not set: expected the Node name (the downward API's spec.nodeName) "
            "or --node NAME"
        )
    from .kube import NodeClient

    return NodeClient(
        settings.node_name, kubeconfig=args.kubeconfig, timeout_s=settings.kube_timeout_s
    )


def _show(result: Any, as_json: bool) -> str:
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

    def cell(v: Any, fmt: str = "{}") -> str:
        return "-" if v is None else fmt.format(v)

    for g in snap.gpus:
        gh = health.gpus[g.index]
        state = str(gh.state) + (f" ({','.join(gh.reasons)})" if gh.reasons else "")
        lines.append(
            f"{g.index:>3}  {(g.product or '-')[:24]:<24} {cell(g.memory_free_mib):>9} "
            f"{cell(g.memory_total_mib):>9} {cell(g.utilization_pct, '{:.0f}'):>6} "
            f"{cell(g.temperature_c):>6} {cell(g.power_w, '{:.0f}'):>7}  {state}"
        )
    lines += ["", "LABELS"]
    lines += [f"  {k}={v}" for k, v in sorted(desired.labels.items())]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``omaticaya`` console script. Returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "extender":  # a separate service with its own settings
        return _extender(args)
    if args.command == "record":  # NVML to a file: no Node, no settings beyond the flags
        try:
            return _record(args)
        except UsageError as exc:
            print(f"omaticaya: {exc}", file=sys.stderr)
            return 2
    if args.command == "stop-daemonset":  # the chart's pre-delete hook: no Node, no settings
        return _stop_daemonset(args)
    if args.command == "top":  # a viewer: list/watch Nodes, no settings beyond the flags
        from .views.top import run_top, top_options

        return run_top(top_options(vars(args)))
    from .kube import KubeError
    from .logs import setup_logging
    from .sources.replay import TraceError

    try:
        settings = _settings(args, _flag_names(parser, args.command))
        setup_logging(settings.log_level, settings.log_json)
        return _dispatch(args, settings)
    except (SettingsError, TraceError, UsageError) as exc:
        for line in str(exc).splitlines():
            print(f"omaticaya: {line}", file=sys.stderr)
        return 2
    except KubeError as exc:
        print(f"omaticaya: {exc}", file=sys.stderr)
        return 1


def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    from .agent import Agent

    if args.command == "show":
        agent = Agent(settings, _reader(settings, args), None, dry_run=True)
        print(_show(agent.evaluate(), args.json))
        return 0
    if args.command == "cleanup":
        agent = Agent(settings, _NoReader(), _node(settings, args))
        patch = agent.cleanup(keep_static=False)
        removed = sum(len(v) for v in (patch or {}).get("metadata", {}).values())
        print(f"removed {removed} keys under {settings.prefix}/ from Node {settings.node_name}")
        return 0
    if args.command == "once":
        return _once(args, settings)
    if args.command == "device-plugin":  # the plugin alone: read and serve, label no Node
        return _run(args, settings.model_copy(update={"device_plugin": True}), label_node=False)
    return _run(args, settings)


def _once(args: argparse.Namespace, settings: Settings) -> int:
    from loguru import logger

    from .agent import Agent
    from .kube import KubeError

    node = None
    if settings.node_name or not args.dry_run:
        try:
            node = _node(settings, args)
        except KubeError as exc:
            if not args.dry_run:
                raise
            logger.warning("no API server ({}): diffing against an empty Node", exc)
    agent = Agent(settings, _reader(settings, args), node, dry_run=args.dry_run)
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


def _run(args: argparse.Namespace, settings: Settings, *, label_node: bool = True) -> int:
    """The daemon: ``run`` (label the Node, and serve the device plugin when
    ``settings.device_plugin``), or ``device-plugin`` (``label_node=False``: no API server)."""
    from loguru import logger

    from .agent import Agent

    reader = _reader(settings, args)
    if settings.fail_on_init_error:
        first = reader.read()
        if first.error is not None:
            logger.error("NVML failed to start ({}) and fail_on_init_error is set", first.error)
            return 1
    if label_node:
        agent = Agent(settings, reader, _node(settings, args))
    else:
        agent = Agent(settings, reader, None, dry_run=True)
    agent.install_signal_handlers()  # before any server starts: a SIGTERM must find them
    server = None
    if settings.metrics_port:
        from .agent.metrics import serve

        try:
            server = serve(agent, settings.metrics_address, settings.metrics_port)
        except OSError as exc:  # port in use, address not on this host, no IPv6
            reader.close()
            where = f"{settings.metrics_address}:{settings.metrics_port}"
            if ":" in settings.metrics_address:
                where = f"[{settings.metrics_address}]:{settings.metrics_port}"
            raise UsageError(
                f"cannot serve /metrics on {where}: {exc.strerror or exc}; set another "
                "--metrics-port / OMATICAYA_METRICS_PORT (0: off) or OMATICAYA_METRICS_ADDRESS"
            ) from None
    plugin = None
    if settings.device_plugin and not agent.stopping:
        from .deviceplugin import DevicePluginSet

        plugin = DevicePluginSet.from_settings(agent, settings)
        plugin.start()
    try:
        agent.run()
    finally:
        if plugin is not None:
            plugin.stop()
        if server is not None:
            server.shutdown()
    return 0


class _NoReader:
    """Reader for ``cleanup``, which reads no GPU."""

    def read(self) -> Any:  # pragma: no cover - never called
        raise RuntimeError("cleanup reads no GPU")

    def close(self) -> None:
        pass

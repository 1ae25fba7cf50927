"""The argparse tree of ``omaticaya``: the sub-commands and the flags of each.

The agent's sub-commands (``run``, ``once``, ``show``, ``cleanup``, ``device-plugin``) and the
``extender`` have a flag for each setting they use, generated from the settings class
(``flags.SettingsFlags``); the other flags are written out here. A sub-command's flags are added
when it is parsed (or its help shown), so that building the tree imports nothing that only one
sub-command needs (the extender's settings load the scheduler: Starlette, uvicorn; the agent's
load pydantic and pydantic-settings, which ``top``, ``record`` and ``stop-daemonset`` do without).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from .hook_flags import (
    check_labels_flags,
    delete_resourceslices_flags,
    kubeconfig_flag,
    stop_daemonset_flags,
)

if TYPE_CHECKING:
    from .flags import SettingsFlags

# and AGENT_SETTINGS_FLAGS, built on first use (see ``__getattr__``)
__all__ = ["build_parser", "extender_settings_flags", "mps_settings_flags"]

#: settings only the daemon (``run``) uses: ``once``, ``show`` and ``cleanup`` have no flag
_DAEMON_ONLY = frozenset({
    "cleanup_on_exit", "metrics_port", "metrics_address", "fail_on_init_error",
    "shutdown_timeout_s", "device_plugin", "device_plugin_resource", "device_plugin_dir",
})  # fmt: skip
#: the settings ``device-plugin`` uses (reading, health, /metrics, the plugin): it labels no
#: Node, so it has no flag for the others
_DEVICE_PLUGIN_USES = frozenset({
    "log_json", "log_level", "schedule", "trace", "xid_ignore", "xid_all_fatal", "xid_quiet_s",
    "jitter_s", "metrics_port", "metrics_address", "fail_on_init_error",
    "device_plugin_resource", "device_plugin_dir", "device_list_strategy",
    "shared_gpus", "share_unit_mib", "shared_resource", "placement_policy", "settle_s",
})  # fmt: skip
#: the settings ``cleanup`` uses: the Node, its prefix, the API and logging (it reads no GPU)
_CLEANUP_USES = frozenset({"prefix", "log_json", "log_level", "node_name", "kube_timeout_s"})
_NODE_FLAG = {"node_name": "--node"}
#: the former flags of settings now one for the agent and the extender (issue 49), kept as
#: deprecated aliases: the policy's (``OMATICAYA_PLACEMENT_POLICY``) and the settle time's
#: (``OMATICAYA_SETTLE_S``)
_AGENT_OLD_FLAGS = {"placement_policy": ("--share-policy",), "settle_s": ("--share-settle-s",)}
_EXTENDER_OLD_FLAGS = {"placement_policy": ("--strategy",)}


@cache
def _agent_settings_flags() -> dict[str, SettingsFlags]:
    """Sub-command -> its flags for ``Settings`` (the agent's settings), built on first use."""
    from ..core.config.settings import Settings
    from .flags import SettingsFlags

    old = _AGENT_OLD_FLAGS
    return {
        "run": SettingsFlags(Settings, names=_NODE_FLAG, old=old),
        "once": SettingsFlags(Settings, _DAEMON_ONLY, _NODE_FLAG, old),
        "show": SettingsFlags(Settings, _DAEMON_ONLY, _NODE_FLAG, old),
        "cleanup": SettingsFlags(
            Settings, frozenset(Settings.model_fields) - _CLEANUP_USES, _NODE_FLAG
        ),
        "device-plugin": SettingsFlags(
            Settings,
            frozenset(Settings.model_fields) - _DEVICE_PLUGIN_USES,
            {
                "device_plugin_resource": "--resource",
                "device_plugin_dir": "--plugin-dir",
            },
            old,
        ),
    }


def __getattr__(name: str) -> dict[str, SettingsFlags]:
    """``AGENT_SETTINGS_FLAGS`` (sub-command -> its ``SettingsFlags``), built when first asked
    for, so that importing the parser loads no pydantic (PEP 562)."""
    if name == "AGENT_SETTINGS_FLAGS":
        return _agent_settings_flags()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: adds a sub-command's flags to its parser
_AddFlags = Callable[[argparse.ArgumentParser], None]


#: the settings ``omaticaya mps`` uses (``mps.settings.MpsSettings``): a flag for each
_MPS_USES = frozenset({
    "log_json", "log_level", "shared_gpus", "share_unit_mib", "share_enforcement", "mps_root",
    "mps_state_dir", "mps_control", "mps_check_s", "mps_start_timeout_s", "mps_shm_mib", "mps_host_root",
    "mps_metrics_port", "metrics_address", "trace",
})  # fmt: skip


def mps_settings_flags() -> SettingsFlags:
    """``omaticaya mps``'s flags: one for each setting it uses (``_MPS_USES``) of
    ``MpsSettings`` (imports the ``mps`` package)."""
    from ..mps.settings import MpsSettings
    from .flags import SettingsFlags

    return SettingsFlags(MpsSettings, frozenset(MpsSettings.model_fields) - _MPS_USES)


def extender_settings_flags() -> SettingsFlags:
    """The ``extender``'s flags: one for each field of ``ExtenderSettings`` (imports the
    scheduler package)."""
    from ..scheduler.settings import ExtenderSettings
    from .flags import SettingsFlags

    return SettingsFlags(ExtenderSettings, old=_EXTENDER_OLD_FLAGS)


class _SubParser(argparse.ArgumentParser):
    """A sub-command's parser that adds its flags (``add_flags(parser)``) on first use."""

    def __init__(
        self,
        *args: Any,
        add_flags: _AddFlags | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._add_flags = add_flags

    def _with_flags(self) -> None:
        add, self._add_flags = self._add_flags, None
        if add is not None:
            add(self)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._with_flags()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._with_flags()
        return super().format_usage()

    def format_help(self) -> str:
        self._with_flags()
        return super().format_help()


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's ``ArgumentDefaultsHelpFormatter``, less the defaults that say nothing: a
    flag whose default is ``None`` (a settings flag: its help names the variable and the
    default already) or ``False`` (a switch), or whose help names its default itself."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


class _Version(argparse.Action):
    """``--version``: argparse's own, with the version read only when asked for (it reads the
    installed package's metadata: ``importlib.metadata``)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from .. import __version__

        print(f"omaticaya {__version__}")  # stdout, as argparse's "version" action prints
        parser.exit()


def build_parser(prog: str = "omaticaya") -> argparse.ArgumentParser:
    """The argument parser (sub-commands and their flags). ``parse_args`` gives a ``Namespace``
    with ``command`` (the sub-command's name) and one attribute per flag of it. ``prog``: the
    name usage lines and errors give the program (``kubectl omaticaya`` for the plugin)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Publish live NVIDIA GPU state (NVML) as Kubernetes Node labels.",
        formatter_class=_HelpFormatter,
    )
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="show program's version number and exit"
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_SubParser
    )

    for command in COMMANDS:
        sub.add_parser(command.name, formatter_class=_HelpFormatter, help=command.help,
                       description=command.description, add_flags=command.add_flags)  # fmt: skip
    return parser


# -- the agent's sub-commands: their settings flags, then the rest ------------------------


def _agent_flags(command: str, *more: _AddFlags) -> _AddFlags:
    """Adds the settings flags of the agent's sub-command ``command``, then ``more``."""

    def add(p: argparse.ArgumentParser) -> None:
        _agent_settings_flags()[command].add_to(p)
        for add_more in more:
            add_more(p)

    return add


def _trace_speed(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace-speed", type=float, default=1.0, help="replay speed factor")


def _trace_at(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace-at", type=float, help="trace time in seconds to read")


def _dry_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="print the patch, do not send it")


def _cleanup_dry_run(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dry-run", action="store_true",
        help="print the keys and the Lease it would remove (reads only), change nothing",
    )  # fmt: skip


def _json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


# -- the tools: no settings, only flags ----------------------------------------------------


def _record_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", default="60s", help="how long to record (Go duration: 60s, 2m)")
    p.add_argument("--interval", default="250ms", help="time between samples (at least 100ms)")
    p.add_argument("-o", "--output", required=True, help="trace file to write (JSON)")
    p.add_argument(
        "--log-level", default="INFO", type=str.upper,
        choices=("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"),
        help="the lowest level of the log lines written to stderr",
    )  # fmt: skip


def _top_flags(p: argparse.ArgumentParser) -> None:
    """``omaticaya top``'s flags, also ``kubectl omaticaya top``'s: kubectl's conventions."""
    kubeconfig_flag(p)
    p.add_argument("--context", help="kubeconfig context to use")
    p.add_argument("-l", "--selector", help="label selector of the nodes (kubectl's -l)")
    p.add_argument(
        "-o", "--output", choices=("table", "wide", "json"), default="table",
        help="table (default), wide (more columns) or json",
    )  # fmt: skip
    p.add_argument(
        "--sort", choices=("name", "free", "util", "age"), default="name",
        help="name; free: most free memory first; util: busiest first; age: oldest first",
    )  # fmt: skip
    p.add_argument("--gpus", action="store_true", help="one row per GPU")
    p.add_argument("--unhealthy", action="store_true", help="only nodes not all healthy")
    p.add_argument("--stale", action="store_true", help="only nodes whose reading is stale")
    p.add_argument(
        "-A", "--all", dest="all_nodes", action="store_true",
        help="also nodes without Omaticaya data",
    )  # fmt: skip
    p.add_argument("-w", "--watch", action="store_true", help="redraw on every change")
    p.add_argument(
        "--interval", dest="interval_s", type=float, default=10.0,
        help="with --watch: redraw at least this often, seconds (default 10)",
    )  # fmt: skip
    p.add_argument("--prefix", help="label key prefix (default $OMATICAYA_PREFIX or omaticaya.io)")


@dataclass(frozen=True)
class _Command:
    """A sub-command: its ``name``, one-line ``help``, ``description`` and the function that
    adds its flags to its parser (on first use: ``_SubParser``)."""

    name: str
    help: str
    description: str
    add_flags: _AddFlags


#: the sub-commands, in the order ``--help`` lists them
COMMANDS: tuple[_Command, ...] = (
    _Command(
        "run",
        help="the agent: tick on the schedule until SIGTERM",
        description="The node agent: read the GPUs (NVML, or --trace) on the schedule and "
        "patch this Node's labels and telemetry annotation (NODE_NAME or --node) when a value "
        "changes, until SIGTERM/SIGINT, then remove its live labels. Every setting is a flag "
        "here and an OMATICAYA_* variable; flags win.",
        add_flags=_agent_flags("run", kubeconfig_flag, _trace_speed),
    ),
    _Command(
        "once",
        help="one tick, then exit",
        description="One tick of the agent: read the GPUs, patch the Node (NODE_NAME or "
        "--node) if a label changed, print one line and exit; --dry-run prints the merge "
        "patch instead of sending it.",
        add_flags=_agent_flags("once", kubeconfig_flag, _trace_at, _dry_run),
    ),
    _Command(
        "show",
        help="print the snapshot and labels (no API call)",
        description="Read the GPUs once (NVML, or --trace) and print them and the labels the "
        "agent would publish, as a table (--json: the labels and annotations). No API call.",
        add_flags=_agent_flags("show", kubeconfig_flag, _trace_at, _json),
    ),
    _Command(
        "cleanup",
        help="remove every key under the prefix from the Node",
        description="Remove every label and annotation under the prefix from the Node "
        "(NODE_NAME or --node), hardware facts too, and delete the agent's Lease where its "
        "namespace is known (POD_NAMESPACE). --dry-run reads them and prints what would go. "
        "Run it where the agent no longer runs: a running agent writes its keys back.",
        add_flags=_agent_flags("cleanup", kubeconfig_flag, _cleanup_dry_run),
    ),
    _Command(
        "extender",
        help="kube-scheduler extender: filter/prioritize pods by live GPU state",
        description="The kube-scheduler extender: an HTTP server answering /filter, "
        "/prioritize and /preempt from the Nodes' live GPU state (list/watch of Nodes, pods "
        "and Leases), until SIGTERM.",
        add_flags=lambda p: extender_settings_flags().add_to(p),
    ),
    _Command(
        "device-plugin",
        help="serve the GPUs to the kubelet as a device plugin (no Node labels)",
        description="Read the GPUs on the schedule and serve them to the kubelet as the "
        "extended resource OMATICAYA_DEVICE_PLUGIN_RESOURCE, with live health.",
        add_flags=_agent_flags("device-plugin", _trace_speed),
    ),
    _Command(
        "mps",
        help="run and watch the CUDA MPS control daemons of the slices until SIGTERM",
        description="Supervise one CUDA MPS control daemon per slice the plugins ask for, its "
        "default pinned-memory limit the slice (a client's own limit can only lower it), and a "
        "probe daemon per shared GPU (OMATICAYA_SHARED_GPUS), and write their states for the "
        "plugins (OMATICAYA_MPS_STATE_DIR): a slice container becomes its slice's MPS client.",
        add_flags=lambda p: mps_settings_flags().add_to(p),
    ),
    _Command(
        "record",
        help="write a trace of this node's GPUs from NVML (replay it with --trace)",
        description="Sample this machine's GPUs through NVML every --interval for --duration "
        "and write the raw answers, errors included, as a trace file (JSON, the project's "
        "trace format): replay it with --trace, or attach it to a bug report.",
        add_flags=_record_flags,
    ),
    _Command(
        "top",
        help="the fleet's GPUs: a table of every node's live GPU state (list/watch nodes)",
        description="List the Nodes (and, with --watch, watch them) and print a table of "
        "their GPUs from Omaticaya's labels and telemetry: health, free memory, utilisation, "
        "how stale each reading is. Needs only get/list/watch on nodes (and leases).",
        add_flags=_top_flags,
    ),
    _Command(
        "stop-daemonset",
        help="delete a DaemonSet (foreground) and wait until its pods are gone",
        description="Delete the DaemonSet with propagationPolicy Foreground and wait until "
        "every pod it owns is gone, so that each agent's SIGTERM cleanup runs while the "
        "release's RBAC still exists. Exit 0 when they are gone (or the DaemonSet is not "
        "there), 1 on a timeout or an API failure, with one line.",
        add_flags=stop_daemonset_flags,
    ),
    _Command(
        "delete-resourceslices",
        help="delete every ResourceSlice of a DRA driver (the chart's uninstall hook)",
        description="Delete every ResourceSlice whose spec.driver is --driver (every Node's), "
        "then list again. Exit 0 when none is left (or resource.k8s.io/v1 is not served), 1 "
        "when some are left or on an API failure, with one line.",
        add_flags=delete_resourceslices_flags,
    ),
    _Command(
        "check-labels",
        help="check that the agent labelled every Node its DaemonSet runs on (helm test)",
        description="Read the agent's DaemonSet, its pods and their Nodes, and check that each "
        "pod is Ready and its Node carries <prefix>/gpu.health, not Unknown: the chart's helm "
        "test. One line per Node; exit 0 when every Node is labelled, 1 with one line per "
        "problem (no DaemonSet, no Node targeted, a pod missing or not Ready, a label missing) "
        "or on an API failure.",
        add_flags=check_labels_flags,
    ),
)

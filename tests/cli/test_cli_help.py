"""The command line as a first-time user meets it (issue 52 item 4): every sub-command's
``--help`` says what it does and its defaults, lists only its own flags; flags are named for
what they set (the old name warns); ``cleanup --dry-run`` says what it would remove; the
kubectl plugin names itself; the README and docs/commands.md list every sub-command.

``cleanup --dry-run`` against a Node needs the dev cluster's kube-apiserver (a ``cluster``
test); here the plan it prints is checked as the pure ``cleanup_text`` it prints through."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from omaticaya_py.cli.agent import cleanup_text
from omaticaya_py.cli.parser import build_parser
from omaticaya_py.kubectl_plugin import main as kubectl_main
from tests.helpers import H100_TRACE
from tests.helpers import run_cli as cli

ROOT = Path(__file__).resolve().parents[2]


def subparsers(prog: str = "omaticaya") -> dict[str, argparse.ArgumentParser]:
    """Sub-command -> its parser, flags added (as ``--help`` adds them)."""
    parser = build_parser(prog)
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for p in sub.choices.values():
        p.format_help()  # adds the sub-command's flags
    return dict(sub.choices)


COMMANDS = sorted(subparsers())


@pytest.mark.parametrize("command", COMMANDS)
def test_every_sub_command_describes_itself(command):
    parser = subparsers()[command]
    assert parser.description and len(parser.description) > 40, command
    assert " ".join(parser.description.split()) in " ".join(parser.format_help().split())


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_with_a_default_shows_it(command):
    parser = subparsers()[command]
    formatter = parser.formatter_class(prog=parser.prog)
    for action in parser._actions:
        if action.default in (None, False, argparse.SUPPRESS) or action.help == argparse.SUPPRESS:
            continue
        shown = formatter._get_help_string(action) or ""
        assert "default" in shown, (command, action.option_strings, shown)


@pytest.mark.parametrize(
    ("command", "flag", "default"),
    [("record", "--duration", "60s"), ("record", "--interval", "250ms"),
     ("record", "--log-level", "INFO"), ("top", "--sort", "name")],
)  # fmt: skip
def test_record_and_top_help_show_their_defaults(command, flag, default):
    text = " ".join(subparsers()[command].format_help().split())
    assert re.search(rf"{re.escape(flag)} \S+ .*?\(default: {re.escape(default)}\)", text), text


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings}


def test_cleanup_lists_only_its_own_flags():
    assert _options(subparsers()["cleanup"]) == {
        "-h", "--help", "--prefix", "--log-json", "--no-log-json", "--log-level", "--node",
        "--node-name", "--kube-timeout-s", "--kubeconfig", "--dry-run",
    }  # fmt: skip


def test_cleanup_takes_dry_run():
    args = build_parser().parse_args(["cleanup", "--node", "n1", "--dry-run"])
    assert args.dry_run is True and args.node_name == "n1"


@pytest.mark.parametrize(
    ("command", "old", "field"),
    [("run", "--share-policy", "placement_policy"), ("once", "--share-policy", "placement_policy"),
     ("show", "--share-policy", "placement_policy"),
     ("device-plugin", "--share-policy", "placement_policy"),
     ("extender", "--strategy", "placement_policy")],
)  # fmt: skip
def test_the_placement_policy_flag_is_named_for_its_variable(capsys, command, old, field):
    parser = subparsers()[command]
    options = _options(parser)
    assert "--placement-policy" in options and old not in options  # the old one: hidden
    help_text = " ".join(parser.format_help().split())
    assert "[OMATICAYA_PLACEMENT_POLICY; default binpack; " + old in help_text

    capsys.readouterr()
    new = build_parser().parse_args([command, "--placement-policy", "spread"])
    assert getattr(new, field) == "spread" and capsys.readouterr().err == ""

    args = build_parser().parse_args([command, old, "spread"])
    assert getattr(args, field) == "spread"
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert f"{old} is deprecated: use --placement-policy" in err[0]
    assert "OMATICAYA_PLACEMENT_POLICY" in err[0]


def test_a_bad_value_of_the_old_flag_is_named_as_given():
    done = cli("show", "--trace", str(H100_TRACE), "--share-policy", "pack")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and "deprecated" in lines[0], done.stderr
    assert "invalid setting --share-policy='pack'" in lines[1] and "Traceback" not in done.stderr


def test_a_bad_value_of_the_new_flag_is_named_as_given():
    done = cli("show", "--trace", str(H100_TRACE), "--placement-policy", "pack")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "invalid setting --placement-policy='pack'" in lines[0], done.stderr


@pytest.mark.parametrize("argv", [["--help"], ["top", "--help"]])
def test_the_kubectl_plugin_names_itself(capsys, argv):
    with pytest.raises(SystemExit) as done:
        kubectl_main(argv)
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: kubectl omaticaya top ")


def test_the_kubectl_plugins_errors_name_it(capsys):
    with pytest.raises(SystemExit) as done:
        kubectl_main(["-o", "yaml"])
    assert done.value.code == 2
    assert "kubectl omaticaya top: error: argument -o/--output" in capsys.readouterr().err


def test_omaticaya_top_keeps_its_own_name(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["top", "--help"])
    assert capsys.readouterr().out.startswith("usage: omaticaya top ")


@pytest.mark.parametrize("doc", ["README.md", "docs/commands.md"])
def test_the_command_lists_name_every_sub_command(doc):
    text = (ROOT / doc).read_text()
    section = text.split("## Commands", 1)[1]
    block = section.split("```", 2)[1]
    listed = re.findall(r"^omaticaya ([a-z-]+)", block, re.MULTILINE)
    assert sorted(listed) == COMMANDS, doc


# -- cleanup's plan ------------------------------------------------------------------------

PATCH = {"metadata": {
    "labels": {"omaticaya.io/gpu.count": None, "omaticaya.io/gpu.health": None},
    "annotations": {"omaticaya.io/telemetry": None},
}}  # fmt: skip


@pytest.mark.parametrize(
    ("patch", "lease", "dry_run", "expected"),
    [
        pytest.param(
            PATCH,
            "omaticaya/omaticaya-node-n1",
            True,
            "dry run, nothing changed: would remove 3 keys under omaticaya.io/ from Node n1 and "
            "delete Lease omaticaya/omaticaya-node-n1\n"
            "  label omaticaya.io/gpu.count\n  label omaticaya.io/gpu.health\n"
            "  annotation omaticaya.io/telemetry\n  lease omaticaya/omaticaya-node-n1",
            id="dry-run-keys-and-lease",
        ),
        pytest.param(
            PATCH,
            None,
            True,
            "dry run, nothing changed: would remove 3 keys under omaticaya.io/ from Node n1\n"
            "  label omaticaya.io/gpu.count\n  label omaticaya.io/gpu.health\n"
            "  annotation omaticaya.io/telemetry",
            id="dry-run-no-lease",
        ),
        pytest.param(
            None,
            None,
            True,
            "dry run, nothing changed: would remove 0 keys under omaticaya.io/ from Node n1",
            id="dry-run-nothing",
        ),
        pytest.param(
            PATCH,
            "omaticaya/omaticaya-node-n1",
            False,
            "removed 3 keys under omaticaya.io/ from Node n1 and Lease omaticaya/omaticaya-node-n1",
            id="done",
        ),
        pytest.param(
            None, None, False, "removed 0 keys under omaticaya.io/ from Node n1", id="done-nothing"
        ),
    ],
)
def test_cleanup_says_what_it_removes_or_would(patch, lease, dry_run, expected):
    assert cleanup_text("n1", "omaticaya.io", patch, lease, dry_run=dry_run) == expected

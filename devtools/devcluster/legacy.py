"""State dirs written by the bash dev-cluster (before ``state.json``): a ``<name>.pid`` file per
daemon. ``down`` stops what such a dir's pid files name, so that a cluster started before the
change is not left running by a ``down`` after it."""

from __future__ import annotations

from pathlib import Path

from devtools.devcluster import procs
from devtools.devcluster.state import Ports, Proc, State

#: name -> what its command line holds (the bash script's pid-reuse guard)
BINARIES = {
    "proxy": "kube-proxy",
    "controller-manager": "kube-controller-manager",
    "kubelet": "kubelet",
    "containerd": "containerd",
    "scheduler": "kube-scheduler",
    "apiserver": "kube-apiserver",
    "etcd": "etcd",
}


def legacy_state(state_dir: Path) -> State | None:
    """An in-memory ``State`` (no ports) of the live processes named by ``<name>.pid`` files
    whose command line holds their binary's name; None when there are none."""
    found: dict[str, Proc] = {}
    for name, binary in BINARIES.items():
        try:
            pid = int((state_dir / f"{name}.pid").read_text().split()[0])
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        if words and binary in " ".join(words):
            proc = procs.identify(pid, words)
            if procs.alive(proc):
                found[name] = proc
    return State(ports=Ports(0, 0, 0, 0), procs=found) if found else None


def forget(state_dir: Path) -> None:
    """Remove the pid files (their processes are stopped)."""
    for name in BINARIES:
        (state_dir / f"{name}.pid").unlink(missing_ok=True)

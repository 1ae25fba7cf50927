"""``scripts/dev-cluster`` (all but ``build``): ``python -m devtools.devcluster COMMAND``.

Only the ``export KUBECONFIG=...`` line of ``up`` goes to stdout (and ``status``'s report);
progress and logs go to stderr. Errors: ``[dev-cluster] ERROR: ...`` on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from devtools.devcluster.state import DevClusterError, load_state

USAGE = """scripts/dev-cluster: a real, local kube-apiserver (+ etcd, optionally kube-scheduler)
for Omaticaya's tests and demo. Everything listens on 127.0.0.1 only.

  scripts/dev-cluster build [--scheduler] [--kubelet] [--full]  (scripts/dev-cluster-build)
  scripts/dev-cluster up [--scheduler]      # prints: export KUBECONFIG=...
  (every command: --kubernetes-version vX.Y.Z, the release: v1.37.2 (default) or v1.31.0,
   built from Go modules; a running cluster keeps the release it was started with)
  scripts/dev-cluster up --kubelet          # + containerd and a kubelet (Node omaticaya-kubelet)
  scripts/dev-cluster up --full             # a whole cluster for the chart: + kube-scheduler,
      kube-controller-manager, the kubelet on containerd with a bridge CNI, kube-proxy
      (iptables), the agent image (scripts/build-image) imported as
      omaticaya.local/omaticaya:<version>, and the kube-scheduler image at the chart's
      default reference (registry.k8s.io/kube-scheduler:<release>) made from the built
      binary (devtools/devcluster/full.py)
  scripts/dev-cluster down
  scripts/dev-cluster status
  scripts/dev-cluster stop-apiserver | start-apiserver
  scripts/dev-cluster stop-kubelet | start-kubelet | down-kubelet (+ containers, containerd)

Environment:
  OMATICAYA_KUBERNETES_VERSION  the release (as --kubernetes-version)
  OMATICAYA_CACHE    build cache (default ~/.cache/omaticaya); binaries in
                     $OMATICAYA_CACHE/k8s-<version>/bin
  OMATICAYA_DEV_DIR  state dir: certs, state.json (ports, pids), logs, etcd data
                     (default /tmp/omaticaya-dev)
"""


def release_of(state_dir: Path, command: str) -> None:
    """Set ``OMATICAYA_KUBERNETES_VERSION`` to the release the cluster in ``state_dir`` runs
    when it has one: a command on a running cluster acts on its release. Raises
    ``DevClusterError`` when ``up`` asks for another release than the one running."""
    try:
        st = load_state(state_dir) if state_dir.exists() else None
    except DevClusterError:
        return
    running = st.kubernetes_version if st is not None and st.procs else None
    if running is None:
        return
    asked = os.environ.get("OMATICAYA_KUBERNETES_VERSION")
    if command == "up" and asked and asked.lstrip("v") != running.lstrip("v"):
        raise DevClusterError(
            f"the dev cluster in {state_dir} runs Kubernetes {running}, not {asked}: "
            f"'OMATICAYA_DEV_DIR={state_dir} scripts/dev-cluster down' first, or use another "
            "OMATICAYA_DEV_DIR"
        )
    os.environ["OMATICAYA_KUBERNETES_VERSION"] = running


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/dev-cluster", usage=USAGE, add_help=False)
    parser.add_argument("command", nargs="?", default="")
    parser.add_argument("--scheduler", action="store_true")
    parser.add_argument("--kubelet", action="store_true")
    parser.add_argument("--full", action="store_true")
    parser.add_argument("-h", "--help", action="store_true")
    args = parser.parse_args(argv)
    if args.help or args.command == "help":
        print(USAGE, file=sys.stderr)
        return 0
    flags = args.scheduler or args.kubelet or args.full
    if args.command != "up" and flags:
        parser.error(f"{args.command}: unknown option")
    state_dir = Path(os.environ.get("OMATICAYA_DEV_DIR") or "/tmp/omaticaya-dev")
    release_of(state_dir, args.command)
    # imported once the release is known: devtools.devcluster.cluster reads it at import
    from devtools.devcluster import control, kubelet
    from devtools.devcluster.cluster import Cluster

    c = Cluster(state_dir)
    commands = {
        "down": control.down,
        "stop-apiserver": lambda c: c.stop("apiserver"),
        "start-apiserver": control.start_apiserver_again,
        "stop-kubelet": lambda c: c.stop("kubelet"),
        "start-kubelet": kubelet.start_kubelet_again,
        "down-kubelet": kubelet.kubelet_down,
    }
    if args.command == "up":
        print(control.up(c, scheduler=args.scheduler, kubelet=args.kubelet, full=args.full),
              flush=True)
    elif args.command == "status":
        report, rc = control.status(c)
        print(report)
        return rc
    elif args.command in commands:
        commands[args.command](c)
    else:
        print(USAGE, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except DevClusterError as e:
        print(f"[dev-cluster] ERROR: {e}", file=sys.stderr)
        sys.exit(1)

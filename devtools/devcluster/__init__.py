"""The dev cluster's supervisor: a real, local etcd + kube-apiserver (+ kube-scheduler, kubelet
on containerd, kube-controller-manager, kube-proxy) for Omaticaya's tests, demo and benches.

``scripts/dev-cluster`` is the entry point (``python -m devtools.devcluster``); building the
binaries stays in bash (``scripts/dev-cluster-build``). Modules:

- ``state``: what a running cluster is (ports, processes, kubelet, full cluster), one JSON file
  ``$OMATICAYA_DEV_DIR/state.json`` read back as dataclasses;
- ``procs``: processes in their own session and process group (``start_new_session``), stopped
  with ``killpg``; a process is known by pid and start time (no pid-reuse mistakes); one
  readiness helper, ``wait_until``;
- ``files``: certificates, kubeconfigs, the audit policy, the kubelet's and containerd's files,
  the image tarballs (busybox; kube-scheduler at the chart's default reference,
  ``SCHEDULER_IMAGE``);
- ``control``: etcd, kube-apiserver, kube-scheduler, ``up``, ``down``, ``status``;
- ``kubelet``: containerd and the kubelet (``up --kubelet``);
- ``full``: the full cluster (``up --full``): bridge, firewall, controller-manager, kube-proxy,
  the agent image and the kube-scheduler image.

Only the standard library is used.
"""

from devtools.devcluster.state import DevClusterError, State, load_state

__all__ = ["DevClusterError", "State", "load_state"]

"""The chart's RBAC is exactly what the code calls (issue 48, item 5), per component and values.

The calls come from the code, not from a list: ``tests/kube_calls.py`` scans every request the
code under ``omaticaya_py/`` makes through ``ApiSession.http`` (method and path as written there,
followed through the callers where they are arguments) and turns each into the permissions the
API server checks (``get``/``list``/``watch``/``create``/``update``/``patch``/``delete``/
``deletecollection`` on a group's resource; a server-side apply is ``patch`` and ``create``).
What this file declares is only *who* calls each entry of the Kubernetes edge and *when*
(``USES``: the component, the rendered setting that turns the call on, and for a namespaced
resource which namespace it is in); every entry the scan finds must be declared, every
declaration must match an entry, and the components named must be the ones whose code refers to
the entry's class or function.

Rendered by the real helm (``tests/chart.py``) for the defaults, each goal of
``examples/install`` and the values that add permissions (sharing, eviction, DRA with sharing):
the permissions each component's ServiceAccount is bound to (``ClusterRoleBinding``: cluster-wide;
``RoleBinding``: its namespace) must equal the permissions its calls need: the test fails both
when the chart grants something no call needs and when a call needs something the chart lacks.
``resourceNames`` narrow a rule further and are not compared. The kube-scheduler's own
ServiceAccount (``system:kube-scheduler``: not this code's calls) is out of scope:
tests/charts/test_chart_rbac_scheduler.py. What a real kube-apiserver makes of the narrowed rules:
tests/charts/test_chart_dra.py (``test_agent_token_can_do_what_the_driver_needs``) and
tests/charts/test_chart_rbac.py.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import NAMESPACE, RELEASE, agent_daemonset, mps_daemonset, template
from tests.kube_calls import Access, Request, ScanError, access, scan

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "examples" / "install"
KUBE = "1.37.2"  # DRA (resource.k8s.io/v1) renders from 1.34


# ------------------------------------------------------------------ what the chart renders ----


@dataclass
class Rendered:
    """One ``helm template`` (hooks included): the documents, the agent's env, the extender's."""

    docs: list[dict[str, Any]]

    def env(self, container: dict[str, Any]) -> dict[str, str]:
        return {e["name"]: str(e.get("value", "")) for e in container.get("env") or []}

    @property
    def agent_env(self) -> dict[str, str]:
        spec = agent_daemonset(self.docs)["spec"]["template"]["spec"]
        return self.env(next(c for c in spec["containers"] if c["name"] == "agent"))

    @property
    def extender(self) -> dict[str, Any] | None:
        for d in self.docs:
            if d["kind"] == "Deployment":
                for c in d["spec"]["template"]["spec"]["containers"]:
                    if c.get("args") == ["extender"]:
                        return c
        return None

    @property
    def extender_env(self) -> dict[str, str]:
        return self.env(self.extender or {})

    @property
    def scheduler_config(self) -> str:
        return "".join(
            str((d.get("data") or {}).get("config.yaml", ""))
            for d in self.docs
            if d["kind"] == "ConfigMap"
        )

    def test_pods(self) -> list[dict[str, Any]]:
        """The ``helm test`` Pods (``helm.sh/hook: test``)."""
        return [
            d
            for d in self.docs
            if d["kind"] == "Pod"
            and (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"
        ]

    def test_args(self) -> list[list[str]]:
        return [
            list(c.get("args") or []) for d in self.test_pods() for c in d["spec"]["containers"]
        ]

    def hook_args(self) -> list[list[str]]:
        return [
            list(c.get("args") or [])
            for d in self.docs
            if d["kind"] == "Job"
            for c in d["spec"]["template"]["spec"]["containers"]
        ]


def render_all(helm: dict[str, Any], values: dict[str, Any] | None, *extra: str) -> Rendered:
    proc = template(helm, values, *extra, "--kube-version", KUBE)
    return Rendered([d for d in yaml.safe_load_all(proc.stdout) if d])


# ---------------------------------------------------------- who calls which entry, and when ----

Cond = Callable[[Rendered], bool]


def always(r: Rendered) -> bool:
    return True


def sharing(r: Rendered) -> bool:
    """The agent serves shared GPUs (``OMATICAYA_SHARED_GPUS``): it reads each slice's pod and
    posts over-use Events on it."""
    return r.agent_env.get("OMATICAYA_SHARED_GPUS", "none") not in ("", "none")


def evict(r: Rendered) -> bool:
    """``OMATICAYA_SLICE_OVER_LIMIT_ACTION=evict``: the agent evicts a pod over its slice."""
    return sharing(r) and r.agent_env.get("OMATICAYA_SLICE_OVER_LIMIT_ACTION") == "evict"


def dra(r: Rendered) -> bool:
    """``OMATICAYA_DRA=true``: the agent is the DRA driver (its ResourceSlice, the claims)."""
    return r.agent_env.get("OMATICAYA_DRA") == "true"


def extender(r: Rendered) -> bool:
    return r.extender is not None


def extender_pods(r: Rendered) -> bool:
    """The in-flight pod cache runs when ``OMATICAYA_SETTLE_S`` > 0."""
    return extender(r) and float(r.extender_env.get("OMATICAYA_SETTLE_S", "0")) > 0


def extender_preempts(r: Rendered) -> bool:
    """kube-scheduler calls /preempt: the extender reads the candidate Node and its pods."""
    return extender(r) and "preemptVerb:" in r.scheduler_config


def extender_unasked(r: Rendered) -> bool:
    """``OMATICAYA_EXTENDER_PREEMPT_UNASKED=true``: the extender preempts where kube-scheduler
    does not ask: it reads the pod and the candidate Node and its pods, evicts, posts Events."""
    return extender(r) and r.extender_env.get("OMATICAYA_EXTENDER_PREEMPT_UNASKED") == "true"


def extender_reads_candidates(r: Rendered) -> bool:
    return extender_preempts(r) or extender_unasked(r)


def extender_leases(r: Rendered) -> bool:
    """The Lease cache of ``OMATICAYA_EXTENDER_LEASE_NAMESPACE`` (the release namespace)."""
    namespace = r.extender_env.get("OMATICAYA_EXTENDER_LEASE_NAMESPACE", "")
    assert namespace in ("", NAMESPACE), namespace  # the scope "release" below says so
    return extender(r) and bool(namespace)


def hook_runs(command: str) -> Cond:
    """The uninstall hook runs ``omaticaya <command>``."""
    return lambda r: any(args[:1] == [command] for args in r.hook_args())


def helm_test_runs(command: str) -> Cond:
    """The ``helm test`` Pod runs ``omaticaya <command>``."""
    return lambda r: any(args[:1] == [command] for args in r.test_args())


#: component -> the code it runs (under omaticaya_py/), whose references to an entry's class or
#: function say that it calls it. The device plugin and the DRA driver run in the agent.
CODE = {
    "agent": ("agent", "dra", "deviceplugin"),
    "extender": ("scheduler",),
    "uninstall": ("cli/tools.py",),
    "helm-test": ("cli/checks.py",),
    "mps": ("mps",),
}

#: Where a namespaced call goes: "release" (the release namespace: a Role there), "default"
#: (a Role in default), "any" (any namespace: a ClusterRole). None: a cluster-scoped resource.
Use = tuple[str, Cond, str | None]

#: entry (tests/kube_calls.py) -> who calls it, when, where. Not the verbs: those are scanned.
USES: dict[str, list[Use]] = {
    # its own Node: read it, merge-patch <prefix>/ labels and annotations
    "kube.node_client.NodeClient.get_node": [("agent", always, None)],
    "kube.node_client.NodeClient.patch_node": [("agent", always, None)],
    # Events about its Node, in default as the kubelet posts them
    "kube.node_client.NodeClient.create_node_event": [("agent", always, "default")],
    # shared GPUs by index: the Event SharedGpuIndexMoved on its Node (DRA and device plugins)
    "kube.index_moved.post_index_moved": [("agent", sharing, "default")],
    # its liveness Lease omaticaya-node-<node> in the release namespace (POD_NAMESPACE); renew
    # reads its Node for the Lease's ownerReference
    "kube.heartbeat_lease.LeaseClient.renew": [("agent", always, "release")],
    "kube.heartbeat_lease.LeaseClient.release": [("agent", always, "release")],
    "kube.heartbeat_lease.LeaseClient.delete": [("agent", always, "release")],
    # shared GPUs: each slice's pod by name, Events on it, eviction (in the pod's namespace)
    # the extender with preemptUnasked: the preemptor read fresh, its victims evicted, Events
    # (read_pod's GET, scanned as get_pod's)
    "kube.pod_client.PodClient.get_pod": [("agent", sharing, "any"),
                                          ("extender", extender_unasked, "any")],
    "kube.pod_client.PodClient.create_pod_event": [("agent", sharing, "any"),
                                                   ("extender", extender_unasked, "any")],
    "kube.pod_client.PodClient.evict_pod": [("agent", evict, "any"),
                                            ("extender", extender_unasked, "any")],
    # DRA: its Node's ResourceSlice (read back, server-side applied, deleted on exit), and the
    # claim the kubelet asks it to prepare (by namespace and name)
    "kube.resourceslice.ResourceSliceClient.get": [("agent", dra, None)],
    "kube.resourceslice.ResourceSliceClient.apply": [("agent", dra, None)],
    "kube.resourceslice.ResourceSliceClient.delete": [("agent", dra, None)],
    "dra.plugin.DraPlugin.prepare": [("agent", dra, "any")],
    # the extender's caches (list+watch) and its preemption reads (list by field selector)
    "kube.node_cache.NodeCache": [("extender", extender, None)],
    "kube.pod_cache.PodCache": [("extender", extender_pods, None)],
    "kube.lease_cache.LeaseCache": [("extender", extender_leases, "release")],
    "scheduler.preempt.NodeReader.__call__": [("extender", extender_reads_candidates, None)],
    # the uninstall hook: stop the DaemonSets, delete every ResourceSlice of the driver
    "kube.workloads.stop_daemonset": [("uninstall", hook_runs("stop-daemonset"), "release")],
    "kube.resourceslice.delete_driver_slices": [
        ("uninstall", hook_runs("delete-resourceslices"), None)
    ],
    # helm test: the agent's DaemonSet and its pods, then each pod's Node
    "kube.agent_nodes.check_agent_nodes": [
        ("helm-test", helm_test_runs("check-labels"), "release")
    ],
}


@pytest.fixture(scope="module")
def requests() -> list[Request]:
    return scan(REPO)


def wrapper(entry: str) -> str:
    """The class or function an entry belongs to: ``NodeClient`` of
    ``kube.node_client.NodeClient.get_node``, ``stop_daemonset`` of ``kube.workloads.stop_daemonset``."""
    parts = entry.split(".")
    for part in parts[1:]:
        if part[:1].isupper():
            return part
    return parts[-1]


def names_used(where: str) -> set[str]:
    """Every identifier the code under ``omaticaya_py/<where>`` refers to (names, attributes,
    imported names): not its comments or docstrings."""
    root = REPO / "omaticaya_py" / where
    files = [root] if root.suffix == ".py" else sorted(root.rglob("*.py"))
    out: set[str] = set()
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Name):
                out.add(node.id)
            elif isinstance(node, ast.Attribute):
                out.add(node.attr)
            elif isinstance(node, ast.alias):
                out.add(node.asname or node.name.rsplit(".", 1)[-1])
    return out


Perm = tuple[str, str, str, str]  # (where: "cluster" or "namespace:<ns>", group, resource, verb)


def scope(a: Access, where: str | None) -> str:
    """Where RBAC must grant ``a``: ``cluster`` (a ClusterRole) or ``namespace:<ns>`` (a Role)."""
    if not a.namespaced:
        return "cluster"
    assert where is not None, f"{a.resource} is namespaced: USES must say where"
    return {"any": "cluster", "release": f"namespace:{NAMESPACE}"}.get(where, f"namespace:{where}")


def needed(requests: list[Request], r: Rendered) -> dict[str, set[Perm]]:
    """component -> the permissions its calls need under the rendered values."""
    out: dict[str, set[Perm]] = {c: set() for c in CODE}
    for req in requests:
        for component, when, where in USES[req.entry]:
            if when(r):
                out[component] |= {
                    (scope(a, where), a.group, a.resource, a.verb) for a in req.accesses
                }
    return out


# -------------------------------------------------------------------- what the chart grants ----


def account_of(r: Rendered, component: str) -> str | None:
    """The ServiceAccount whose token ``component`` holds (``None``: it holds none)."""
    if component == "agent":
        spec = agent_daemonset(r.docs)["spec"]["template"]["spec"]
        return spec["serviceAccountName"]
    if component == "mps":
        ds = mps_daemonset(r.docs)
        if ds is None:
            return None
        spec = ds["spec"]["template"]["spec"]
        projected = [
            s
            for v in spec.get("volumes") or []
            for s in (v.get("projected") or {}).get("sources") or []
            if "serviceAccountToken" in s
        ]
        if spec.get("automountServiceAccountToken") is False and not projected:
            return None
        return spec.get("serviceAccountName", "default")
    if component == "extender":
        c = r.extender
        if c is None:
            return None
        mount = next(
            m
            for m in c["volumeMounts"]
            if m["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount"
        )
        pod = next(d for d in r.docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        secret = next(
            d
            for d in r.docs
            if d["kind"] == "Secret" and d["metadata"]["name"] == volume["secret"]["secretName"]
        )
        assert secret["type"] == "kubernetes.io/service-account-token"
        return secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    if component == "helm-test":
        accounts = {d["spec"]["serviceAccountName"] for d in r.test_pods()}
        assert len(accounts) <= 1, accounts
        return accounts.pop() if accounts else None
    if component == "uninstall":
        jobs = [d for d in r.docs if d["kind"] == "Job"]
        accounts = {j["spec"]["template"]["spec"]["serviceAccountName"] for j in jobs}
        assert len(accounts) <= 1, accounts
        return accounts.pop() if accounts else None
    raise AssertionError(component)


def granted(r: Rendered, account: str | None) -> set[Perm]:
    """The permissions the rendered bindings give ``account`` (in the release namespace):
    a ClusterRoleBinding's rules cluster-wide, a RoleBinding's in its namespace. A binding to a
    role the chart does not render (a system role) fails: no component of this code has one."""
    if account is None:
        return set()
    roles: dict[tuple[str, str, str], dict[str, Any]] = {}
    for d in r.docs:
        if d["kind"] in ("Role", "ClusterRole"):
            roles[(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", ""))] = d
    out: set[Perm] = set()
    for b in r.docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s["kind"] == "ServiceAccount"
            and s["name"] == account
            and s.get("namespace") == NAMESPACE
            for s in b.get("subjects") or []
        ):
            continue
        where = (
            "cluster"
            if b["kind"] == "ClusterRoleBinding"
            else f"namespace:{b['metadata']['namespace']}"
        )
        ref = b["roleRef"]
        ns = "" if ref["kind"] == "ClusterRole" else b["metadata"]["namespace"]
        role = roles.get((ref["kind"], ref["name"], ns))
        assert role is not None, f"{b['metadata']['name']} binds {account} to {ref}, not rendered"
        for rule in role.get("rules") or []:
            assert not rule.get("nonResourceURLs"), rule
            out |= {
                (where, g, res, v)
                for g in rule["apiGroups"]
                for res in rule["resources"]
                for v in rule["verbs"]
            }
    return out


# ------------------------------------------------------------------------------- the tests ----

ACCESS_CASES = [
    # (method, path, watch, apply, [(group, resource, verb, namespaced)])
    ("GET", "/api/v1/nodes/{name}", False, False, [("", "nodes", "get", False)]),
    ("GET", "/api/v1/nodes", False, False, [("", "nodes", "list", False)]),
    ("GET", "/api/v1/nodes", True, False, [("", "nodes", "watch", False)]),
    ("PATCH", "/api/v1/nodes/{name}", False, False, [("", "nodes", "patch", False)]),
    ("POST", "/api/v1/namespaces/{namespace}/events", False, False, [("", "events", "create", True)]),
    ("POST", "/api/v1/namespaces/{namespace}/pods/{name}/eviction", False, False,
     [("", "pods/eviction", "create", True)]),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/x/leases/{name}", False, False,
     [("coordination.k8s.io", "leases", "update", True)]),
    ("PATCH", "/apis/resource.k8s.io/v1/resourceslices/{name}", False, True,
     [("resource.k8s.io", "resourceslices", "patch", False),
      ("resource.k8s.io", "resourceslices", "create", False)]),
    ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/{name}", False, False,
     [("resource.k8s.io", "resourceslices", "delete", False)]),
    ("DELETE", "/apis/resource.k8s.io/v1/resourceslices", False, False,
     [("resource.k8s.io", "resourceslices", "deletecollection", False)]),
    ("GET", "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}", False, False,
     [("resource.k8s.io", "resourceclaims", "get", True)]),
    ("GET", "/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}", False, False,
     [("apps", "daemonsets", "get", True)]),
]  # fmt: skip


@pytest.mark.parametrize(("method", "path", "watch", "apply", "want"), ACCESS_CASES)
def test_access_names_what_the_api_server_checks(method, path, watch, apply, want):
    assert access(method, path, watch=watch, apply=apply) == tuple(Access(*w) for w in want)


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/healthz"), ("GET", "/apis/resource.k8s.io"), ("HEAD", "/api/v1/nodes"),
     ("GET", "/api/v1/namespaces/x/pods/p/log/more")],
)  # fmt: skip
def test_access_refuses_what_is_not_a_resource_request(method, path):
    with pytest.raises(ValueError, match="not a"):
        access(method, path)


def test_the_scan_follows_arguments_and_attributes(tmp_path):
    """A wrapper whose method and path are another function's arguments, and an informer whose
    path is a subclass's attribute, resolve to the calls they make; an unknown path fails."""
    pkg = tmp_path / "pkg" / "kube"
    pkg.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "wrap.py").write_text(
        "_ONE = '/api/v1/namespaces/{namespace}/configmaps'\n"
        "class Client:\n"
        "    def _request(self, method, path):\n"
        "        return self.session.http(method, path)\n"
        "    def read(self):\n"
        "        return self._request('GET', _ONE + '/{name}')\n"
        "class Base:\n"
        "    path = ''\n"
        "    def run(self):\n"
        "        self.session.http('GET', self.path, query={'watch': 'true'})\n"
        "class Secrets(Base):\n"
        "    def __init__(self, ns):\n"
        "        self.path = f'/api/v1/namespaces/{ns}/secrets'\n"
    )
    got = {(r.entry, a) for r in scan(tmp_path, "pkg") for a in r.accesses}
    assert got == {
        ("kube.wrap.Client.read", Access("", "configmaps", "get", True)),
        ("kube.wrap.Secrets", Access("", "secrets", "watch", True)),
    }
    (pkg / "bad.py").write_text("def f(s, where):\n    s.http('GET', where.path)\n")
    with pytest.raises(ScanError, match="bad.py:2"):
        scan(tmp_path, "pkg")


def test_every_request_goes_through_the_session_the_scan_reads():
    """The scan sees ``ApiSession.http`` calls only: no other module reaches the client's
    ``ApiClient`` (import-linter keeps ``kubernetes`` inside kube/; this keeps it inside
    session.py), so no request bypasses it."""
    session = REPO / "omaticaya_py" / "kube" / "session.py"
    for f in sorted((REPO / "omaticaya_py").rglob("*.py")):
        if f == session or f.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        names = names_used(str(f.relative_to(REPO / "omaticaya_py")))
        bypass = {n for n in names if n in ("call_api", "ApiClient", "api_client")}
        bypass |= {n for n in names if n.endswith("V1Api") or n.endswith("V1beta1Api")}
        assert not bypass, (
            f"{f.relative_to(REPO)} uses {sorted(bypass)}: requests through ApiSession.http"
        )


def test_every_call_is_declared_and_every_declaration_is_a_call(requests):
    entries = {r.entry for r in requests}
    assert entries - USES.keys() == set(), "calls nobody declared in USES (who, when, where)"
    assert USES.keys() - entries == set(), "USES entries the code no longer calls"
    for entry in entries:  # a namespace named exactly where a call is namespaced
        namespaced = any(a.namespaced for r in requests if r.entry == entry for a in r.accesses)
        for _, _, where in USES[entry]:
            assert (where is not None) is namespaced, f"{entry}: where {where!r}"


def test_the_declared_callers_are_the_code_that_uses_each_wrapper(requests):
    """For each wrapper class or function, the components USES names are those whose code
    refers to it (the MPS supervisor: none; it holds no token)."""
    used = {c: set().union(*(names_used(w) for w in paths)) for c, paths in CODE.items()}
    for entry in {r.entry for r in requests}:
        name = wrapper(entry)
        declared = {c for c, _, _ in USES[entry]}
        # every entry of one wrapper is declared for the same components, the ones using it
        refer = {c for c in CODE if name in used[c]}
        assert declared == refer, f"{entry}: USES says {declared}, the code of {refer} uses {name}"


VALUES = [
    ("defaults", None, ()),
    *[(f"goal-{g}", None, ("-f", str(INSTALL / g)))
      for g in ("labels.yaml", "scheduler.yaml", "device-plugin.yaml", "whole-stack.yaml", "dra.yaml")],
    ("sharing-evict", {"devicePlugin": {"enabled": True},
                       "sharing": {"gpus": "all", "overLimitAction": "evict"}}, ()),
    ("dra-sharing-evict", {"dra": {"enabled": True}, "scheduler": {"enabled": True},
                           "sharing": {"gpus": "all", "overLimitAction": "evict"}}, ()),
    ("dra-no-uninstall-hook", {"dra": {"enabled": True}, "cleanupOnUninstall": False}, ()),
    ("scheduler-no-preemption", {"scheduler": {"enabled": True, "preemption": "off"}}, ()),
    ("scheduler-preempt-unasked", {"scheduler": {"enabled": True,
                                                 "extender": {"preemptUnasked": True}}}, ()),
    ("scheduler-off-preempt-unasked", {"scheduler": {"enabled": True, "preemption": "off",
                                                     "extender": {"preemptUnasked": True}}}, ()),
]  # fmt: skip


@pytest.mark.parametrize(("values", "extra"), [v[1:] for v in VALUES], ids=[v[0] for v in VALUES])
@pytest.mark.parametrize("component", sorted(CODE))
def test_each_component_is_granted_exactly_what_its_calls_need(
    helm, requests, values, extra, component
):
    r = render_all(helm, values, *extra)
    need = needed(requests, r)[component]
    have = granted(r, account_of(r, component))
    assert have - need == set(), f"{component} is granted what no call of its code needs"
    assert need - have == set(), f"{component}'s calls need what the chart does not grant"


def test_the_admission_policy_for_resourceslices_stays(helm):
    """Narrower RBAC does not replace the policy that binds the agent's slice writes to its
    own Node's slice of the driver (docs/chart.md, Admission policy)."""
    r = render_all(helm, {"dra": {"enabled": True}})
    names = {d["metadata"]["name"] for d in r.docs if d["kind"] == "ValidatingAdmissionPolicy"}
    assert f"{RELEASE}-resourceslice-writes" in names
    assert {f"{RELEASE}-node-writes", f"{RELEASE}-lease-writes"} <= names

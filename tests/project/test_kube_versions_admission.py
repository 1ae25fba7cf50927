"""The chart's ValidatingAdmissionPolicy against admission requests built from a real server.

``tests/data/admission/node-patches-v1.37.2.json`` holds the agent's Node PATCHes as a real
kube-apiserver v1.37.2 (the dev cluster's default release) received them, made by ``capture()``
below (``OMATICAYA_WRITE_ADMISSION_DATA=1`` rewrites it from the release under test):

- the agent's own ``NodeClient`` (omaticaya_py.kube) sends each PATCH to the real API server with
  a TokenRequest token of the chart's ServiceAccount, bound to a Pod on the node, and the chart's
  RBAC (rendered for the release under test; the policies themselves are not applied: these are
  the requests as the admission chain receives them, and the policy is evaluated on them here);
- ``oldObject`` and ``object`` are the Node read back by the admin just before and just after
  the PATCH (what the server stored; an admission plugin sees ``object`` before it is stored, so
  ``resourceVersion`` and ``managedFields`` differ from what it would see);
- ``userInfo``, the verb, the request URI, the audit ID (used as ``uid``) and the user agent come
  from that PATCH's ``ResponseComplete`` event in the server's audit log (Metadata level: no
  bodies);
- the rest of the ``admission.k8s.io/v1`` AdmissionRequest is fixed by the API for a PATCH of a
  Node: ``operation: UPDATE``, ``options`` a ``PatchOptions``, kind/resource ``v1 Node/nodes``.

Every supported release (1.31 and later) puts the ``authentication.kubernetes.io/node-name``
claim into a pod-bound token (``ServiceAccountTokenPodNodeInfo``: beta and on in 1.30-1.31, GA
from 1.32), so the captured ``userInfo.extra`` carries the claim the server itself set; a token
without it (not bound to a pod) is the same request with the claim taken out.
``test_captured_requests_are_what_the_server_does`` re-runs the capture on the real server of the
release under test (v1.37.2, or v1.31.0 in the oldest-release lane) and compares it with the
stored file: the same user, groups, extra keys, node-name claim and changes on both. The policies
in force on a real server: tests/charts/test_admission_cluster.py.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.audit import audit_events
from tests.chart import NAMESPACE, RELEASE, Vap
from tests.helpers import agent_pod_doc, token_kubeconfig
from tests.project.kube_versions_support import SUPPORTED, docs_at, under_test

DATA = Path(__file__).resolve().parents[1] / "data" / "admission" / "node-patches-v1.37.2.json"
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
CLAIM = "authentication.kubernetes.io/node-name"
NODE, OTHER_NODE = "omaticaya-admission-gpu-1", "omaticaya-admission-gpu-2"
P = "omaticaya.io/"

#: id -> (node the agent patches, the merge patch it sends)
PATCHES: dict[str, tuple[str, dict]] = {
    "own-labels-added": (
        NODE,
        {
            "metadata": {
                "labels": {P + "gpu.count": "1", P + "gpu.memory.free-mib": "80896"},
                "annotations": {P + "telemetry": '{"read_at":"2026-01-01T00:00:00Z"}'},
            }
        },
    ),
    "own-label-changed": (NODE, {"metadata": {"labels": {P + "gpu.memory.free-mib": "49152"}}}),
    "own-label-removed": (NODE, {"metadata": {"labels": {P + "gpu.memory.free-mib": None}}}),
    "foreign-label-changed": (NODE, {"metadata": {"labels": {"example.com/keep": "no"}}}),
    "foreign-annotation-added": (NODE, {"metadata": {"annotations": {"example.com/a": "b"}}}),
    "spec-changed": (NODE, {"spec": {"unschedulable": True}}),
    "other-node": (OTHER_NODE, {"metadata": {"labels": {P + "gpu.count": "1"}}}),
}
#: id -> word of the denial, or None (allowed), for the token bound to a Pod on NODE (as captured)
WITH_CLAIM = {
    "own-labels-added": None,
    "own-label-changed": None,
    "own-label-removed": None,
    "foreign-label-changed": "labels",
    "foreign-annotation-added": "annotations",
    "spec-changed": "spec",
    "other-node": f"may not change node {OTHER_NODE}",
}
#: the same with requireNodeClaim=false and no claim (a token not bound to a pod)
NO_CLAIM_NOT_REQUIRED = WITH_CLAIM | {"other-node": None}


# ------------------------------------------------------------------------------- capture ----


def _raw_node(api_client, name: str) -> dict:
    """The Node as the server sends it (JSON, not through the client's typed models)."""
    from kubernetes import client

    response = client.CoreV1Api(api_client).read_node(name, _preload_content=False)
    return json.loads(response.data)


def _create(fn) -> bool:
    """Create with ``fn``; False when the object was there already (409)."""
    from kubernetes.client.exceptions import ApiException

    try:
        fn()
    except ApiException as exc:
        if exc.status != 409:
            raise
        return False
    return True


def _audit_event(dev_cluster, name: str, seen: set[str]) -> dict:
    """The newest ResponseComplete audit event of the agent's PATCH of Node ``name``."""
    patches = audit_events(dev_cluster, verb="patch", resource="nodes", name=name, user=AGENT_USER)
    for event in reversed(patches):
        if event["auditID"] not in seen:
            seen.add(event["auditID"])
            return event
    raise AssertionError(f"no audit event for the agent's PATCH of node {name}")


def capture(dev_cluster, admin_client, helm, tmp: Path) -> dict:
    """Run the agent's PATCHes against the real server; return the stored file's content."""
    from kubernetes import client

    from omaticaya_py.kube import NodeClient

    rbac = [
        d
        for d in docs_at(helm, under_test())
        if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")
    ]
    admin = client.CoreV1Api(admin_client)
    rbac_api = client.RbacAuthorizationV1Api(admin_client)
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    _create(lambda: admin.create_namespace(ns))
    # the cluster-scoped RBAC it creates goes again at the end: other modules of the session
    # create their own of the same names (the chart's, rendered with other values)
    created: list[tuple[str, str]] = []
    for doc in rbac:
        kind = doc["kind"]
        if kind == "ServiceAccount":
            _create(lambda doc=doc: admin.create_namespaced_service_account(NAMESPACE, doc))
        elif kind == "ClusterRole":
            if _create(lambda doc=doc: rbac_api.create_cluster_role(doc)):
                created.append((kind, doc["metadata"]["name"]))
        elif _create(lambda doc=doc: rbac_api.create_cluster_role_binding(doc)):
            created.append((kind, doc["metadata"]["name"]))
    for name in (NODE, OTHER_NODE):
        try:
            admin.delete_node(name)
        except client.exceptions.ApiException as exc:
            assert exc.status == 404
        admin.create_node(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"example.com/keep": "yes"}},
            }
        )
    pod_name = "omaticaya-admission-agent"
    try:
        admin.delete_namespaced_pod(pod_name, NAMESPACE, grace_period_seconds=0)
    except client.exceptions.ApiException as exc:
        assert exc.status == 404
    pod = admin.create_namespaced_pod(NAMESPACE, agent_pod_doc(pod_name, NODE, RELEASE))
    token = admin.create_namespaced_service_account_token(
        RELEASE,
        NAMESPACE,
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": 600,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": pod.metadata.uid,
                },
            },
        },
    ).status.token
    kubeconfig = token_kubeconfig(dev_cluster, token, tmp / "agent-kubeconfig")
    # RBAC reaches the authorizer through an informer: ask until the binding is in effect
    auth = client.AuthorizationV1Api(admin_client)
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": AGENT_USER,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}"],
            "resourceAttributes": {"verb": "patch", "resource": "nodes", "name": NODE},
        },
    }
    for _ in range(2000):
        if auth.create_subject_access_review(review).status.allowed:
            break
    else:
        raise AssertionError("the chart's ClusterRoleBinding never took effect")

    cases, seen = [], set()
    try:
        for case_id, (name, patch) in PATCHES.items():
            old = _raw_node(admin_client, name)
            agent = NodeClient(name, kubeconfig=str(kubeconfig), attempts=1, sleep=lambda s: None)
            try:
                agent.patch_node(patch)
            finally:
                agent.close()
            new = _raw_node(admin_client, name)
            event = _audit_event(dev_cluster, name, seen)
            ref = {"group": "", "version": "v1"}
            cases.append(
                {
                    "id": case_id,
                    "patch": patch,
                    "audit": {
                        k: event.get(k)
                        for k in ("auditID", "verb", "requestURI", "userAgent", "responseStatus")
                    },
                    "request": {
                        "uid": event["auditID"],
                        "kind": ref | {"kind": "Node"},
                        "resource": ref | {"resource": "nodes"},
                        "requestKind": ref | {"kind": "Node"},
                        "requestResource": ref | {"resource": "nodes"},
                        "name": name,
                        "operation": "UPDATE",
                        "userInfo": event["user"],
                        "object": new,
                        "oldObject": old,
                        "dryRun": False,
                        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "PatchOptions"},
                    },
                }
            )
    finally:
        for name in (NODE, OTHER_NODE):
            admin.delete_node(name)
        admin.delete_namespaced_pod(pod_name, NAMESPACE, grace_period_seconds=0)
        for kind, name in reversed(created):
            if kind == "ClusterRole":
                rbac_api.delete_cluster_role(name)
            else:
                rbac_api.delete_cluster_role_binding(name)
    server = "v" + under_test()
    return {
        "about": (
            "Admission requests for the Omaticaya agent's Node PATCHes, built from a real "
            f"kube-apiserver {server} (dev cluster): object/oldObject read back around each PATCH "
            "sent by omaticaya_py.kube.NodeClient with a pod-bound ServiceAccount token; "
            "userInfo, auditID, requestURI and userAgent from the PATCH's ResponseComplete audit "
            "event (Metadata level). Made by tests/project/test_kube_versions_admission.py capture()."
        ),
        "server": server,
        "pod": {"name": pod_name, "node": NODE},
        "cases": cases,
    }


# ------------------------------------------------------------------------------ evaluate ----


class _VapRequest(Vap):
    """The policy evaluated on a whole AdmissionRequest (its object, oldObject and request)."""

    def evaluate(self, request: dict) -> list[str] | None:
        return self.judge(
            {"object": request["object"], "oldObject": request["oldObject"], "request": request}
        )


def stored() -> dict:
    return json.loads(DATA.read_text())


def without_claim(request: dict) -> dict:
    """The request as the server sends it for a token of the same ServiceAccount that carries no
    node-name claim (a TokenRequest not bound to a pod)."""
    out = copy.deepcopy(request)
    out["userInfo"].get("extra", {}).pop(CLAIM, None)
    return out


def policy(helm, kube: str, **vap: Any) -> _VapRequest:
    pytest.importorskip("cel_expr_python", reason="cel-expr-python not installed")
    values = {"validatingAdmissionPolicy": {"enabled": True, **vap}}
    (doc,) = [
        d
        for d in docs_at(helm, kube, values)
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith("-node-writes")
    ]
    return _VapRequest(doc)


def _check(got: list[str] | None, denied: str | None) -> None:
    assert got is not None, "the policy did not match the agent's request"
    if denied is None:
        assert got == []
    else:
        assert len(got) == 1 and denied in got[0], got


CASE_IDS = list(PATCHES)
#: policies rendered at these versions are evaluated (the oldest, one between, the newest)
POLICY_VERSIONS = [f"{SUPPORTED[0]}.0", f"{SUPPORTED[len(SUPPORTED) // 2]}.0", f"{SUPPORTED[-1]}.0"]


def test_stored_requests_are_complete_and_from_the_agent():
    data = stored()
    assert data["server"] == "v1.37.2"
    assert [c["id"] for c in data["cases"]] == CASE_IDS
    for case in data["cases"]:
        req = case["request"]
        assert req["operation"] == "UPDATE" and req["options"]["kind"] == "PatchOptions"
        assert req["userInfo"]["username"] == AGENT_USER
        assert f"system:serviceaccounts:{NAMESPACE}" in req["userInfo"]["groups"]
        # the server put the node-name claim of the token's Pod into the request
        assert req["userInfo"]["extra"][CLAIM] == [data["pod"]["node"]] == [NODE]
        assert case["audit"]["verb"] == "patch" and case["audit"]["responseStatus"]["code"] == 200
        assert req["object"]["metadata"]["name"] == req["oldObject"]["metadata"]["name"]
        assert req["name"] == PATCHES[case["id"]][0]


@pytest.mark.parametrize("kube", POLICY_VERSIONS)
@pytest.mark.parametrize("case_id", CASE_IDS)
def test_policy_on_captured_requests(helm, kube, case_id):
    """As captured, the server's own node-name claim included."""
    case = next(c for c in stored()["cases"] if c["id"] == case_id)
    vap = policy(helm, kube)
    _check(vap.evaluate(case["request"]), WITH_CLAIM[case_id])


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_policy_on_captured_requests_without_the_claim(helm, case_id):
    """A token without the claim: denied by default, whatever the change."""
    case = next(c for c in stored()["cases"] if c["id"] == case_id)
    got = policy(helm, POLICY_VERSIONS[0]).evaluate(without_claim(case["request"]))
    assert got is not None and any("carries no" in m and CLAIM in m for m in got), got


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_policy_on_captured_requests_claim_not_required(helm, case_id):
    case = next(c for c in stored()["cases"] if c["id"] == case_id)
    vap = policy(helm, POLICY_VERSIONS[0], requireNodeClaim=False)
    _check(vap.evaluate(without_claim(case["request"])), NO_CLAIM_NOT_REQUIRED[case_id])


def test_policy_ignores_the_same_request_from_another_user(helm):
    request = copy.deepcopy(stored()["cases"][3]["request"])  # a foreign label change
    request["userInfo"]["username"] = "system:node:" + NODE
    assert policy(helm, POLICY_VERSIONS[0]).evaluate(request) is None


def _projection(data: dict) -> list[dict]:
    """What must not drift between captures: who, what, and what changed."""
    out = []
    for case in data["cases"]:
        req = case["request"]
        old, new = req["oldObject"], req["object"]
        out.append(
            {
                "id": case["id"],
                "name": req["name"],
                "username": req["userInfo"]["username"],
                "groups": sorted(req["userInfo"]["groups"]),
                "extra": sorted(req["userInfo"].get("extra", {})),
                "claim": req["userInfo"].get("extra", {}).get(CLAIM),
                "labels": (old["metadata"].get("labels"), new["metadata"].get("labels")),
                "annotations": (
                    {k: v for k, v in (old["metadata"].get("annotations") or {}).items()},
                    {k: v for k, v in (new["metadata"].get("annotations") or {}).items()},
                ),
                "spec": (old.get("spec"), new.get("spec")),
                "verb": case["audit"]["verb"],
                "userAgent": case["audit"]["userAgent"].split("/")[0],
            }
        )
    return out


@pytest.mark.cluster
def test_captured_requests_are_what_the_server_does(helm, dev_cluster, admin_client, tmp_path):
    fresh = capture(dev_cluster, admin_client, helm, tmp_path)
    if os.environ.get("OMATICAYA_WRITE_ADMISSION_DATA") == "1":
        DATA.parent.mkdir(parents=True, exist_ok=True)
        DATA.write_text(json.dumps(fresh, indent=1, sort_keys=True) + "\n")
    assert _projection(fresh) == _projection(stored())


# ------------------------------------------------------------------- resourceslice-writes ----

#: the supported releases that serve resource.k8s.io/v1 (dra.enabled renders from 1.34)
DRA_VERSIONS = [f"{v}.0" for v in SUPPORTED if int(v.split(".")[1]) >= 34]
SLICE_DRIVER = "gpu.omaticaya.io"


class _SliceVapRequest(_VapRequest):
    """With Kubernetes' CEL strings extension (``substring``, in every release's CEL)."""

    def __init__(self, doc: dict) -> None:
        super().__init__(doc)
        from cel_expr_python import cel
        from cel_expr_python.ext import ext_strings

        self.env = cel.NewEnv(
            variables={n: cel.Type.DYN for n in ("object", "oldObject", "request")},
            extensions=[ext_strings.ExtStrings()],
        )


def slice_policy(helm, kube: str, **vap: Any) -> _SliceVapRequest:
    pytest.importorskip("cel_expr_python", reason="cel-expr-python not installed")
    values = {"validatingAdmissionPolicy": {"enabled": True, **vap}, "dra": {"enabled": True}}
    (doc,) = [
        d
        for d in docs_at(helm, kube, values)
        if d["kind"] == "ValidatingAdmissionPolicy"
        and d["metadata"]["name"].endswith("-resourceslice-writes")
    ]
    return _SliceVapRequest(doc)


def slice_request(operation: str, node: str, driver: str = SLICE_DRIVER, claim: str | None = NODE
                  ) -> dict:  # fmt: skip
    """The AdmissionRequest of the agent's ResourceSlice write, as the API server builds it:
    apply (PATCH) is a CREATE or an UPDATE with the slice as ``object``; DELETE has only
    ``oldObject`` (the stored slice; a DeleteCollection is admitted as one DELETE per slice)."""
    from omaticaya_py.core.publish.dra import slice_body

    body = slice_body(node, "0c6d9f6e-0000-4000-8000-000000000001", [{"name": "gpu-0"}])
    body["spec"]["driver"] = driver
    if driver != SLICE_DRIVER:
        body["metadata"]["name"] = f"{node[:253 - len(driver) - 1]}-{driver}"
    ref = {"group": "resource.k8s.io", "version": "v1"}
    extra = {CLAIM: [claim]} if claim else {}
    return {
        "uid": "7a1c0d52-0000-4000-8000-000000000002",
        "kind": ref | {"kind": "ResourceSlice"},
        "resource": ref | {"resource": "resourceslices"},
        "name": body["metadata"]["name"],
        "operation": operation,
        "userInfo": {
            "username": AGENT_USER,
            "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                       "system:authenticated"],
            "extra": extra,
        },  # fmt: skip
        "object": None if operation == "DELETE" else body,
        "oldObject": None if operation == "CREATE" else body,
        "dryRun": False,
    }


#: id -> (operation, slice's node, driver, claim) and the denials' words (None: allowed)
SLICE_REQUESTS: dict[str, tuple[tuple[str, str, str, str | None], str | None]] = {
    "apply-own-create": (("CREATE", NODE, SLICE_DRIVER, NODE), None),
    "apply-own-update": (("UPDATE", NODE, SLICE_DRIVER, NODE), None),
    "delete-own": (("DELETE", NODE, SLICE_DRIVER, NODE), None),
    "apply-other-node": (
        ("CREATE", OTHER_NODE, SLICE_DRIVER, NODE),
        f"the omaticaya agent on node {NODE} may write only the ResourceSlice {NODE}-gpu.omaticaya.io",
    ),
    "delete-other-node": (("DELETE", OTHER_NODE, SLICE_DRIVER, NODE), "may write only the ResourceSlice"),
    "delete-other-driver": (
        ("DELETE", NODE, "gpu.example.com", NODE),
        "may write only ResourceSlices of driver gpu.omaticaya.io, not ResourceSlice",
    ),
    "apply-own-without-claim": (("CREATE", NODE, SLICE_DRIVER, None), f"carries no {CLAIM} claim"),
}  # fmt: skip


@pytest.mark.parametrize("kube", DRA_VERSIONS)
@pytest.mark.parametrize("case_id", list(SLICE_REQUESTS))
def test_resourceslice_policy_on_agent_requests(helm, kube, case_id):
    (operation, node, driver, claim), denied = SLICE_REQUESTS[case_id]
    got = slice_policy(helm, kube).evaluate(slice_request(operation, node, driver, claim))
    assert got is not None, "the policy did not match the agent's request"
    if denied is None:
        assert got == []
    else:
        assert got and denied in got[0], got


def test_resourceslice_policy_ignores_the_uninstall_hook(helm):
    """The uninstall hook's Job (its own ServiceAccount) deletes every slice of the driver."""
    request = slice_request("DELETE", OTHER_NODE, claim=None)
    request["userInfo"]["username"] = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-uninstall"
    assert slice_policy(helm, DRA_VERSIONS[0]).evaluate(request) is None


def test_resourceslice_policy_is_rendered_where_dra_is():
    assert DRA_VERSIONS and DRA_VERSIONS[0] == "1.34.0"

"""The chart's ValidatingAdmissionPolicy for the agent's Node writes: its shape, its prefix and
service account, and its CEL evaluated case by case (``cel-expr-python``, tests/chart.py's
``Vap``). Helpers: tests/chart.py.
"""

from __future__ import annotations

import pytest

from tests.chart import NAMESPACE, RELEASE, Vap, node_doc, render

# --------------------------------------------------------------------------------------------
# the admission policy
# --------------------------------------------------------------------------------------------


def vap_docs(
    helm, values: dict | None = None, which: str = "node-writes"
) -> tuple[dict, dict]:
    """The policy and binding named ``<fullname>-<which>`` (node-writes or lease-writes)."""
    docs = render(helm, {"validatingAdmissionPolicy": {"enabled": True}} | (values or {}))

    def named(kind: str) -> dict:
        (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(which)]
        return doc

    return named("ValidatingAdmissionPolicy"), named("ValidatingAdmissionPolicyBinding")


def test_admission_policy_shape(helm):
    policy, binding = vap_docs(helm)
    spec = policy["spec"]
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["nodes"]}
    ]
    (cond,) = spec["matchConditions"]
    assert cond["expression"] == (
        f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{RELEASE}'"
    )
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert variables["prefix"] == "'omaticaya.io/'"
    text = "\n".join(v.get("expression", "") for v in spec["variables"] + spec["validations"])
    assert "'authentication.kubernetes.io/node-name' in request.userInfo.extra" in text
    assert "object.spec == oldObject.spec" in text


def test_admission_policy_follows_prefix_and_service_account(helm):
    policy, _ = vap_docs(helm, {"prefix": "gpu.example.com/", "serviceAccount": {"name": "agent"}})
    spec = policy["spec"]
    assert {v["name"]: v["expression"] for v in spec["variables"]}["prefix"] == "'gpu.example.com/'"
    assert f"system:serviceaccount:{NAMESPACE}:agent'" in spec["matchConditions"][0]["expression"]


CLAIM = {"authentication.kubernetes.io/node-name": ["gpu-1"]}
P = "omaticaya.io/"
CEL_CASES = [
    # (id, old, new, extra, denied-by: None = allowed, else a word of the message)
    ("add-own-label", node_doc({"a": "1"}), node_doc({"a": "1", P + "gpu.count": "8"}), CLAIM, None),
    ("labels-map-missing-before", node_doc(), node_doc({P + "gpu.count": "8"}), CLAIM, None),
    ("remove-own-label-map-gone", node_doc({P + "x": "1"}), node_doc(), CLAIM, None),
    (
        "change-own-annotation",
        node_doc(annotations={P + "telemetry": "{}"}),
        node_doc(annotations={P + "telemetry": '{"a":1}'}),
        CLAIM,
        None,
    ),
    ("change-foreign-label", node_doc({"a": "1"}), node_doc({"a": "2"}), CLAIM, "labels"),
    ("add-foreign-label", node_doc({"a": "1"}), node_doc({"a": "1", "b": "2"}), CLAIM, "labels"),
    (
        "remove-foreign-label",
        node_doc({"a": "1", P + "x": "1"}),
        node_doc({P + "x": "1"}),
        CLAIM,
        "labels",
    ),
    ("remove-all-labels", node_doc({"a": "1"}), node_doc(), CLAIM, "labels"),
    ("lookalike-prefix", node_doc({}), node_doc({"omaticaya.io.evil.com/x": "1"}), CLAIM, "labels"),
    ("prefix-without-slash", node_doc({}), node_doc({"omaticaya.io": "1"}), CLAIM, "labels"),
    (
        "foreign-annotation",
        node_doc(annotations={"x": "1"}),
        node_doc(annotations={}),
        CLAIM,
        "annotations",
    ),
    ("spec-change", node_doc(), node_doc(spec={"unschedulable": True}), CLAIM, "spec"),
    ("finalizer-added", node_doc(), node_doc(finalizers=["example.com/x"]), CLAIM, "finalizers"),
    (
        "other-node",
        node_doc(name="gpu-2"),
        node_doc({P + "x": "1"}, name="gpu-2"),
        CLAIM,
        "may not change node gpu-2",
    ),
    ("no-extra", node_doc(), node_doc({P + "x": "1"}), None, "claim"),
    ("claim-missing", node_doc(), node_doc({P + "x": "1"}), {"other": ["gpu-1"]}, "claim"),
    (
        "claim-empty",
        node_doc(),
        node_doc({P + "x": "1"}),
        {"authentication.kubernetes.io/node-name": []},
        "claim",
    ),
]


@pytest.fixture(scope="module")
def vap(helm) -> Vap:
    pytest.importorskip("cel_expr_python", reason="cel-expr-python not installed")
    policy, _ = vap_docs(helm)
    return Vap(policy)


@pytest.mark.parametrize(
    ("old", "new", "extra", "denied"), [c[1:] for c in CEL_CASES], ids=[c[0] for c in CEL_CASES]
)
def test_admission_policy_cel(vap, old, new, extra, denied):
    agent = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
    got = vap.denials(old, new, agent, extra)
    if denied is None:
        assert got == []
    else:
        assert len(got) == 1 and denied in got[0], got


def test_admission_policy_ignores_other_users(vap):
    assert vap.denials(node_doc({"a": "1"}), node_doc({"a": "2"}), "system:node:gpu-1", CLAIM) is None
    other_sa = f"system:serviceaccount:{NAMESPACE}:other"
    assert vap.denials(node_doc({"a": "1"}), node_doc({"a": "2"}), other_sa, CLAIM) is None


def test_admission_policy_claim_optional(helm):
    pytest.importorskip("cel_expr_python", reason="cel-expr-python not installed")
    policy, _ = vap_docs(
        helm, {"validatingAdmissionPolicy": {"enabled": True, "requireNodeClaim": False}}
    )
    agent = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
    v = Vap(policy)
    assert v.denials(node_doc(), node_doc({P + "x": "1"}), agent, None) == []
    assert v.denials(node_doc(name="gpu-2"), node_doc({P + "x": "1"}, name="gpu-2"), agent, CLAIM) != []


# --------------------------------------------------------------------------------------------
# the ResourceSlice policy (dra.enabled)
# --------------------------------------------------------------------------------------------

DRIVER = "gpu.omaticaya.io"
#: DRA (resource.k8s.io/v1) renders from 1.34
DRA_KUBE = "1.37.0"
AGENT = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"


def slice_vap_docs(helm, values: dict | None = None) -> tuple[dict, dict]:
    """The ResourceSlice policy and binding, DRA and the policies on."""
    docs = render(
        helm,
        {"validatingAdmissionPolicy": {"enabled": True}, "dra": {"enabled": True}} | (values or {}),
        "--kube-version",
        DRA_KUBE,
    )

    def named(kind: str) -> dict:
        (doc,) = [
            d
            for d in docs
            if d["kind"] == kind and d["metadata"]["name"].endswith("-resourceslice-writes")
        ]
        return doc

    return named("ValidatingAdmissionPolicy"), named("ValidatingAdmissionPolicyBinding")


class StringsVap(Vap):
    """``Vap`` with Kubernetes' CEL strings extension (``substring``: the cut of a long Node
    name in the slice's name)."""

    def __init__(self, policy: dict) -> None:
        super().__init__(policy)
        from cel_expr_python import cel
        from cel_expr_python.ext import ext_strings

        self.env = cel.NewEnv(
            variables={n: cel.Type.DYN for n in ("object", "oldObject", "request")},
            extensions=[ext_strings.ExtStrings()],
        )

    def slice_denials(
        self, operation: str, slice_: dict, user: str, extra: dict | None
    ) -> list[str] | None:
        """The policy on a CREATE/UPDATE (``object``: ``slice_``; an UPDATE's ``oldObject`` the
        same, as the API keeps name, driver, pool and nodeName) or a DELETE (``oldObject`` only,
        ``object`` null)."""
        info: dict[str, object] = {"username": user}
        if extra is not None:
            info["extra"] = extra
        new = None if operation == "DELETE" else slice_
        old = None if operation == "CREATE" else slice_
        return self.judge(
            {"object": new, "oldObject": old,
             "request": {"operation": operation, "userInfo": info}}
        )  # fmt: skip


def slice_of(node: str, driver: str = DRIVER, name: str | None = None, pool: str | None = None,
             node_name: str | None = "") -> dict:  # fmt: skip
    """A ResourceSlice as the agent writes it (``core.publish.dra.slice_body``), then ``driver``,
    ``name``, ``pool`` or ``node_name`` (None: unset, as with nodeSelector/allNodes) changed."""
    from omaticaya_py.core.publish.dra import slice_body

    body = slice_body(node, "uid-" + node, [{"name": "gpu-0"}])
    body["spec"]["driver"] = driver
    if name is not None:
        body["metadata"]["name"] = name
    if pool is not None:
        body["spec"]["pool"]["name"] = pool
    if node_name is None:
        del body["spec"]["nodeName"]
        body["spec"]["allNodes"] = True
    elif node_name:
        body["spec"]["nodeName"] = node_name
    return body


LONG = "n" * 250  # a Node name of 250 characters: its slice name is cut (core.publish.dra.slice_name)
NO_CLAIM = "carries no authentication.kubernetes.io/node-name claim"
OTHER_NODE = "may write only the ResourceSlice gpu-1-gpu.omaticaya.io with spec.nodeName and spec.pool.name gpu-1, not"
OTHER_DRIVER = "may write only ResourceSlices of driver gpu.omaticaya.io, not ResourceSlice"
SLICE_CASES = [
    # (id, operation, slice, extra, the denials' words in order: [] = allowed)
    ("create-own", "CREATE", slice_of("gpu-1"), CLAIM, []),
    ("update-own", "UPDATE", slice_of("gpu-1"), CLAIM, []),
    ("delete-own", "DELETE", slice_of("gpu-1"), CLAIM, []),
    ("create-own-long-node-name", "CREATE", slice_of(LONG),
     {"authentication.kubernetes.io/node-name": [LONG]}, []),
    ("create-other-node", "CREATE", slice_of("gpu-2"), CLAIM,
     [OTHER_NODE + " gpu-2-gpu.omaticaya.io (spec.nodeName gpu-2, spec.pool.name gpu-2)"]),
    ("update-other-node", "UPDATE", slice_of("gpu-2"), CLAIM, [OTHER_NODE]),
    ("delete-other-node", "DELETE", slice_of("gpu-2"), CLAIM, [OTHER_NODE]),
    ("own-name-other-node", "CREATE", slice_of("gpu-2", name="gpu-1-gpu.omaticaya.io"), CLAIM,
     [OTHER_NODE]),
    ("other-node-own-name-pattern", "CREATE", slice_of("gpu-1", name="gpu-2-gpu.omaticaya.io"),
     CLAIM, [OTHER_NODE + " gpu-2-gpu.omaticaya.io (spec.nodeName gpu-1"]),
    ("own-node-other-pool", "CREATE", slice_of("gpu-1", pool="gpu-2"), CLAIM,
     [OTHER_NODE + " gpu-1-gpu.omaticaya.io (spec.nodeName gpu-1, spec.pool.name gpu-2)"]),
    ("own-node-all-nodes", "CREATE", slice_of("gpu-1", node_name=None), CLAIM,
     [OTHER_NODE + " gpu-1-gpu.omaticaya.io (spec.nodeName , spec.pool.name gpu-1)"]),
    ("long-node-uncut-name", "CREATE", slice_of(LONG, name=LONG + "-" + DRIVER),
     {"authentication.kubernetes.io/node-name": [LONG]}, ["may write only the ResourceSlice"]),
    ("long-node-other-cut", "CREATE", slice_of(LONG, name=LONG[:230] + "-" + DRIVER),
     {"authentication.kubernetes.io/node-name": [LONG]}, ["may write only the ResourceSlice"]),
    # another driver's slice of its own node: only the driver is wrong, or its name too
    ("create-other-driver-own-name", "CREATE", slice_of("gpu-1", driver="gpu.example.com"), CLAIM,
     [OTHER_DRIVER + " gpu-1-gpu.omaticaya.io of driver gpu.example.com"]),
    ("update-other-driver", "UPDATE",
     slice_of("gpu-1", driver="gpu.example.com", name="gpu-1-gpu.example.com"), CLAIM,
     [OTHER_DRIVER + " gpu-1-gpu.example.com of driver gpu.example.com", OTHER_NODE]),
    ("delete-other-driver", "DELETE",
     slice_of("gpu-1", driver="gpu.example.com", name="gpu-1-gpu.example.com"), CLAIM,
     [OTHER_DRIVER, OTHER_NODE]),
    ("lookalike-driver", "CREATE", slice_of("gpu-1", driver="gpu.omaticaya.io.evil.com"), CLAIM,
     [OTHER_DRIVER]),
    # a token without the claim (requireNodeClaim: true, the default): not even its own
    ("no-extra-create", "CREATE", slice_of("gpu-1"), None, [NO_CLAIM]),
    ("no-extra-delete", "DELETE", slice_of("gpu-1"), None, [NO_CLAIM]),
    ("claim-missing", "UPDATE", slice_of("gpu-1"), {"other": ["gpu-1"]}, [NO_CLAIM]),
    ("claim-empty", "CREATE", slice_of("gpu-1"),
     {"authentication.kubernetes.io/node-name": []}, [NO_CLAIM]),
    ("no-claim-other-driver", "DELETE", slice_of("gpu-1", driver="gpu.example.com"), None,
     [OTHER_DRIVER, NO_CLAIM]),
]  # fmt: skip


@pytest.fixture(scope="module")
def slice_vap(helm) -> StringsVap:
    pytest.importorskip("cel_expr_python", reason="cel-expr-python not installed")
    policy, _ = slice_vap_docs(helm)
    return StringsVap(policy)


def test_resourceslice_policy_shape(helm):
    policy, binding = slice_vap_docs(helm)
    spec = policy["spec"]
    assert policy["metadata"]["name"] == f"{RELEASE}-resourceslice-writes"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
         "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["resourceslices"]}
    ]  # fmt: skip
    (cond,) = spec["matchConditions"]
    assert cond["expression"] == f"request.userInfo.username == '{AGENT}'"
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    node_policy, _ = vap_docs(helm)
    assert variables["nodeClaim"] == next(
        v["expression"] for v in node_policy["spec"]["variables"] if v["name"] == "nodeClaim"
    )
    assert variables["slice"] == "object != null ? object : oldObject"
    # core.publish.dra.slice_name: the Node name cut at 253 - len("-gpu.omaticaya.io")
    assert "substring(0, 236)" in variables["own"] and f"'-{DRIVER}'" in variables["own"]
    assert all(v["reason"] == "Forbidden" for v in spec["validations"])


@pytest.mark.parametrize(
    "values",
    [
        {"dra": {"enabled": False}},
        {"validatingAdmissionPolicy": {"enabled": False}},
    ],
    ids=["dra-off", "policies-off"],
)
def test_resourceslice_policy_needs_dra_and_the_policies(helm, values):
    base = {"validatingAdmissionPolicy": {"enabled": True}, "dra": {"enabled": True}}
    docs = render(helm, base | values, "--kube-version", DRA_KUBE)
    names = [d["metadata"]["name"] for d in docs if d["kind"].startswith("ValidatingAdmission")]
    assert not [n for n in names if "resourceslice" in n]
    if values.get("dra"):
        assert len(names) == 4  # node-writes and lease-writes stay


def test_resourceslice_policy_follows_service_account_and_failure_policy(helm):
    policy, _ = slice_vap_docs(
        helm,
        {"serviceAccount": {"name": "agent"},
         "validatingAdmissionPolicy": {"enabled": True, "failurePolicy": "Ignore"}},
    )  # fmt: skip
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Ignore"
    assert spec["matchConditions"][0]["expression"].endswith(f":{NAMESPACE}:agent'")


def test_agent_slice_name_is_what_the_policy_allows():
    from omaticaya_py.core.publish.dra import slice_name

    assert slice_of("gpu-1")["metadata"]["name"] == slice_name("gpu-1") == "gpu-1-gpu.omaticaya.io"
    assert len(slice_name(LONG)) == 253 and slice_of(LONG)["metadata"]["name"] == slice_name(LONG)


@pytest.mark.parametrize(
    ("operation", "slice_", "extra", "denied"),
    [c[1:] for c in SLICE_CASES],
    ids=[c[0] for c in SLICE_CASES],
)
def test_resourceslice_policy_cel(slice_vap, operation, slice_, extra, denied):
    got = slice_vap.slice_denials(operation, slice_, AGENT, extra)
    assert got is not None
    assert len(got) == len(denied), got
    for message, words in zip(got, denied, strict=True):
        assert words in message, got
        assert message.startswith("the omaticaya agent") or message.startswith("without")


@pytest.mark.parametrize("operation", ["CREATE", "UPDATE", "DELETE"])
def test_resourceslice_policy_ignores_other_users(slice_vap, operation):
    """Another driver's, another node's slice, by the uninstall hook's ServiceAccount (its Job
    deletes every slice of the driver), a kubelet or an admin: not matched."""
    foreign = slice_of("gpu-2", driver="gpu.example.com", name="x")
    for user in (
        f"system:serviceaccount:{NAMESPACE}:{RELEASE}-uninstall",
        "system:node:gpu-1",
        "kubernetes-admin",
    ):
        assert slice_vap.slice_denials(operation, foreign, user, CLAIM) is None
        assert slice_vap.slice_denials(operation, slice_of("gpu-2"), user, None) is None


NOT_REQUIRED_CASES = [
    # requireNodeClaim: false: without a claim, a slice of our driver for the node it names
    ("own", "CREATE", slice_of("gpu-1"), None, []),
    ("any-node", "DELETE", slice_of("gpu-2"), None, []),
    ("name-not-its-nodes", "CREATE", slice_of("gpu-2", name="gpu-1-gpu.omaticaya.io"), None,
     ["without the authentication.kubernetes.io/node-name claim the omaticaya agent may write only"
      " a ResourceSlice <node>-gpu.omaticaya.io with spec.nodeName and spec.pool.name <node>,"
      " not gpu-1-gpu.omaticaya.io (spec.nodeName gpu-2, spec.pool.name gpu-2)"]),
    ("pool-not-its-node", "UPDATE", slice_of("gpu-1", pool="gpu-2"), None, ["without the"]),
    ("all-nodes", "CREATE", slice_of("gpu-1", node_name=None), None, ["without the"]),
    ("other-driver", "CREATE", slice_of("gpu-1", driver="gpu.example.com"), None, [OTHER_DRIVER]),
    # a claim still binds it to its node
    ("claim-other-node", "CREATE", slice_of("gpu-2"), CLAIM, [OTHER_NODE]),
    ("claim-own", "DELETE", slice_of("gpu-1"), CLAIM, []),
]  # fmt: skip


@pytest.mark.parametrize(
    ("operation", "slice_", "extra", "denied"),
    [c[1:] for c in NOT_REQUIRED_CASES],
    ids=[c[0] for c in NOT_REQUIRED_CASES],
)
def test_resourceslice_policy_claim_optional(helm, operation, slice_, extra, denied):
    pytest.importorskip("cel_expr_python", reason="cel-expr-python not installed")
    policy, _ = slice_vap_docs(
        helm, {"validatingAdmissionPolicy": {"enabled": True, "requireNodeClaim": False}}
    )
    got = StringsVap(policy).slice_denials(operation, slice_, AGENT, extra)
    assert got is not None and len(got) == len(denied), got
    for message, words in zip(got, denied, strict=True):
        assert words in message, got

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

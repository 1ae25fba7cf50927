"""What the DRA claim tests on the light dev cluster share (tests/dra/test_dra_topology_claims.py,
tests/dra/test_dra_binpack_claims.py): the docs' marked YAML blocks, the chart's DeviceClasses,
and a namespace in which kube-controller-manager's resourceclaim controller's part is played by
the test (the light cluster runs no controller-manager: nothing else turns a pod's
ResourceClaimTemplate into a ResourceClaim, or finalizes a namespace)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from devtools.devcluster.cluster import K8S_VERSION
from tests.chart import render

DOCS = Path(__file__).resolve().parents[2] / "docs" / "dra.md"
#: the annotation the resourceclaim controller puts on a claim it made: the pod's claim name
POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"


def marked_blocks(marker: str) -> dict[str, Any]:
    """The YAML blocks of docs/dra.md marked ``<!-- <marker>: NAME -->``, parsed, by NAME (a
    name marked twice fails)."""
    block = re.compile(rf"^<!-- {re.escape(marker)}: ([a-z0-9-]+) -->\n```yaml\n(.*?)^```",
                       re.M | re.S)  # fmt: skip
    found: dict[str, Any] = {}
    for name, text in block.findall(DOCS.read_text()):
        assert name not in found, f"docs/dra.md marks two blocks {name}"
        found[name] = yaml.safe_load(text)
    return found


def resource_api(admin_client: Any) -> Any:
    """``kubernetes.client.ResourceV1Api`` over ``admin_client``."""
    from kubernetes import client

    return client.ResourceV1Api(admin_client)


def chart_device_classes(helm: dict[str, Any]) -> list[dict[str, Any]]:
    """The chart's DeviceClasses, rendered by the real helm with ``dra.enabled`` for the dev
    cluster's release."""
    docs = render(helm, {"dra": {"enabled": True}}, "--kube-version", K8S_VERSION.lstrip("v"))
    return [d for d in docs if d["kind"] == "DeviceClass"]


def create_device_classes(admin_client: Any, bodies: Iterable[dict[str, Any]]) -> list[str]:
    """Create each DeviceClass; the names created (one of that name already there is left as
    it is, after checking it selects alike)."""
    from kubernetes.client.exceptions import ApiException

    api, created = resource_api(admin_client), []
    for body in bodies:
        try:
            api.create_device_class(body)
            created.append(body["metadata"]["name"])
        except ApiException as exc:
            if exc.status != 409:
                raise
            there = admin_client.sanitize_for_serialization(
                api.read_device_class(body["metadata"]["name"])
            )
            assert there["spec"]["selectors"] == body["spec"]["selectors"], there
    return created


def delete_device_classes(admin_client: Any, names: Iterable[str]) -> None:
    """Delete the DeviceClasses ``names`` (gone already: fine)."""
    from kubernetes.client.exceptions import ApiException

    api = resource_api(admin_client)
    for name in names:
        try:
            api.delete_device_class(name)
        except ApiException:
            pass


class ClaimSpace:
    """A namespace of the test's with its ``default`` ServiceAccount (no controller makes one
    here), the claims the resourceclaim controller would make from a pod's templates
    (``claims_from_templates``), and the cleanup."""

    def __init__(self, admin_client: Any, admin_api: Any, name: str) -> None:
        self.client, self.core, self.name = admin_client, admin_api, name
        self.resource = resource_api(admin_client)
        self.core.create_namespace({"metadata": {"name": name}})
        self.core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})

    def claims_from_templates(self, pod_name: str) -> None:
        """kube-controller-manager's resourceclaim controller, for one pod: each claim of a
        template becomes a ResourceClaim ``<pod>-<claim>-xxxxx`` with the stored template's spec,
        the pod as its controlling owner and the pod's claim name annotated; the names go into the
        pod's ``status.resourceClaimStatuses``."""
        pod = self.core.read_namespaced_pod(pod_name, self.name)
        statuses = []
        for pc in pod.spec.resource_claims or []:
            if not pc.resource_claim_template_name:
                continue
            template = self.client.sanitize_for_serialization(
                self.resource.read_namespaced_resource_claim_template(
                    pc.resource_claim_template_name, self.name
                )
            )
            meta = template["spec"].get("metadata") or {}
            claim = self.resource.create_namespaced_resource_claim(self.name, {
                "metadata": {
                    "generateName": f"{pod_name}-{pc.name}-",
                    "annotations": {**(meta.get("annotations") or {}), POD_CLAIM_NAME: pc.name},
                    "labels": meta.get("labels") or {},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                                         "uid": pod.metadata.uid, "controller": True}],
                },
                "spec": template["spec"]["spec"],
            })  # fmt: skip
            statuses.append({"name": pc.name, "resourceClaimName": claim.metadata.name})
        if statuses:
            self.core.patch_namespaced_pod_status(
                pod_name, self.name, {"status": {"resourceClaimStatuses": statuses}},
                _content_type="application/merge-patch+json")  # fmt: skip

    def why_not(self, pod: str) -> str:
        """The pod's conditions and its events, for a failure's message."""
        p = self.core.read_namespaced_pod(pod, self.name)
        conds = [(c.type, c.status, c.reason, c.message) for c in p.status.conditions or []]
        events = self.core.list_namespaced_event(
            self.name, field_selector=f"involvedObject.name={pod}"
        )
        return f"conditions {conds}, events {[(e.reason, e.message) for e in events.items]}"

    def cleanup(self) -> None:
        """Pods and claims deleted at once (no kubelet, no controller would finish either), the
        templates, the ServiceAccount, then the namespace, finalized as its controller would."""
        from kubernetes.client.exceptions import ApiException

        def quietly(call: Callable[..., Any], *args: Any, **kw: Any) -> None:
            try:
                call(*args, **kw)
            except ApiException:
                pass

        for p in self.core.list_namespaced_pod(self.name).items:
            quietly(self.core.delete_namespaced_pod, p.metadata.name, self.name,
                    grace_period_seconds=0)  # fmt: skip
        for c in self.resource.list_namespaced_resource_claim(self.name).items:
            quietly(self.resource.patch_namespaced_resource_claim, c.metadata.name, self.name,
                    {"metadata": {"finalizers": None}},
                    _content_type="application/merge-patch+json")  # fmt: skip
            quietly(self.resource.delete_namespaced_resource_claim, c.metadata.name, self.name)
        for t in self.resource.list_namespaced_resource_claim_template(self.name).items:
            quietly(self.resource.delete_namespaced_resource_claim_template, t.metadata.name,
                    self.name)  # fmt: skip
        quietly(self.core.delete_namespaced_service_account, "default", self.name)
        quietly(self.core.delete_namespace, self.name)
        quietly(self.core.replace_namespace_finalize, self.name,
                {"metadata": {"name": self.name}, "spec": {"finalizers": []}})  # fmt: skip
        quietly(self.core.delete_namespace, self.name)

"""What other test files share of test_kube_versions.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import yaml

from tests.chart import CHART, NAMESPACE, RELEASE, run_helm

#: The minors the product supports (README, docs/kubernetes-versions.md): Chart.yaml's kubeVersion
#: admits each, and each is rendered and validated against its own schemas below.
SUPPORTED = [f"1.{minor}" for minor in range(31, 38)]


def under_test() -> str:
    """The release under test, as ``helm --kube-version`` takes it (``1.37.2``)."""
    from devtools.devcluster.cluster import K8S_VERSION

    return K8S_VERSION.removeprefix("v")


def render_at(helm, kube_version: str, values: dict | None = None, *, check: bool = True):
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", kube_version]
    if values:
        n = len(list(helm["home"].glob("kv-values-*.yaml")))
        f = helm["home"] / f"kv-values-{n}.yaml"
        f.write_text(yaml.safe_dump(values))
        args += ["-f", str(f)]
    return run_helm(helm, *args, check=check)


def docs_at(helm, kube_version: str, values: dict | None = None) -> list[dict]:
    return [d for d in yaml.safe_load_all(render_at(helm, kube_version, values).stdout) if d]

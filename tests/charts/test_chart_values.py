"""The chart's values: ``values.schema.json`` refuses bad values with helm's error naming the
value, and every value is described in the schema and in docs/chart.md's table. Helpers:
tests/chart.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.chart import CHART, REPO, chart_values, template

# --------------------------------------------------------------------------------------------
# values.schema.json
# --------------------------------------------------------------------------------------------

BAD_VALUES = [
    # (id, values, text expected in helm's error)
    ("perGpuLabels-string", {"perGpuLabels": "yes"}, "/perGpuLabels"),
    ("cleanupOnExit-string-true", {"cleanupOnExit": "true"}, "/cleanupOnExit"),
    ("memoryStepMib-negative", {"memoryStepMib": -1}, "/memoryStepMib"),
    ("memoryStepMib-zero", {"memoryStepMib": 0}, "/memoryStepMib"),
    ("memoryStepMib-string", {"memoryStepMib": "1024"}, "/memoryStepMib"),
    ("memoryStepMib-float", {"memoryStepMib": 1.5}, "/memoryStepMib"),
    ("utilizationStepPct-over-100", {"utilizationStepPct": 101}, "/utilizationStepPct"),
    ("temperatureStepC-too-big", {"temperatureStepC": 51}, "/temperatureStepC"),
    ("hysteresisPct-too-big", {"hysteresisPct": 60}, "/hysteresisPct"),
    ("idleUtilizationPct-negative", {"idleUtilizationPct": -0.5}, "/idleUtilizationPct"),
    ("metricsPort-too-big", {"metricsPort": 70000}, "/metricsPort"),
    ("metricsPort-string", {"metricsPort": "9402"}, "/metricsPort"),
    ("heartbeatS-zero", {"heartbeatS": 0}, "/heartbeatS"),
    ("kubeTimeoutS-negative", {"kubeTimeoutS": -1}, "/kubeTimeoutS"),
    ("xidQuietS-string", {"xidQuietS": "10m"}, "/xidQuietS"),
    ("xidIgnore-string", {"xidIgnore": "13,31"}, "/xidIgnore"),
    ("xidIgnore-item-string", {"xidIgnore": [13, "x"]}, "/xidIgnore/1"),
    ("logLevel-unknown", {"logLevel": "VERBOSE"}, "/logLevel"),
    ("schedule-empty", {"schedule": ""}, "/schedule"),
    ("schedule-number", {"schedule": 10}, "/schedule"),
    ("prefix-not-dns", {"prefix": "Omaticaya_IO"}, "/prefix"),
    ("prefix-nvidia", {"prefix": "nvidia.com"}, "/prefix"),
    ("prefix-kubernetes-subdomain", {"prefix": "feature.node.kubernetes.io"}, "/prefix"),
    ("prefix-k8s", {"prefix": "k8s.io/"}, "/prefix"),
    ("unknown-top-level-key", {"perGpuLabel": True}, "perGpuLabel"),
    ("unknown-nested-key", {"image": {"repo": "x"}}, "repo"),
    ("pullPolicy-unknown", {"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ("updateStrategy-type", {"updateStrategy": {"type": "Recreate"}}, "/updateStrategy/type"),
    (
        "nodeSelector-bool-value",
        {"nodeSelector": {"nvidia.com/gpu.present": True}},
        "/nodeSelector",
    ),
    ("extraEnv-not-list", {"extraEnv": {"A": "b"}}, "/extraEnv"),
    (
        "serviceMonitor-interval",
        {"serviceMonitor": {"interval": "often"}},
        "/serviceMonitor/interval",
    ),
    (
        "vap-enabled-string",
        {"validatingAdmissionPolicy": {"enabled": "yes"}},
        "/validatingAdmissionPolicy/enabled",
    ),
    (
        "vap-failurePolicy",
        {"validatingAdmissionPolicy": {"failurePolicy": "Maybe"}},
        "failurePolicy",
    ),
    ("sharing-gpus-name", {"sharing": {"gpus": "gpu0"}}, "/sharing/gpus"),
    ("sharing-gpus-negative", {"sharing": {"gpus": -1}}, "/sharing/gpus"),
    ("sharing-unitMib-zero", {"sharing": {"unitMib": 0}}, "/sharing/unitMib"),
    ("placement-policy", {"placement": {"policy": "pack"}}, "/placement/policy"),
    ("placement-unknown-key", {"placement": {"strategy": "spread"}}, "strategy"),
    ("placement-settleS-negative", {"placement": {"settleS": -1}}, "/placement/settleS"),
    ("sharing-resource-no-domain", {"sharing": {"resource": "vram"}}, "/sharing/resource"),
    ("sharing-unknown-key", {"sharing": {"gpu": "all"}}, "gpu"),
    ("deviceListStrategy-unknown", {"deviceListStrategy": ["volumes"]}, "/deviceListStrategy"),
    ("deviceListStrategy-empty", {"deviceListStrategy": []}, "/deviceListStrategy"),
    ("deviceListStrategy-string", {"deviceListStrategy": "envvar"}, "/deviceListStrategy"),
]


@pytest.mark.parametrize(
    ("values", "where"), [(v, w) for _, v, w in BAD_VALUES], ids=[i for i, _, _ in BAD_VALUES]
)
def test_schema_rejects_bad_values(helm, values, where):
    proc = template(helm, values, check=False)
    assert proc.returncode != 0, f"helm template accepted {values}"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert where in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--set", "perGpuLabels=yes"],
        ["--set", "metricsPort=70000"],
        ["--set-string", "memoryStepMib=1024"],
        ["--set", "bogus=1"],
    ],
    ids=lambda a: a[1],
)
def test_schema_rejects_bad_set_flags(helm, args):
    proc = template(helm, None, *args, check=False)
    assert proc.returncode != 0 and "schema" in proc.stderr, proc.stderr


def test_root_without_runAsNonRoot_false_fails_with_hint(helm):
    proc = template(helm, {"securityContext": {"runAsUser": 0}}, check=False)
    assert proc.returncode != 0
    assert "securityContext.runAsNonRoot=false" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------------------------
# docs/chart.md and values.schema.json cover every value
# --------------------------------------------------------------------------------------------

#: Values whose children are chart options (documented one by one), not Kubernetes objects.
STRUCTURED = (
    "image",
    "serviceAccount",
    "rbac",
    "service",
    "serviceMonitor",
    "podMonitor",
    "grafanaDashboard",
    "prometheusRule",
    "validatingAdmissionPolicy",
    "placement",
    "devicePlugin",
    "sharing",
    "dra",
)


def test_docs_table_lists_every_value():
    docs = (REPO / "docs" / "chart.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", docs, re.MULTILINE))
    values = chart_values()
    expected = set()
    for key, value in values.items():
        if key in STRUCTURED:
            expected |= {f"{key}.{child}" for child in value}
        elif key in ("livenessProbe", "readinessProbe"):
            expected.add(f"{key}.enabled")
        else:
            expected.add(key)
    assert expected <= documented, f"not in docs/chart.md: {sorted(expected - documented)}"
    assert documented <= expected, f"documented but not values: {sorted(documented - expected)}"


def test_schema_describes_every_value():
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    for key, value in chart_values().items():
        assert key in props, f"values.schema.json lacks {key}"
        if key in STRUCTURED:
            sub = props[key]
            if "$ref" in sub:
                sub = schema["definitions"][sub["$ref"].rsplit("/", 1)[1]]
            assert sub.get("additionalProperties") is False, key
            assert set(value) <= set(sub["properties"]), key


#: keys the schema allows that values.yaml leaves out on purpose: helm's own ``global``, and the
#: DaemonSet's ``rollingUpdate.maxSurge`` (Kubernetes' default, 0, unless set)
SCHEMA_ONLY = {"global", "updateStrategy.rollingUpdate.maxSurge"}


def schema_only_keys(schema: dict[str, Any], values: Any, path: str = "") -> list[str]:
    """The dotted paths the schema's ``properties`` name (recursively) that ``values`` lacks,
    except those whose description says they were removed (the render fails on them)."""
    out: list[str] = []
    for key, sub in (schema.get("properties") or {}).items():
        at = f"{path}.{key}" if path else key
        if not isinstance(values, dict) or key not in values:
            if not str(sub.get("description", "")).startswith("Removed"):
                out.append(at)
        elif "properties" in sub:
            out += schema_only_keys(sub, values[key], at)
    return out


def test_every_key_the_schema_allows_is_a_value_of_the_chart():
    """A key only the schema knows is one a user can set and nothing reads (a stray copy of
    sharing.mps under scheduler.extender once let ``scheduler.extender.mps.root`` pass and do
    nothing)."""
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema_only_keys(schema, chart_values())) == SCHEMA_ONLY


def test_a_key_in_the_wrong_section_is_refused(helm):
    proc = template(helm, {"scheduler": {"extender": {"mps": {"root": "/run/a/b"}}}}, check=False)
    assert proc.returncode != 0 and "schema" in proc.stderr, proc.stderr
    assert "mps" in proc.stderr, proc.stderr

"""What other test files share of test_dra_prepare.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import re
from typing import Any

# the rules of tags.cncf.io/container-device-interface v1.1.1 (pkg/parser, pkg/cdi), which
# containerd 2.4.2 vendors
_VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")


_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")


def check_cdi(spec: dict[str, Any]) -> None:
    """A CDI spec as the CDI library v1.1.1 validates it (spec.go validate, version.go,
    container-edits.go)."""
    assert set(spec) <= {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
    assert spec["cdiVersion"] in _VERSIONS
    vendor, _, cls = spec["kind"].partition("/")
    assert _VENDOR.match(vendor) and _VENDOR.match(cls)
    minimum = "0.3.0"
    if "." in cls:
        minimum = "0.6.0"
    names = [d["name"] for d in spec["devices"]]
    assert names and len(set(names)) == len(names)
    for d in spec["devices"]:
        assert set(d) <= {"name", "annotations", "containerEdits"}
        assert _DEVICE.match(d["name"]), d["name"]
        edits = d["containerEdits"]
        assert set(edits) <= {"env", "deviceNodes", "mounts", "hooks"}
        if d["name"][0].isdigit():
            minimum = max(minimum, "0.5.0")
        for e in edits.get("env", []):
            assert e.index("=") > 0
        for n in edits.get("deviceNodes", []):
            assert n["path"].startswith("/") and n.get("type", "") in ("", "b", "c", "u", "p")
            assert set(n) <= {"path", "hostPath", "type", "major", "minor", "fileMode",
                              "permissions", "uid", "gid"}
            if n.get("hostPath"):
                minimum = max(minimum, "0.5.0")
        for m in edits.get("mounts", []):
            assert m["hostPath"] and m["containerPath"]
            assert set(m) <= {"hostPath", "containerPath", "options", "type"}
            if m.get("type"):
                minimum = max(minimum, "0.4.0")
    assert _VERSIONS.index(spec["cdiVersion"]) >= _VERSIONS.index(minimum)

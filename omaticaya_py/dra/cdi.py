"""The claims' CDI specs (Container Device Interface): one file per prepared claim in
``OMATICAYA_DRA_CDI_DIR`` (``cdi_file_name``), one CDI device per prepared device
(``gpu.omaticaya.io/claim=<claim UID>-<device name>``, ``cdi_device_name``) with the
``containerEdits`` containerd 2 / CRI-O inject: env, device nodes (``DevNode``), mounts
(``Edits``); a claim's spec-wide edits (``common_edits``: the NVIDIA driver's files, read-only
mounts, once per claim whatever its number of devices). Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.allocation.mps import Mount
from ..core.publish.dra import DRIVER

__all__ = [
    "CDI_CLASS",
    "CDI_KIND",
    "CDI_VENDOR",
    "CDI_VERSION",
    "DevNode",
    "Edits",
    "cdi_device",
    "cdi_device_name",
    "common_edits",
    "cdi_file_name",
    "spec_bytes",
]

#: the CDI spec version written: 0.5.0 allows device names that start with a digit (claim UIDs
#: do) and host paths of device nodes; 0.6.0 is what containerd 2's CDI library (v1.1.x) and
#: CRI-O accept alike
CDI_VERSION = "0.6.0"
CDI_VENDOR = DRIVER
CDI_CLASS = "claim"
#: every prepared claim's CDI devices are ``gpu.omaticaya.io/claim=<claim UID>-<device name>``
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"


@dataclass(frozen=True, slots=True)
class DevNode:
    """A device node found under the dev root: ``name`` (``nvidia0``, ``nvidiactl``),
    ``type`` (``c``), ``major``, ``minor``."""

    name: str
    type: str
    major: int
    minor: int


@dataclass(frozen=True, slots=True)
class Edits:
    """One CDI device's ``containerEdits``: ``env`` (``NAME=value``), ``nodes`` (device nodes
    under the dev root), ``mounts``."""

    env: tuple[str, ...] = ()
    nodes: tuple[DevNode, ...] = ()
    mounts: tuple[Mount, ...] = ()


def cdi_device_name(claim_uid: str, device: str) -> str:
    """``<claim UID>-<device name>``: a CDI device name (letters, digits, ``-``)."""
    return f"{claim_uid}-{device}"


def cdi_file_name(claim_uid: str) -> str:
    """The claim's CDI spec file in the CDI folder: ``gpu.omaticaya.io-claim_<uid>.json``."""
    return f"{CDI_VENDOR}-{CDI_CLASS}_{claim_uid}.json"


def cdi_device(name: str, edits: Edits, dev_root: Path = Path("/dev")) -> dict[str, Any]:
    """One CDI device (JSON-ready): ``name`` and its ``containerEdits`` (device nodes at
    ``/dev/<name>`` from the host's ``/dev/<name>``; ``dev_root``: the host's /dev as the
    runtime sees it, ``/dev`` but in tests; mounts read-only or not, ``nosuid,nodev,bind``)."""
    out: dict[str, Any] = {"env": list(edits.env)}
    if edits.nodes:
        out["deviceNodes"] = [
            {"path": f"/dev/{n.name}", "hostPath": str(dev_root / n.name), "type": n.type,
             "major": n.major, "minor": n.minor}
            for n in edits.nodes
        ]  # fmt: skip
    if edits.mounts:
        out["mounts"] = _mounts(edits.mounts)
    return {"name": name, "containerEdits": out}


def _mounts(mounts: tuple[Mount, ...]) -> list[dict[str, Any]]:
    """CDI mounts (JSON-ready): bind mounts, read-only or not, ``nosuid,nodev``."""
    return [
        {"hostPath": m.host_path, "containerPath": m.container_path,
         "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"]}
        for m in mounts
    ]  # fmt: skip


def common_edits(mounts: tuple[Mount, ...]) -> dict[str, Any]:
    """A spec's own ``containerEdits`` (JSON-ready), applied once to a container that gets any
    of the spec's devices (the CDI library applies a spec's edits before its devices'; a mount
    at a container path already mounted replaces it, so two claims' specs with the same files
    are fine): ``mounts``, or ``{}``."""
    return {"mounts": _mounts(mounts)} if mounts else {}


def spec_bytes(spec: Mapping[str, Any]) -> bytes:
    """A CDI spec as its file's bytes (indented JSON, a final newline)."""
    return (json.dumps(spec, indent=2, sort_keys=True) + "\n").encode()

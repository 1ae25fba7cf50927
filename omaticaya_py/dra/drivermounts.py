"""The NVIDIA driver's files a prepared claim's containers get, as read-only bind mounts: pure,
from what ``omaticaya-driver-files`` (``cmd/driverfiles``: the NVIDIA container toolkit's own
CDI generation, ``pkg/nvcdi``) prints for the node's driver root.

The tool prints the common ``containerEdits`` of the spec the toolkit would generate: ``mounts``
(the driver's libraries of its version, its binaries, IPC sockets, GSP firmware, graphics
files; ``hostPath`` already under the host's driver root, ``containerPath`` the toolkit's: the
root stripped) and one hook, ``create-symlinks``, whose ``--link <target>::<link>`` arguments
name the links the toolkit would make in the container (each library's SONAME,
``libcuda.so.1``, and its ``.so`` name, ``libcuda.so``). ``driver_mounts`` turns that into
mounts that need no hook:

- each of the toolkit's mounts, read-only, at its container path; left out: the toolkit's
  marker ``/dev/null`` (its ``NVIDIA_VISIBLE_DEVICES=void`` mount), a host path outside the
  host's driver root, the MPS pipe folder ``/tmp/nvidia-mps`` (MPS is this project's own:
  ``core.allocation.mps``; a claim never becomes the client of a host-wide daemon);
- each link, as a second read-only mount of the file it resolves to (a link's target relative
  to the link's folder, followed through other links, at most ``MAX_HOPS``) at the link's path:
  the dynamic loader finds ``libcuda.so.1`` as a file in the folder it searches by default
  (``/usr/lib/x86_64-linux-gnu`` on Debian and Ubuntu, ``/usr/lib64`` on RHEL), without the
  ``update-ldcache`` hook's ldconfig; a link whose target is no mounted file is left out;
- no env (``NVIDIA_VISIBLE_DEVICES=void`` would undo this driver's variable;
  ``NVIDIA_CTK_LIBCUDA_DIR`` is for a hook), no device nodes (``prepare`` gives each device its
  own), no hooks.

``driver_version``: the tool's ``driverVersion``, else the toolkit's rule on the mounts' names
(the suffix of ``libcuda.so.<version>``, else of ``libnvidia-ml.so.<version>``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.allocation.mps import Mount

__all__ = ["MAX_HOPS", "SKIPPED_PATHS", "DriverMounts", "driver_mounts", "driver_version", "links"]

#: links followed from one link to the file it names, at most
MAX_HOPS = 8
#: container paths never mounted from the driver root: the MPS pipe folder (this project runs
#: its own daemons, one per slice)
SKIPPED_PATHS = ("/tmp/nvidia-mps",)
#: the toolkit's marker mount of /dev/null (with NVIDIA_VISIBLE_DEVICES=void): no driver file
_MARKER_HOST_PATH = "/dev/null"
#: the versioned libraries the toolkit infers the driver's version from, in its order
_VERSIONED = ("libcuda.so.", "libnvidia-ml.so.")


@dataclass(frozen=True, slots=True)
class DriverMounts:
    """The driver's files as mounts: ``version`` (``""``: unknown), ``mounts`` (read-only, by
    container path), ``skipped`` (what was left out and why, one line each: the log's)."""

    version: str
    mounts: tuple[Mount, ...]
    skipped: tuple[str, ...] = ()


def _under(path: str, root: str) -> bool:
    root = posixpath.normpath(root)
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def links(hooks: Sequence[Any]) -> list[tuple[str, str]]:
    """``(target, link)`` of each ``--link <target>::<link>`` of the ``create-symlinks`` hooks
    among ``hooks`` (CDI hooks: ``args`` a list of strings), in order. Raises ``ValueError`` for
    a hook or link that is malformed."""
    out: list[tuple[str, str]] = []
    for hook in hooks:
        if not isinstance(hook, Mapping) or not isinstance(hook.get("args", []), list):
            raise ValueError(f"containerEdits.hooks: not a CDI hook: {hook!r:.80}")
        args = [str(a) for a in hook.get("args") or []]
        if "create-symlinks" not in args:
            continue
        for i, arg in enumerate(args):
            if arg == "--link" and i + 1 < len(args):
                target, sep, link = args[i + 1].partition("::")
                if not sep or not target or not link.startswith("/"):
                    raise ValueError(f"create-symlinks: --link {args[i + 1]!r:.120}: expected "
                                     "<target>::<absolute link path>")  # fmt: skip
                out.append((target, posixpath.normpath(link)))
    return out


def driver_version(doc_version: str, mounts: Sequence[Mount]) -> str:
    """``doc_version`` when given, else the suffix of the first ``libcuda.so.<version>`` among
    ``mounts``' container paths, else of ``libnvidia-ml.so.<version>``, else ``""``."""
    if doc_version:
        return doc_version
    for prefix in _VERSIONED:
        for m in mounts:
            name = posixpath.basename(m.container_path)
            if name.startswith(prefix) and name[len(prefix):].count(".") >= 1:
                return name[len(prefix):]
    return ""


def _mounts(raw: Any, host_root: str, skipped: list[str]) -> dict[str, Mount]:
    """The toolkit's mounts kept, by container path (``driver_mounts``' rules)."""
    if not isinstance(raw, list):
        raise ValueError("containerEdits.mounts: expected a list")
    by_path: dict[str, Mount] = {}
    for m in raw:
        if not isinstance(m, Mapping) or not isinstance(m.get("hostPath"), str) \
                or not isinstance(m.get("containerPath"), str):  # fmt: skip
            raise ValueError(f"containerEdits.mounts: not a CDI mount: {m!r:.120}")
        host, path = posixpath.normpath(m["hostPath"]), posixpath.normpath(m["containerPath"])
        if not path.startswith("/"):
            raise ValueError(f"containerEdits.mounts: containerPath {path!r:.120}: not absolute")
        if host == _MARKER_HOST_PATH:
            continue
        if not _under(host, host_root):
            skipped.append(f"{host} -> {path}: not under the host's driver root {host_root}")
        elif any(_under(path, s) for s in SKIPPED_PATHS):
            skipped.append(f"{host} -> {path}: the MPS pipe folder (MPS is this driver's own)")
        else:
            by_path.setdefault(path, Mount(path, host, read_only=True))
    return by_path


def _resolve(link: str, target: str, files: Mapping[str, Mount], named: Mapping[str, str]) -> Mount | None:
    """The mounted file ``link`` names through ``target`` (and other links), or ``None``."""
    for _ in range(MAX_HOPS):
        path = posixpath.normpath(target if target.startswith("/") else
                                  posixpath.join(posixpath.dirname(link), target))  # fmt: skip
        if path in files:
            return files[path]
        if path not in named:
            return None
        link, target = path, named[path]
    return None


def driver_mounts(doc: Mapping[str, Any]) -> DriverMounts:
    """The mounts of the tool's output ``doc`` (``{"hostDriverRoot", "driverVersion",
    "containerEdits": {"mounts", "hooks", ...}}``), read-only, sorted by container path, each
    container path once. Raises ``ValueError`` for a ``doc`` that is not the tool's output."""
    host_root = doc.get("hostDriverRoot")
    if not isinstance(host_root, str) or not host_root.startswith("/"):
        raise ValueError("hostDriverRoot: expected an absolute path")
    edits = doc.get("containerEdits")
    if not isinstance(edits, Mapping):
        raise ValueError("containerEdits: expected an object")
    skipped: list[str] = []
    raw = edits.get("mounts")
    files = _mounts([] if raw is None else raw, host_root, skipped)
    hooks = edits.get("hooks")
    hooks = [] if hooks is None else hooks
    if not isinstance(hooks, list):
        raise ValueError("containerEdits.hooks: expected a list")
    named = dict((link, target) for target, link in links(hooks))
    out = dict(files)
    for link, target in named.items():
        if link in out:
            continue
        found = _resolve(link, target, files, named)
        if found is None:
            skipped.append(f"link {link} -> {target}: names no file of the driver's")
        else:
            out[link] = Mount(link, found.host_path, read_only=True)
    mounts = tuple(out[p] for p in sorted(out))
    version = doc.get("driverVersion") or ""
    if not isinstance(version, str):
        raise ValueError("driverVersion: expected a string")
    return DriverMounts(driver_version(version, mounts), mounts, tuple(skipped))

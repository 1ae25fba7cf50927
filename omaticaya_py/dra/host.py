"""The DRA plugin's files on the node: the NVIDIA device nodes and minors it finds, the CDI spec
files it writes, and its checkpoint of prepared claims.

- ``device_nodes(dev_root, names)``: the character devices found under the dev root
  (``OMATICAYA_DRA_DEV_ROOT``), as ``prepare.DevNode``.
- ``gpu_minors(proc_root)``: GPU UUID -> device minor from
  ``<proc_root>/driver/nvidia/gpus/*/information`` (its ``GPU UUID:`` and ``Device Minor:``
  lines); empty when unreadable (prepare then takes a GPU's index as its minor).
- ``write_atomic`` (``sources.files``): a file replaced whole (a temporary ``.<name>.tmp``
  in the same folder, fsync, rename), so a reader (containerd's CDI cache, a restarted
  plugin) never sees half.
- ``Checkpoint``: ``<plugin dir>/checkpoint.json``, claim UID -> what was prepared (the
  kubelet's answer and the CDI spec written), so that preparing again answers the same and a
  restarted plugin can unprepare what it prepared before. A corrupt file is logged and moved
  aside (``checkpoint.json.corrupt-<time>``), not fatal. Each device records the UUID it was
  prepared on, which every later prepare of the claim checks (``check_checkpointed``).
- ``load_indices`` / ``save_indices``: ``<plugin dir>/gpu-indices.json``, each GPU's NVML index
  -> UUID at the plugin's last start, beside the checkpoint: an ``OMATICAYA_SHARED_GPUS``
  index that names another GPU than it did then is reported (``core.model.sharing.moved_indices``).
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from ..core.publish.dra import DraDevice
from ..sources import gpu_indices
from ..sources.files import write_atomic
from .cdi import DevNode
from .resourceclaim import Refused

__all__ = [
    "CHECKPOINT_FILE",
    "INDICES_FILE",
    "Checkpoint",
    "Entry",
    "check_checkpointed",
    "device_nodes",
    "gpu_minors",
    "load_indices",
    "save_indices",
    "write_atomic",
]

CHECKPOINT_FILE = "checkpoint.json"
#: each GPU's NVML index -> UUID at the last start, beside the checkpoint
INDICES_FILE = "gpu-indices.json"
#: the checkpoint's format version
CHECKPOINT_VERSION = 1

_UUID_LINE = re.compile(r"^GPU UUID:\s*(\S+)\s*$", re.MULTILINE)
_MINOR_LINE = re.compile(r"^Device Minor:\s*(\d+)\s*$", re.MULTILINE)


def device_nodes(dev_root: Path, names: Iterable[str]) -> dict[str, DevNode]:
    """Each of ``names`` (``nvidia0``, ``nvidiactl``) that is a character device under
    ``dev_root`` (a symbolic link to one counts: its target's numbers), by name."""
    found = {}
    for name in names:
        try:
            st = os.stat(dev_root / name)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode):
            found[name] = DevNode(name, "c", os.major(st.st_rdev), os.minor(st.st_rdev))
    return found


def gpu_minors(proc_root: Path | None) -> dict[str, int]:
    """GPU UUID -> device minor (``/dev/nvidia<minor>``) from the driver's
    ``<proc_root>/driver/nvidia/gpus/<PCI address>/information`` files (``proc_root``: the
    host's /proc, ``OMATICAYA_PROC_ROOT``; ``None``: /proc). Unreadable files are skipped."""
    base = (proc_root or Path("/proc")) / "driver" / "nvidia" / "gpus"
    out: dict[str, int] = {}
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return out
    for entry in entries:
        try:
            text = (entry / "information").read_text(encoding="utf-8", errors="replace")[:8192]
        except OSError:
            continue
        uuid, minor = _UUID_LINE.search(text), _MINOR_LINE.search(text)
        if uuid and minor:
            out[uuid.group(1)] = int(minor.group(1))
    return out


def remove(path: Path) -> None:
    """Remove ``path``; one already gone is fine. Raises other ``OSError``."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass


@dataclass(frozen=True, slots=True)
class Entry:
    """One prepared claim in the checkpoint: ``namespace``, ``name``, the kubelet's answer
    (``devices``: ``request_names``, ``pool_name``, ``device_name``, ``cdi_device_ids``,
    ``share_id`` each, and ``uuid``: the device's UUID when prepared, ``nvmlDeviceGetUUID``;
    absent in entries written before it was recorded), the CDI ``spec`` written and its
    ``cdi_file`` (a file name in the CDI folder; ``None``: no device of ours, no file)."""

    namespace: str
    name: str
    devices: tuple[Mapping[str, Any], ...]
    spec: Mapping[str, Any] | None
    cdi_file: str | None

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "devices": list(self.devices),
                "spec": self.spec, "cdi_file": self.cdi_file}  # fmt: skip

    @classmethod
    def from_json(cls, doc: Any) -> Entry:
        """Raises ``ValueError`` for an entry that is not one."""
        if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
            raise ValueError("not a checkpoint entry")
        cdi_file = doc.get("cdi_file")
        if cdi_file is not None and (not isinstance(cdi_file, str) or "/" in cdi_file):
            raise ValueError(f"bad cdi_file {cdi_file!r:.64}")
        spec = doc.get("spec")
        if spec is not None and not isinstance(spec, dict):
            raise ValueError("spec: not an object")
        for d in doc["devices"]:
            if not isinstance(d, dict) or not isinstance(d.get("device_name"), str):
                raise ValueError("devices: not a list of devices")
        return cls(str(doc.get("namespace", "")), str(doc.get("name", "")),
                   tuple(doc["devices"]), spec, cdi_file)  # fmt: skip


class Checkpoint:
    """The prepared claims, kept in ``<folder>/checkpoint.json`` (``{"version": 1, "claims":
    {uid: Entry}}``), written whole after each change. Not thread-safe: the plugin holds its
    lock around each use."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / CHECKPOINT_FILE
        self.claims: dict[str, Entry] = {}

    def load(self) -> None:
        """Read the file (none: empty). A file that cannot be parsed is moved aside with an
        error logged, and the checkpoint starts empty."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self.claims = {}
            return
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("version") != CHECKPOINT_VERSION:
                raise ValueError(f"not a version {CHECKPOINT_VERSION} checkpoint")
            claims = doc.get("claims")
            if not isinstance(claims, dict):
                raise ValueError("claims: not an object")
            self.claims = {str(uid): Entry.from_json(e) for uid, e in claims.items()}
        except (ValueError, UnicodeDecodeError) as exc:
            aside = self.path.with_name(f"{CHECKPOINT_FILE}.corrupt-{time.time_ns()}")
            logger.error("DRA plugin: checkpoint {} is corrupt ({}): moved to {}; the claims it "
                         "held are forgotten (their CDI specs stay until unprepared)",
                         self.path, exc, aside)  # fmt: skip
            try:
                os.replace(self.path, aside)
            except OSError as move:
                logger.error("DRA plugin: cannot move {} aside: {}", self.path, move)
            self.claims = {}

    def save(self) -> None:
        """Write the file whole (``write_atomic``). Raises ``OSError``."""
        doc = {"version": CHECKPOINT_VERSION,
               "claims": {uid: e.to_json() for uid, e in sorted(self.claims.items())}}  # fmt: skip
        write_atomic(self.path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode(), mode=0o600)


def load_indices(folder: Path) -> dict[int, str]:
    """``<folder>/gpu-indices.json`` (``core.model.sharing.INDICES_FORM``): each GPU's NVML index ->
    UUID at the last start; empty when there is none or it is unreadable
    (``sources.gpu_indices.load_indices``, the device plugin's too)."""
    return gpu_indices.load_indices(Path(folder) / INDICES_FILE)


def save_indices(folder: Path, gpus: Mapping[int, str]) -> None:
    """Write ``<folder>/gpu-indices.json`` whole with ``gpus`` (NVML index -> UUID;
    ``sources.gpu_indices.save_indices``). Raises ``OSError``."""
    gpu_indices.save_indices(Path(folder) / INDICES_FILE, gpus)


def check_checkpointed(entries: Sequence[Mapping[str, Any]], devices: Sequence[DraDevice] | None,
                       no_reading: str = "") -> None:  # fmt: skip
    """Check a claim answered from the checkpoint against the node's devices now: each of its
    ``entries`` (the checkpoint's devices: ``device_name`` and the ``uuid`` prepared) must be a
    device of ``devices`` (``core.publish.dra.inventory`` of the latest reading; ``None``: no usable
    reading, ``no_reading`` says why) whose UUID is still the one prepared. Raises ``Refused``
    naming the device and both UUIDs otherwise: the GPU is gone (a reboot that lost it), the
    name now stands for another device, an entry without a UUID (written before UUIDs were
    recorded), or no reading to check by; the caller then answers the error and writes no CDI
    spec (a claim is never moved onto another GPU)."""
    if devices is None:
        raise Refused("cannot check the prepared claim's GPUs against the node's: "
                      + (no_reading or "no reading of the GPUs yet"))  # fmt: skip
    known = {d.name: d for d in devices}
    for e in entries:
        name, uuid = e.get("device_name"), e.get("uuid")
        if not isinstance(uuid, str) or not uuid:
            raise Refused(f"device {name!r:.64} of the prepared claim has no UUID in the "
                          "checkpoint (prepared by an older version): unprepare it and prepare "
                          "it again")  # fmt: skip
        dev = known.get(name) if isinstance(name, str) else None
        if dev is None:
            raise Refused(f"device {name!r:.64} (GPU {uuid:.64}) prepared for this claim is no "
                          "longer on this node (lost at a reboot, or repartitioned): not "
                          "prepared again on another GPU")  # fmt: skip
        if dev.uuid != uuid:
            raise Refused(f"device {name:.64} was {uuid:.64} when prepared and is {dev.uuid} now: "
                          "not prepared again on another GPU")  # fmt: skip

"""CUDA MPS enforcement of slices: where each shared GPU's MPS control daemon lives, what a slice
container is given to become its client, and what the supervisor says of each daemon.

One MPS control daemon per shared GPU (``nvidia-cuda-mps-control -f`` with
``CUDA_VISIBLE_DEVICES`` the GPU's UUID), run by the supervisor (``omaticaya mps``, the chart's
``mps`` container), under one host root (``OMATICAYA_MPS_ROOT``, ``/run/omaticaya/mps``):

- ``<root>/shm``: a tmpfs, the ``/dev/shm`` of every daemon and of every client container (MPS
  clients and their server talk through shared memory);
- ``<root>/<GPU UUID>/pipe``: the daemon's ``CUDA_MPS_PIPE_DIRECTORY`` (its control socket and
  its server's), mounted in each client container at the same path;
- ``<root>/<GPU UUID>/log``: its ``CUDA_MPS_LOG_DIRECTORY``.

The supervisor writes each daemon's state (``DaemonState``, JSON) to ``<state dir>/<GPU
UUID>.json`` (``OMATICAYA_MPS_STATE_DIR``: a folder the pod's two containers share), with a
heartbeat each check; the device plugin reads it (``read_state``) and serves a shared GPU's
units only while its daemon is up and the heartbeat fresh (``enforced``). A state that is
missing, unreadable, or stale counts as down: fail closed.

Why the client's limit is in its environment and the daemon's default is the whole GPU: a
client's ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` can only lower the limit the control daemon sets
(NVIDIA's MPS documentation, "Environment Variables"), so the daemon's default must not be
below the largest slice (``default_limit_mib``: every unit of the GPU), and each client gets
exactly its slice (``client_spec``).

Pure: no I/O but what the callers pass in (the supervisor writes, the device plugin reads).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "ACTIVE_THREAD_ENV",
    "DEFAULT_ROOT",
    "DEFAULT_STATE_DIR",
    "DOWN",
    "LIMIT_ENV",
    "MISSING",
    "MPS_LIMIT_ENV",
    "PIPE_ENV",
    "LOG_ENV",
    "STALE",
    "STARTING",
    "UNREADABLE",
    "UP",
    "ClientSpec",
    "DaemonState",
    "Layout",
    "Mount",
    "client_spec",
    "default_limit_mib",
    "enforced",
    "limit_value",
    "parse_state",
    "state_json",
    "thread_pct",
]

#: the host root of the daemons' folders and the shared-memory tmpfs (``OMATICAYA_MPS_ROOT``)
DEFAULT_ROOT = Path("/run/omaticaya/mps")
#: the folder the supervisor writes its daemons' states to (``OMATICAYA_MPS_STATE_DIR``)
DEFAULT_STATE_DIR = Path("/run/omaticaya-mps-state")

#: CUDA's environment for an MPS client (and its control daemon)
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
MPS_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ACTIVE_THREAD_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
#: the slice's size for frameworks that size themselves (vLLM, PyTorch's caching allocator)
LIMIT_ENV = "OMATICAYA_GPU_MEMORY_LIMIT_MIB"

#: a daemon's states, as the supervisor writes them
UP = "up"
STARTING = "starting"
DOWN = "down"
#: and as the device plugin reads them when the file does not say "up" in time
MISSING = "mps-state-missing"
UNREADABLE = "mps-state-unreadable"
STALE = "mps-state-stale"

_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{1,80}$")
#: the root's longest path, bytes: ``<root>/<40-byte GPU UUID>/pipe/control_privileged`` (the
#: longest socket name of a daemon's pipe folder) within a unix socket path's 107 bytes
MAX_ROOT_BYTES = 42
#: at most this many bytes of a state file are read (it is a few hundred)
MAX_STATE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the daemons live: ``root`` on the host (``OMATICAYA_MPS_ROOT``; the same path in the
    supervisor's container and in each client container) and ``state_dir`` where their states
    are written (``OMATICAYA_MPS_STATE_DIR``). Raises ``ValueError`` for a relative path."""

    root: Path = DEFAULT_ROOT
    state_dir: Path = DEFAULT_STATE_DIR

    def __post_init__(self) -> None:
        for name, path in (
            ("OMATICAYA_MPS_ROOT", self.root),
            ("OMATICAYA_MPS_STATE_DIR", self.state_dir),
        ):
            if not path.is_absolute() or ".." in path.parts:
                raise ValueError(
                    f"{name}: expected an absolute folder path without '..'; got {str(path)!r}"
                )
        if len(str(self.root).encode()) > MAX_ROOT_BYTES:
            raise ValueError(
                f"OMATICAYA_MPS_ROOT: at most {MAX_ROOT_BYTES} bytes (a unix socket's path is at "
                f"most 107, and the daemons' sockets are <root>/<GPU UUID>/pipe/...); got "
                f"{len(str(self.root).encode())}: {str(self.root)[:96]!r}"
            )

    @property
    def shm(self) -> Path:
        """The shared-memory tmpfs: every daemon's and client's ``/dev/shm``."""
        return self.root / "shm"

    def gpu_dir(self, uuid: str) -> Path:
        """One GPU's folder, ``<root>/<GPU UUID>``. Raises ``ValueError`` for a UUID that is no
        GPU or MIG UUID (it becomes a path)."""
        if not _UUID.match(uuid):
            raise ValueError(f"not a GPU UUID: {uuid[:96]!r}")
        return self.root / uuid

    def pipe(self, uuid: str) -> Path:
        """The daemon's ``CUDA_MPS_PIPE_DIRECTORY``."""
        return self.gpu_dir(uuid) / "pipe"

    def log(self, uuid: str) -> Path:
        """The daemon's ``CUDA_MPS_LOG_DIRECTORY``."""
        return self.gpu_dir(uuid) / "log"

    def state(self, uuid: str) -> Path:
        """The daemon's state file, ``<state_dir>/<GPU UUID>.json``."""
        self.gpu_dir(uuid)  # the same check
        return self.state_dir / f"{uuid}.json"


@dataclass(frozen=True, slots=True)
class Mount:
    """One bind mount of a client container: ``host_path`` at ``container_path``."""

    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """What ``Allocate`` adds to a slice container to make it an MPS client of its GPU's daemon:
    ``envs`` (the pipe folder, the pinned-memory limit of exactly the slice on device 0, the
    slice's MiB for frameworks, and, with the thread share on, its active-thread percentage)
    and ``mounts`` (the pipe folder at its own path, the shared-memory tmpfs at
    ``/dev/shm``)."""

    envs: Mapping[str, str]
    mounts: tuple[Mount, ...]


def limit_value(mib: int) -> str:
    """A pinned-memory limit as MPS reads it: ``<N>M`` (MiB). Raises ``ValueError`` below 1."""
    if mib < 1:
        raise ValueError(f"a pinned-memory limit of at least 1 MiB; got {mib}")
    return f"{mib}M"


def default_limit_mib(units: int, unit_mib: int) -> int:
    """The daemon's default pinned-memory limit per client, MiB: every unit of its GPU (a
    client's own limit can only lower it, so it must hold the largest slice); at least one
    unit."""
    return max(units, 1) * unit_mib


def thread_pct(units: int, total_units: int) -> int:
    """The compute share of a slice of ``units`` of a GPU's ``total_units``, percent: rounded
    up, 1 to 100 (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``; MPS rounds it to the SMs it can
    give)."""
    if total_units <= 0:
        return 100
    return min(100, max(1, math.ceil(100 * units / total_units)))


def client_spec(layout: Layout, gpu_uuid: str, units: int, unit_mib: int, *,
                total_units: int | None = None) -> ClientSpec:  # fmt: skip
    """The client answer for a slice of ``units`` x ``unit_mib`` MiB on ``gpu_uuid``: see
    ``ClientSpec``. ``total_units`` set (the GPU's unit count): the active-thread percentage
    proportional to the slice too (``thread_pct``; ``OMATICAYA_MPS_THREAD_SHARE``). The
    container sees only its GPU, as device 0. Raises ``ValueError`` for a bad UUID or an empty
    slice."""
    mib = units * unit_mib
    pipe = str(layout.pipe(gpu_uuid))
    envs = {PIPE_ENV: pipe, MPS_LIMIT_ENV: f"0={limit_value(mib)}", LIMIT_ENV: str(mib)}
    if total_units is not None:
        envs[ACTIVE_THREAD_ENV] = str(thread_pct(units, total_units))
    mounts = (Mount(pipe, pipe), Mount("/dev/shm", str(layout.shm)))
    return ClientSpec(envs, mounts)


@dataclass(frozen=True, slots=True)
class DaemonState:
    """One daemon as the supervisor last saw it: GPU ``uuid`` and ``index``; ``state``
    (``UP``: it answers its control socket, configured; ``STARTING``; ``DOWN``, with
    ``reason``); its ``pid``; the default pinned-memory ``limit_mib`` it was given; how many
    times it was (re)started (``starts``); ``heartbeat_s`` (wall-clock seconds of the check
    that wrote it) and ``since_s`` (of the last change of ``state``)."""

    uuid: str
    index: int
    state: Literal["up", "starting", "down"]
    reason: str = ""
    pid: int | None = None
    limit_mib: int | None = None
    starts: int = 0
    heartbeat_s: float = 0.0
    since_s: float = 0.0


def state_json(state: DaemonState) -> str:
    """``state`` as its file's JSON (one object, keys sorted)."""
    return json.dumps(
        {
            "uuid": state.uuid, "index": state.index, "state": state.state,
            "reason": state.reason, "pid": state.pid, "limit_mib": state.limit_mib,
            "starts": state.starts, "heartbeat_s": state.heartbeat_s, "since_s": state.since_s,
        },
        sort_keys=True,
    )  # fmt: skip


def _int(doc: Mapping[str, Any], key: str, *, optional: bool = False) -> int | None:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key}: expected a non-negative integer; got {str(value)[:32]!r}")
    return value


def _seconds(doc: Mapping[str, Any], key: str) -> float:
    value = doc.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{key}: expected seconds; got {str(value)[:32]!r}")
    return float(value)


def parse_state(raw: bytes | str, uuid: str) -> DaemonState:
    """The state file of ``uuid``'s daemon, checked: a JSON object with the keys
    ``state_json`` writes, for that GPU. Raises ``ValueError`` naming what is wrong (too long,
    not JSON, another GPU's, a bad field): the caller counts it as unreadable."""
    if len(raw) > MAX_STATE_BYTES:
        raise ValueError(f"over {MAX_STATE_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if doc.get("uuid") != uuid:
        raise ValueError(f"the state of {str(doc.get('uuid'))[:64]!r}, not of {uuid}")
    state = doc.get("state")
    if state not in (UP, STARTING, DOWN):
        raise ValueError(f"state: expected up, starting or down; got {str(state)[:32]!r}")
    reason = doc.get("reason", "")
    if not isinstance(reason, str):
        raise ValueError("reason: expected a string")
    return DaemonState(
        uuid=uuid, index=_int(doc, "index") or 0, state=state, reason=reason[:256],
        pid=_int(doc, "pid", optional=True), limit_mib=_int(doc, "limit_mib", optional=True),
        starts=_int(doc, "starts") or 0, heartbeat_s=_seconds(doc, "heartbeat_s"),
        since_s=_seconds(doc, "since_s"),
    )  # fmt: skip


def enforced(state: DaemonState | None, now_s: float, stale_after_s: float, *,
             problem: str | None = None) -> tuple[bool, str]:  # fmt: skip
    """Whether a shared GPU is enforced now, and if not why (a health reason): its daemon's
    ``state`` (``None``: no file, or ``problem`` says why it could not be read) says ``UP``
    with a heartbeat at most ``stale_after_s`` seconds before ``now_s`` (wall clock, the
    supervisor's and ours: one host). A heartbeat from the future by more than that bound is
    stale too (a clock stepped back)."""
    if state is None:
        return False, UNREADABLE if problem else MISSING
    if abs(now_s - state.heartbeat_s) > stale_after_s:
        return False, STALE
    if state.state != UP:
        return False, "mps-daemon-starting" if state.state == STARTING else "mps-daemon-down"
    return True, ""

"""CUDA MPS enforcement of slices: where the MPS control daemons live, what a slice container is
given to become its client, what the plugins ask for and what the supervisor says of each
daemon.

The daemons (``nvidia-cuda-mps-control -f`` with ``CUDA_VISIBLE_DEVICES`` the GPU's UUID) are
run by the supervisor (``omaticaya mps``, the chart's ``mps`` pods), under one host root
(``OMATICAYA_MPS_ROOT``, ``/run/omaticaya/mps``):

- ``<root>/slices/<slice id>/pipe``: a slice's daemon's ``CUDA_MPS_PIPE_DIRECTORY`` (its control
  socket and its server's), mounted in the slice's container at the same path; ``log``: its
  ``CUDA_MPS_LOG_DIRECTORY``; ``shm``: its tmpfs, the ``/dev/shm`` of the daemon, its server
  and the slice's container (MPS clients and their server talk through shared memory);
- ``<root>/<GPU UUID>/pipe`` and ``log``: a shared GPU's probe daemon (below).

The supervisor writes each daemon's state (``DaemonState``, JSON) to ``<state dir>/<GPU
UUID>.json`` (a probe's) and ``<state dir>/slices/<slice id>.state.json`` (a slice's), in
``OMATICAYA_MPS_STATE_DIR`` (a host folder the agent and the supervisor share), with a
heartbeat each check; the device plugin reads them (``read_state``) and serves a shared GPU's
units only while its probe is up and the heartbeat fresh (``enforced``), and a slice only once
its daemon is up. A state that is missing, unreadable, or stale counts as down: fail closed.

One MPS control daemon per slice (issue 47). A client's ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
can only lower the default pinned-memory limit its control daemon sets (NVIDIA's MPS
documentation, "Environment Variables"; measured on an H200), and the container owns its
environment: the kubelet puts a device plugin's variables before the pod's own, and a shell
``export`` beats CDI's. So the limit must come from the daemon's side: each slice gets a
control daemon of its own, whose default pinned-memory limit IS the slice, with its own folder
``<root>/slices/<slice id>`` (``pipe``, ``log``, and ``shm``: the shared memory of that daemon
and its clients alone). A tenant who sets the variable higher is still held to the daemon's
default; a tenant who removes its own control socket or unsets ``CUDA_MPS_PIPE_DIRECTORY``
leaves MPS (and its limit) but reaches no other tenant's daemon: the agent sees that process
outside its slice's daemon and says so (``core.allocation.slice_enforcement``). What it costs: clients of
different slices are in different MPS servers, so their kernels are time-sliced on the GPU, not
run concurrently (processes of one slice still share a server). The plugins ask for a slice's
daemon by writing a request (``SliceRequest``, ``<state dir>/slices/<slice id>.json``) and wait
for its state (``<state dir>/slices/<slice id>.state.json``) to say ``up``; they remove the
request when the slice ends, and the supervisor then stops the daemon.

Each shared GPU keeps one control daemon of its own too, the GPU's probe: it proves that MPS
starts on that GPU before any slice asks (its state is what ``enforced`` judges a GPU's units
by). No client is ever given its pipe folder, and its default limit is one unit.

The supervisor holds an exclusive ``flock`` on ``<state dir>/supervisor.lock`` while it runs
(``Layout.lock``): a reader that can take the lock knows at once that no supervisor runs, and
fails closed without waiting for the heartbeats to go stale (``supervisor_gone``).

The request and state files themselves, and the ``enforced`` rule, are ``mps_state``'s
(re-exported here).

Pure: no I/O but what the callers pass in (the supervisor writes, the device plugin reads).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .mps_state import (
    DOWN,
    MAX_STATE_BYTES,
    MISSING,
    STALE,
    STARTING,
    SUPERVISOR_GONE,
    UNREADABLE,
    UP,
    UUID_RE,
    DaemonState,
    SliceRequest,
    enforced,
    parse_request,
    parse_state,
    request_json,
    state_json,
)

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
    "SUPERVISOR_GONE",
    "SLICE_ID_RE",
    "MAX_STATE_BYTES",
    "ClientSpec",
    "DaemonState",
    "Layout",
    "Mount",
    "SliceRequest",
    "client_spec",
    "enforced",
    "limit_value",
    "parse_request",
    "parse_state",
    "probe_limit_mib",
    "request_json",
    "slice_id",
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

#: a slice's ID: 16 lower-case hex digits (``slice_id``)
SLICE_ID_RE = re.compile(r"^[0-9a-f]{16}$")
#: the root's longest path, bytes: ``<root>/<40-byte GPU UUID>/pipe/control_privileged`` (the
#: longest socket name of a daemon's pipe folder) within a unix socket path's 107 bytes (a
#: slice's, ``<root>/slices/<16>/pipe/control_privileged``, is shorter)
MAX_ROOT_BYTES = 42



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

    def gpu_dir(self, uuid: str) -> Path:
        """One GPU's folder, ``<root>/<GPU UUID>``. Raises ``ValueError`` for a UUID that is no
        GPU or MIG UUID (it becomes a path)."""
        if not UUID_RE.match(uuid):
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

    @property
    def lock(self) -> Path:
        """The file the supervisor holds an exclusive ``flock`` on while it runs."""
        return self.state_dir / "supervisor.lock"

    @property
    def slices_dir(self) -> Path:
        """Where the slices' daemons live: ``<root>/slices``."""
        return self.root / "slices"

    @property
    def requests_dir(self) -> Path:
        """Where the plugins write their slice requests and the supervisor the slices' states:
        ``<state_dir>/slices``."""
        return self.state_dir / "slices"

    def slice_dir(self, sid: str) -> Path:
        """One slice's folder, ``<root>/slices/<slice id>``. Raises ``ValueError`` for an ID
        that is not ``slice_id``'s form (it becomes a path)."""
        if not SLICE_ID_RE.match(sid):
            raise ValueError(f"not a slice ID (16 hex digits): {sid[:96]!r}")
        return self.slices_dir / sid

    def slice_pipe(self, sid: str) -> Path:
        """A slice daemon's ``CUDA_MPS_PIPE_DIRECTORY``."""
        return self.slice_dir(sid) / "pipe"

    def slice_shm(self, sid: str) -> Path:
        """A slice's shared memory (a tmpfs of its own when mounted): its daemon's and its
        clients' ``/dev/shm``."""
        return self.slice_dir(sid) / "shm"

    def request(self, sid: str) -> Path:
        """A slice's request file, ``<state_dir>/slices/<slice id>.json``."""
        self.slice_dir(sid)  # the same check
        return self.requests_dir / f"{sid}.json"

    def slice_state(self, sid: str) -> Path:
        """A slice daemon's state file, ``<state_dir>/slices/<slice id>.state.json``."""
        self.slice_dir(sid)
        return self.requests_dir / f"{sid}.state.json"


@dataclass(frozen=True, slots=True)
class Mount:
    """One bind mount of a client container: ``host_path`` at ``container_path``."""

    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """What ``Allocate`` adds to a slice container to make it an MPS client of its slice's daemon:
    ``envs`` (the pipe folder, the pinned-memory limit of exactly the slice on device 0, the
    slice's MiB for frameworks, and, with the thread share on, its active-thread percentage)
    and ``mounts`` (the pipe folder at its own path, the slice's shared-memory tmpfs at
    ``/dev/shm``)."""

    envs: Mapping[str, str]
    mounts: tuple[Mount, ...]


def slice_id(key: str) -> str:
    """A slice's ID from what names it uniquely on the node (the device plugin: its unit IDs,
    sorted and joined; the DRA driver: ``claim:<claim UID>:<device>``): the first 16 hex digits
    of its SHA-256. Stable across restarts of either side, so a request written before one is
    found again after it."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def limit_value(mib: int) -> str:
    """A pinned-memory limit as MPS reads it: ``<N>M`` (MiB). Raises ``ValueError`` below 1."""
    if mib < 1:
        raise ValueError(f"a pinned-memory limit of at least 1 MiB; got {mib}")
    return f"{mib}M"


def probe_limit_mib(unit_mib: int) -> int:
    """A GPU's probe daemon's default pinned-memory limit: one unit (no client is given its
    pipe folder; were one to reach it, it would get the least a slice can be)."""
    return max(unit_mib, 1)


def thread_pct(units: int, total_units: int) -> int:
    """The compute share of a slice of ``units`` of a GPU's ``total_units``, percent: rounded
    up, 1 to 100 (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``; MPS rounds it to the SMs it can
    give)."""
    if total_units <= 0:
        return 100
    return min(100, max(1, math.ceil(100 * units / total_units)))


def client_spec(layout: Layout, sid: str, mib: int, *,
                threads_pct: int | None = None) -> ClientSpec:  # fmt: skip
    """The client answer for slice ``sid`` of ``mib`` MiB: see ``ClientSpec``; the pipe folder
    and the shared memory are the slice daemon's own (``Layout.slice_pipe``,
    ``Layout.slice_shm``). The pinned-memory limit in the environment is exactly the slice, as
    the daemon's default is (the variable is informative: the daemon holds the client to its
    default whatever it says). ``threads_pct`` (``thread_pct``; ``OMATICAYA_MPS_THREAD_SHARE``):
    the active-thread percentage too. The container sees only its GPU, as device 0. Raises
    ``ValueError`` for a bad slice ID or an empty slice."""
    pipe = str(layout.slice_pipe(sid))
    envs = {PIPE_ENV: pipe, MPS_LIMIT_ENV: f"0={limit_value(mib)}", LIMIT_ENV: str(mib)}
    if threads_pct is not None:
        envs[ACTIVE_THREAD_ENV] = str(threads_pct)
    mounts = (Mount(pipe, pipe), Mount("/dev/shm", str(layout.slice_shm(sid))))
    return ClientSpec(envs, mounts)

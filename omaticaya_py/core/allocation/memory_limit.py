"""The driver-enforced per-container GPU memory limit (NVIDIA driver branch r615, CUDA 13.4), and
what a slice container is given to have it.

Below r615 a slice rests on MPS alone (``core.allocation.mps.client_spec``): the control daemon's default is
the whole GPU and each client lowers its own limit with ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` in
its environment, which a process inside the container can raise again before CUDA starts.

From r615 the driver can cap the device memory of a cgroup (NVML
``nvmlDeviceSetMemoryLimits_v1(device, {cgroup path, soft bytes, hard bytes})``: Linux, cgroup v2,
root, not for MIG handles). The NVIDIA Container Toolkit applies it to a container at creation
with its CDI hook ``apply-cuda-memory-limits`` (toolkit ``TOOLKIT_MIN_VERSION``): a
``createRuntime`` hook (the runtime's namespace, after the container's cgroup exists) that reads
two variables from the container's OCI spec:

- ``NVIDIA_GPU_MEMORY_REQUEST`` (``REQUEST_ENV``): the soft limit (what is guaranteed; under
  MPS v3 a client above it is a candidate for eviction under real pressure);
- ``NVIDIA_GPU_MEMORY_LIMIT`` (``LIMIT_ENV``): the hard limit (an allocation past it fails with
  out-of-memory);

each a whole number of MiB in decimal ASCII (no unit, no sign, no space; at most ``MAX_MIB``),
one value for the whole container, applied to every GPU the hook names (``--gpu-id <UUID>``, one
or more). Neither set: the hook does nothing. Only one: the limit defaults to unlimited, the
request to the limit. Request above limit, a bad number, cgroup v1, an NVML error: the hook fails,
and with it the container's creation. Once applied the limit lives in the cgroup, set by a
privileged hook: nothing the container does later to its own environment changes it.

Where the hook comes from: NVIDIA's own CDI specs (``nvidia-ctk cdi generate``, the kind
``nvidia.com/gpu``, and NVIDIA's device plugin's ``k8s.device-plugin.nvidia.com/gpu``) carry it on
every whole-GPU device; a CDI spec of ours must name it itself (``CdiHook``; NVIDIA's own specs
carry it at ``cdiVersion`` 0.5.0), or the variables reach nothing (``hook``).

Who sets the variables decides the limit, since the hook reads them from the spec at creation
(and takes the first entry of a name). By the code (kubelet v1.37.2, containerd v2.4.2, CDI
v1.1.x), not yet by a cluster: the kubelet lists a device plugin's ``Allocate`` variables before
the pod's own, and containerd keeps the later of two, so a variable the tenant writes in its pod
spec replaces the device plugin's; containerd applies CDI edits after that, and CDI v1.1.1
replaces a variable of the same name, so a CDI spec's value (the DRA driver's) wins, while CDI
v1.1.0 (runtime-tools' generator, whose cache is keyed by the whole ``KEY=VALUE``) appends a
second entry after the tenant's, which the hook never reads.

This module is pure (no I/O): ``driver_major`` reads the branch from NVML's driver version,
``per_container`` says whether the driver has the limit, ``limit_env`` gives the two variables,
``hook`` the CDI hook entry as plain data, ``slice_edits`` both for one slice, and
``common_limit_mib`` the one value a container with slices of several GPUs can have.

Sources (read for this module; facts only):

- NVIDIA/nvidia-container-toolkit PR #2075 (merged; supersedes #1995):
  ``cmd/nvidia-cdi-hook/apply-cuda-memory-limits/apply-cuda-memory-limits.go`` (the variables,
  MiB, the defaults, the errors), ``internal/discover/hooks.go`` (``createRuntime``;
  ``--driver-root`` then one ``--gpu-id`` per GPU; ``NVIDIA_CTK_DEBUG``; ``nvidia-ctk hook``
  when the binary is nvidia-ctk), ``pkg/nvcdi/cuda-memory-limits.go`` and ``full-gpu-nvml.go``
  (on every whole-GPU device), ``internal/info/cgroup`` (cgroup v2, the path from
  ``/proc/<pid>/cgroup``);
- NVML: ``nvmlDeviceSetMemoryLimits_v1`` and ``nvmlSetMemoryLimits_v1_t``
  (https://docs.nvidia.com/deploy/nvml-api/api/structnvmlSetMemoryLimits__v1__t.html): bytes,
  soft and hard, cgroup path, root, no MIG;
- https://docs.nvidia.com/deploy/mps/620/mpsv3-memory-partitioning.html: cgroup v2, CUDA 13.4,
  non-MIG; hard limit -> ``dmem.max``, soft -> ``dmem.min``;
- kai-scheduler/gpu-fractioning ``operator/internal/controller/dependency_checker.go`` (driver
  major 615, toolkit v1.20.1, device plugin v0.20.1) and kai-scheduler/kai-gpu-fractioning
  ``fractioning-manager/fractiond/internal/injection/injection.go`` (the singular spellings).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "ASSUMED_MPS_CLIENT_MEMORY_CHARGED_TO_CLIENT_CGROUP",
    "ASSUMED_SET_BELOW_MIN_DRIVER_FAILS_CREATION",
    "CDI_HOOK_DEBUG_ENV",
    "DEFAULT_DRIVER_ROOT",
    "DEFAULT_HOOK_PATH",
    "HOOK_LIFECYCLE",
    "HOOK_NAME",
    "LIMIT_ENV",
    "MAX_MIB",
    "NO_EDITS",
    "PER_CONTAINER_MIN_DRIVER_MAJOR",
    "REQUEST_ENV",
    "TOOLKIT_MIN_VERSION",
    "CdiHook",
    "ContainerEdits",
    "common_limit_mib",
    "driver_major",
    "hook",
    "limit_env",
    "per_container",
    "slice_edits",
    "toolkit_has_hook",
    "toolkit_version",
]

#: the first driver branch with the per-container limit (r615, CUDA 13.4: NVML's
#: ``nvmlDeviceSetMemoryLimits_v1``; KAI's gpu-fractioning gates on the same major)
PER_CONTAINER_MIN_DRIVER_MAJOR: Final = 615
#: the first NVIDIA Container Toolkit release whose ``nvidia-cdi-hook`` has the subcommand (the
#: floor KAI's gpu-fractioning enforces; v1.20.0 has no such hook)
TOOLKIT_MIN_VERSION: Final = (1, 20, 1)

#: the soft limit (MiB): guaranteed; NVML ``softLimit``, the cgroup's ``dmem.min``
REQUEST_ENV: Final = "NVIDIA_GPU_MEMORY_REQUEST"
#: the hard limit (MiB): an allocation past it fails; NVML ``hardLimit``, ``dmem.max``
LIMIT_ENV: Final = "NVIDIA_GPU_MEMORY_LIMIT"
#: the largest value the hook takes: MiB whose bytes fit NVML's 64-bit limit
#: (``NVML_DEVICE_MEMORY_LIMIT_MAX`` // 2**20)
MAX_MIB: Final = (2**64 - 1) // 2**20

#: the hook's subcommand, and the OCI stage the toolkit runs it at
HOOK_NAME: Final = "apply-cuda-memory-limits"
HOOK_LIFECYCLE: Final = "createRuntime"
#: the variable the toolkit gives each hook it generates (its debug logging; ``false``)
CDI_HOOK_DEBUG_ENV: Final = "NVIDIA_CTK_DEBUG"

#: ASSUMED: where the hook binary is on the node, as a host path (a ``createRuntime`` hook runs
#: in the runtime's namespace). This is the toolkit's built-in default for the specs it
#: generates (a host package install). A toolkit installed by the GPU Operator lives elsewhere:
#: take the path from the ``nvidia.com/gpu`` spec the node's toolkit wrote and pass it to
#: ``hook``. A GPU check must confirm the path on the target nodes.
DEFAULT_HOOK_PATH: Final = "/usr/bin/nvidia-cdi-hook"
#: ASSUMED: the driver root the hook looks for ``libnvidia-ml.so.1`` under (``--driver-root``):
#: ``/`` for a driver installed on the host. A driver container (the GPU Operator's) has its own
#: root (read it, too, from the node's ``nvidia.com/gpu`` spec). A GPU check must confirm it.
DEFAULT_DRIVER_ROOT: Final = "/"

#: ASSUMED, NOT VERIFIED: that the variables must not be set below r615. With them set, the hook
#: (toolkit v1.20.1+) calls ``nvmlDeviceSetMemoryLimits_v1``, a symbol an older libnvidia-ml lacks;
#: the toolkit's NVML binding resolves symbols lazily and does not look this one up first, so the
#: hook should fail, and the container's creation with it (a failed ``createRuntime`` hook fails
#: the container). No source read says what happens. ``slice_edits`` therefore gives nothing
#: below ``PER_CONTAINER_MIN_DRIVER_MAJOR``; a GPU check on a driver below r615 with toolkit
#: v1.20.1+ must show whether the container starts.
ASSUMED_SET_BELOW_MIN_DRIVER_FAILS_CREATION: Final = True
#: ASSUMED, NOT VERIFIED: that a slice container's memory counts against its own cgroup's limit
#: although under MPS the MPS server (another container's process) makes the allocations. NVIDIA's
#: MPS v3 memory partitioning page describes limits across "cgroups and containers", and KAI's
#: gpu-fractioning runs MPS clients under this very hook, but no source read says whose cgroup an
#: MPS client's allocation is charged to. Until a GPU check confirms it (an MPS client allocating
#: past its ``LIMIT_ENV`` on r615 must get out-of-memory), keep ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
#: (``core.allocation.mps``) as well: the two are the same number, so whichever binds first binds right.
ASSUMED_MPS_CLIENT_MEMORY_CHARGED_TO_CLIENT_CGROUP: Final = True

#: a display driver version as NVML gives it (``nvmlSystemGetDriverVersion``): ``X.Y`` or ``X.Y.Z``,
#: ASCII digits (``580.159.04``, ``615.71.09``, ``580.65``)
_DRIVER_VERSION = re.compile(r"([0-9]+)\.[0-9]+(?:\.[0-9]+)?")
#: a toolkit version as a package or an image tag gives it: ``1.20.1``, ``v1.20.1``,
#: ``v1.20.1-ubuntu20.04``, ``1.20.1-rc.2`` (the suffix is ignored: see ``toolkit_version``)
_TOOLKIT_VERSION = re.compile(r"v?([0-9]+)\.([0-9]+)\.([0-9]+)(?:[-+].*)?")


def driver_major(version: str | None) -> int | None:
    """The driver branch (major) from NVML's display driver version
    (``nvmlSystemGetDriverVersion``): ``"580.159.04"`` -> ``580``, ``"615.71.09"`` -> ``615``,
    ``"580.65"`` -> ``580``. Surrounding whitespace is ignored. ``None`` for no version or one
    that is not ``X.Y[.Z]`` of ASCII digits (the shapes GPU Feature Discovery accepts too:
    ``core.publish.render.driver_version_parts``)."""
    if version is None:
        return None
    m = _DRIVER_VERSION.fullmatch(version.strip())
    return int(m.group(1)) if m else None


def per_container(major: int | None) -> bool:
    """Whether a driver of branch ``major`` (``driver_major``) has the driver-enforced
    per-container limit: r615 (``PER_CONTAINER_MIN_DRIVER_MAJOR``) or newer. An unknown branch
    (``None``) has not: fail closed, and leave the slice to MPS."""
    return major is not None and major >= PER_CONTAINER_MIN_DRIVER_MAJOR


def toolkit_version(version: str | None) -> tuple[int, int, int] | None:
    """An NVIDIA Container Toolkit version as ``(major, minor, patch)``: ``"1.20.1"``,
    ``"v1.20.1"``, an image tag with its distribution (``"v1.20.1-ubuntu20.04"``) or a release
    candidate (``"v1.20.1-rc.1"``: counted as its release, as KAI's gate counts it); ``None``
    for anything else."""
    if version is None:
        return None
    m = _TOOLKIT_VERSION.fullmatch(version.strip())
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def toolkit_has_hook(version: str | None) -> bool:
    """Whether toolkit ``version`` (``toolkit_version``'s shapes) has the
    ``apply-cuda-memory-limits`` hook: ``TOOLKIT_MIN_VERSION`` or newer. Unknown: no. On an older
    toolkit the variables reach nothing (NVIDIA's specs carry no hook), and a spec that names the
    hook runs a subcommand its binary lacks."""
    parsed = toolkit_version(version)
    return parsed is not None and parsed >= TOOLKIT_MIN_VERSION


def _check_mib(mib: int, what: str) -> int:
    if isinstance(mib, bool) or not isinstance(mib, int):
        raise TypeError(f"{what}: MiB must be an int, not {type(mib).__name__}")
    if not 1 <= mib <= MAX_MIB:
        raise ValueError(f"{what}: {mib} MiB is outside 1..{MAX_MIB}")
    return mib


def limit_env(mib: int, request_mib: int | None = None) -> dict[str, str]:
    """The container's two variables for a hard limit of ``mib`` MiB and a soft limit of
    ``request_mib`` MiB (default: ``mib``, a slice being reserved whole):
    ``{"NVIDIA_GPU_MEMORY_REQUEST": "<request_mib>", "NVIDIA_GPU_MEMORY_LIMIT": "<mib>"}``,
    decimal MiB as the hook parses them. Both are always given (the toolkit's first version of
    the hook, PR #1995, acted only when both were set).

    Raises ``TypeError`` for a MiB that is not an ``int`` (``bool`` included) and ``ValueError``
    for one outside ``1..MAX_MIB`` or a request above the limit (the hook would fail the
    container's creation)."""
    _check_mib(mib, LIMIT_ENV)
    request = mib if request_mib is None else _check_mib(request_mib, REQUEST_ENV)
    if request > mib:
        raise ValueError(f"{REQUEST_ENV} {request} MiB is above {LIMIT_ENV} {mib} MiB")
    return {REQUEST_ENV: str(request), LIMIT_ENV: str(mib)}


def _check_uuid(uuid: str) -> str:
    if not isinstance(uuid, str) or not uuid.startswith("GPU-") or uuid != uuid.strip():
        raise ValueError(f"not a whole-GPU UUID (GPU-...): {uuid!r}")
    if any(c.isspace() for c in uuid) or len(uuid) == len("GPU-"):
        raise ValueError(f"not a whole-GPU UUID (GPU-...): {uuid!r}")
    return uuid


@dataclass(frozen=True, slots=True)
class CdiHook:
    """One CDI ``containerEdits.hooks`` entry, as plain data: ``hook_name`` (the OCI stage),
    ``path`` (host path of the binary), ``args`` (``argv``, the binary's name first) and
    ``env`` (``KEY=VALUE``). ``as_cdi`` is the JSON-ready mapping a CDI spec holds."""

    hook_name: str
    path: str
    args: tuple[str, ...]
    env: tuple[str, ...] = ()

    def as_cdi(self) -> dict[str, Any]:
        """``{"hookName", "path", "args", "env"}`` (``env`` left out when empty), the CDI
        spec's field names."""
        out: dict[str, Any] = {"hookName": self.hook_name, "path": self.path,
                               "args": list(self.args)}  # fmt: skip
        if self.env:
            out["env"] = list(self.env)
        return out


def hook(
    gpu_uuids: Iterable[str],
    *,
    hook_path: str = DEFAULT_HOOK_PATH,
    driver_root: str = DEFAULT_DRIVER_ROOT,
    debug: bool = False,
) -> CdiHook:
    """The ``apply-cuda-memory-limits`` hook for the GPUs ``gpu_uuids`` (whole-GPU UUIDs
    ``GPU-...``, one or more, in order, repeats dropped), as the toolkit writes it into its own
    specs: ``createRuntime``; ``args`` ``[<binary>, "apply-cuda-memory-limits", "--driver-root",
    driver_root, "--gpu-id", <uuid>, ...]`` (``[..., "nvidia-ctk", "hook",
    "apply-cuda-memory-limits", ...]`` when ``hook_path`` is the ``nvidia-ctk`` binary); ``env``
    ``["NVIDIA_CTK_DEBUG=false"]`` (``true`` with ``debug``).

    Raises ``ValueError`` for no GPU, a UUID that is not a whole GPU's (NVML sets no limit on a
    MIG device: the hook would fail the container), a relative ``hook_path`` or
    ``driver_root``."""
    uuids = tuple(dict.fromkeys(_check_uuid(u) for u in gpu_uuids))
    if not uuids:
        raise ValueError("the hook needs at least one GPU")
    for what, path in (("hook_path", hook_path), ("driver_root", driver_root)):
        if not isinstance(path, str) or not path.startswith("/"):
            raise ValueError(f"{what} must be an absolute host path: {path!r}")
    binary = hook_path.rstrip("/").rsplit("/", 1)[-1]
    if not binary:
        raise ValueError(f"hook_path names no binary: {hook_path!r}")
    head = (binary, "hook") if binary == "nvidia-ctk" else (binary,)
    args = (*head, HOOK_NAME, "--driver-root", driver_root)
    for u in uuids:
        args += ("--gpu-id", u)
    debug_value = "true" if debug else "false"
    return CdiHook(HOOK_LIFECYCLE, hook_path, args, (f"{CDI_HOOK_DEBUG_ENV}={debug_value}",))


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """What a slice container is given for the driver-enforced limit: ``envs`` (the two
    variables, ``limit_env``) and ``hooks`` (the CDI hook entries a spec of ours must name; empty
    when the container's GPU comes from NVIDIA's own spec, which carries the hook). Both empty:
    nothing to give (``NO_EDITS``)."""

    envs: Mapping[str, str] = field(default_factory=dict)
    hooks: tuple[CdiHook, ...] = ()

    def env_list(self) -> list[str]:
        """``envs`` as CDI and OCI write them: ``["KEY=VALUE", ...]``."""
        return [f"{k}={v}" for k, v in self.envs.items()]

    def __bool__(self) -> bool:
        return bool(self.envs or self.hooks)


#: nothing to give: the driver has no per-container limit (or its branch is unknown)
NO_EDITS: Final = ContainerEdits()


def slice_edits(
    uuid: str,
    mib: int,
    major: int | None,
    *,
    name_hook: bool,
    hook_path: str = DEFAULT_HOOK_PATH,
    driver_root: str = DEFAULT_DRIVER_ROOT,
) -> ContainerEdits:
    """The edits for a slice of ``mib`` MiB of GPU ``uuid`` on a driver of branch ``major``
    (``driver_major``): ``NO_EDITS`` unless ``per_container(major)``
    (``ASSUMED_SET_BELOW_MIN_DRIVER_FAILS_CREATION``); else the variables (soft = hard = ``mib``)
    and, with ``name_hook`` (a CDI spec of ours, the DRA driver's), the hook for ``uuid``
    (``hook``). Without ``name_hook`` the hook must come from the spec that gives the container
    its GPU (the device plugin's CDI strategies: NVIDIA's ``nvidia.com/gpu=<uuid>``, toolkit
    ``TOOLKIT_MIN_VERSION`` or newer).

    The variables are the container's, not the GPU's: every GPU whose hook runs in that
    container gets the same limit, a whole GPU from NVIDIA's spec included. A container with
    slices of several GPUs needs ``common_limit_mib``.

    Raises as ``limit_env`` and ``hook`` do (``ValueError``, ``TypeError``), also when the
    driver has no limit: a bad slice is a bug either way."""
    env = limit_env(mib)
    checked = _check_uuid(uuid)
    if not per_container(major):
        return NO_EDITS
    hooks = (hook([checked], hook_path=hook_path, driver_root=driver_root),) if name_hook else ()
    return ContainerEdits(env, hooks)


def common_limit_mib(mibs: Iterable[int]) -> int:
    """The one limit (MiB) a container can be given for its slices ``mibs`` (one per GPU): their
    common size. The hook applies one value to every GPU it names, so slices of different sizes
    in one container cannot each get their own: ``ValueError`` then, and for no slice; a MiB
    that is not an ``int`` or outside ``1..MAX_MIB`` raises as in ``limit_env``."""
    sizes = {_check_mib(m, LIMIT_ENV) for m in mibs}
    if not sizes:
        raise ValueError("no slice")
    if len(sizes) > 1:
        raise ValueError(
            f"slices of different sizes in one container ({sorted(sizes)} MiB): the "
            "per-container limit is one value for every GPU"
        )
    return sizes.pop()

"""How ``Allocate`` hands a container its GPUs: NVIDIA's device list strategies.

``container_response`` builds one ``ContainerAllocateResponse`` from the devices a container
gets (whole GPU UUIDs, MIG UUIDs, or for a memory slice its one GPU's UUID) and the extra
environment the caller computed, by any several of (``OMATICAYA_DEVICE_LIST_STRATEGY``):

- ``envvar``: ``NVIDIA_VISIBLE_DEVICES=<uuid>,<uuid>``, read by the NVIDIA container runtime
  for privileged containers, and for unprivileged ones unless it is configured with
  ``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` (Bottlerocket's default,
  and how hardened GPU Operator and RKE2 nodes are set up).
- ``volume-mounts``: one read-only mount per device, host ``/dev/null`` at
  ``/var/run/nvidia-container-devices/<uuid>``, which the runtime reads with
  ``accept-nvidia-visible-devices-as-volume-mounts = true``. Alone, it sets
  ``NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices`` as NVIDIA's plugin does, so an
  image's own ``NVIDIA_VISIBLE_DEVICES=all`` never reaches a runtime that reads the variable.
- ``cdi-annotations``: the container annotation
  ``cdi.k8s.io/omaticaya-device-plugin_<digest>: nvidia.com/gpu=<uuid>,...``, read by a
  CDI-enabled runtime against the spec ``nvidia-ctk cdi generate`` writes (kind
  ``nvidia.com/gpu``, devices named by UUID among others).
- ``cdi-cri``: the ``CDIDevices`` field of the response (``v1beta1``; kubelet 1.29+, 1.28 with
  the ``DevicePluginCDIDevices`` gate), passed in the CRI to a CDI-enabled containerd or CRI-O;
  older kubelets skip the unknown field.

With ``envvar`` and ``volume-mounts`` both on, ``NVIDIA_VISIBLE_DEVICES`` holds the UUIDs, not
the mount root as NVIDIA's plugin leaves it (its volume-mounts step overwrites the variable):
the runtime looks at CDI annotations first, then the mounts when it accepts them, and only then
at the variable, so a runtime that reads mounts sees the same devices either way, while one that
does not (the toolkit's default configuration) would fail on the root path ("unknown device id:
/var/run/nvidia-container-devices", NVIDIA/k8s-device-plugin#200). So the default
``envvar,volume-mounts`` serves both kinds of runtime.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..core.allocation.mps import Mount
from .v1beta1 import api_pb2

#: the variable the NVIDIA container runtime reads the visible devices from
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"

__all__ = [
    "CDI_ANNOTATION_PREFIX",
    "CDI_KIND",
    "CDI_PLUGIN_NAME",
    "DEFAULT_STRATEGIES",
    "STRATEGIES",
    "VOLUME_MOUNTS_HOST_PATH",
    "VOLUME_MOUNTS_ROOT",
    "cdi_annotation_key",
    "cdi_names",
    "container_response",
]

ENVVAR, VOLUME_MOUNTS, CDI_ANNOTATIONS, CDI_CRI = (
    "envvar", "volume-mounts", "cdi-annotations", "cdi-cri"
)
#: every strategy, as ``OMATICAYA_DEVICE_LIST_STRATEGY`` names them
STRATEGIES = (ENVVAR, VOLUME_MOUNTS, CDI_ANNOTATIONS, CDI_CRI)
#: the settings' default: both kinds of NVIDIA runtime see the GPU
DEFAULT_STRATEGIES = (ENVVAR, VOLUME_MOUNTS)
#: where the NVIDIA runtime looks for device mounts (nvidia-container-toolkit's
#: ``DeviceListAsVolumeMountsRoot``, NVIDIA's plugin's ``deviceListAsVolumeMountsContainerPathRoot``)
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
#: the only host path the runtime counts as a device request
VOLUME_MOUNTS_HOST_PATH = "/dev/null"
#: the CDI annotation prefix runtimes read (``cdi.k8s.io/``, the CDI library's ``AnnotationPrefix``)
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
#: the plugin part of our annotation key (the CDI library: ``<plugin>_<id>``, at most 63 chars)
CDI_PLUGIN_NAME = "omaticaya-device-plugin"
#: the CDI kind of NVIDIA's GPUs and MIG devices in the spec ``nvidia-ctk cdi generate`` writes
CDI_KIND = "nvidia.com/gpu"
#: a CDI device name: alphanumeric first and last, ``_ - . :`` between (the CDI parser's rule)
_CDI_DEVICE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")


def container_response(
    visible: Sequence[str],
    envs: Mapping[str, str] | None = None,
    strategies: Iterable[str] = DEFAULT_STRATEGIES,
    mounts: Iterable[Mount] = (),
) -> Any:
    """The ``ContainerAllocateResponse`` for a container that gets the devices ``visible``
    (GPU or MIG UUIDs as the plugin advertises them; a slice's one GPU UUID; in order,
    repeats dropped) with ``envs`` added to its environment, by each of ``strategies`` (any of
    ``STRATEGIES``, see the module's docstring). A strategy's variable wins over the same key
    in ``envs``. ``mounts`` (``core.allocation.mps.Mount``: an MPS client's pipe folder and shared
    memory) are added as they are. With no device, only ``envs``: nothing names a GPU.

    Raises ``ValueError`` for a strategy not in ``STRATEGIES``, an empty device ID, a device
    that would leave the mount root as a path (``..``, an empty part), or, with a CDI
    strategy, one that is not a CDI device name.
    """
    chosen = set(strategies)
    unknown = sorted(chosen - set(STRATEGIES))
    if unknown:
        raise ValueError(
            f"unknown device list strategy {', '.join(unknown)}: expected {', '.join(STRATEGIES)}"
        )
    devices = list(dict.fromkeys(visible))
    if "" in devices:
        raise ValueError("an empty device ID")
    out_envs: dict[str, str] = dict(envs or {})
    response = api_pb2.ContainerAllocateResponse()
    response.mounts.extend(
        api_pb2.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
        for m in mounts
    )
    if not devices:
        response.envs.update(out_envs)
        return response
    if VOLUME_MOUNTS in chosen:
        response.mounts.extend(
            api_pb2.Mount(
                container_path=_mount_path(d), host_path=VOLUME_MOUNTS_HOST_PATH, read_only=True
            )
            for d in devices
        )
        out_envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_ROOT
    if ENVVAR in chosen:  # after volume-mounts: the UUIDs win (see the module's docstring)
        out_envs[VISIBLE_DEVICES_ENV] = ",".join(devices)
    if chosen & {CDI_ANNOTATIONS, CDI_CRI}:
        names = cdi_names(devices)
        if CDI_ANNOTATIONS in chosen:
            response.annotations[cdi_annotation_key(devices)] = ",".join(names)
        if CDI_CRI in chosen:
            response.cdi_devices.extend(api_pb2.CDIDevice(name=n) for n in names)
    response.envs.update(out_envs)
    return response


def cdi_names(devices: Iterable[str]) -> list[str]:
    """Fully qualified CDI device names, ``nvidia.com/gpu=<uuid>`` for each device; raises
    ``ValueError`` for one that is not a CDI device name (a ``/`` in an old-style MIG UUID)."""
    names = []
    for d in devices:
        if not _CDI_DEVICE.fullmatch(d):
            raise ValueError(f"device {d[:64]!r} is not a CDI device name")
        names.append(f"{CDI_KIND}={d}")
    return names


def cdi_annotation_key(devices: Sequence[str]) -> str:
    """The container annotation key for these devices: ``cdi.k8s.io/omaticaya-device-plugin_``
    and 16 hex digits of their SHA-256, so that one container's answers from two of our
    resources (a whole GPU and a MIG device) never share a key, and the same devices always get
    the same key. The name after the prefix is 40 characters (the CDI library allows 63)."""
    digest = hashlib.sha256("\n".join(devices).encode()).hexdigest()[:16]
    return f"{CDI_ANNOTATION_PREFIX}{CDI_PLUGIN_NAME}_{digest}"


def _mount_path(device: str) -> str:
    """``VOLUME_MOUNTS_ROOT/<device>``; the runtime reads the device back as the path below
    the root, so a ``/`` (an old-style MIG UUID) is kept, but nothing may climb out of it."""
    parts = device.split("/")
    if any(p in ("", ".", "..") for p in parts) or "\x00" in device:
        raise ValueError(f"device {device[:64]!r} is not a path below {VOLUME_MOUNTS_ROOT}")
    return posixpath.join(VOLUME_MOUNTS_ROOT, device)

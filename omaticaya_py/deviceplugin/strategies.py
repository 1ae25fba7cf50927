"""How ``Allocate`` hands a container its GPUs: NVIDIA's device list strategies.

``container_response`` builds one ``ContainerAllocateResponse`` from the devices a container
gets (whole GPU UUIDs, MIG UUIDs, or for a slice its one GPU's UUID) and the extra environment
the caller computed. Strategies so far: ``envvar`` (``NVIDIA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .allocation import VISIBLE_DEVICES_ENV
from .v1beta1 import api_pb2


def container_response(
    visible: Sequence[str],
    envs: Mapping[str, str] | None = None,
    strategies: Sequence[str] = ("envvar",),
) -> Any:
    """The ``ContainerAllocateResponse`` for a container that gets the GPUs ``visible`` (UUIDs,
    in order, once each) with ``envs`` added to its environment, by each of ``strategies``."""
    out: dict[str, str] = dict(envs or {})
    if visible and "envvar" in strategies:
        out[VISIBLE_DEVICES_ENV] = ",".join(visible)
    return api_pb2.ContainerAllocateResponse(envs=out)

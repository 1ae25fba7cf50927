"""The settings sections of placement and GPU sharing.

- ``PlacementSection``: the facts both sides of the seam read, the scheduler extender (where a
  pod goes) and the device plugin or DRA driver (which GPU a slice takes): the two resource
  names, the placement policy and the settle time. One environment name each
  (``OMATICAYA_DEVICE_PLUGIN_RESOURCE``, ``OMATICAYA_SHARED_RESOURCE``,
  ``OMATICAYA_PLACEMENT_POLICY``, ``OMATICAYA_SETTLE_S``), whatever the program's prefix; the
  names each side had before (``OMATICAYA_EXTENDER_SHARED_RESOURCE``, ``OMATICAYA_SHARE_POLICY``,
  ...) are still read (``Renamed``: a warning names the new one; two names set to different
  values are an error).
- ``SharingSection``: which GPUs are shared by memory, the unit and what enforces a slice
  (``core.model.sharing``), read by the node's programs (agent, device plugin, DRA, MPS).

Each section is a settings class of its own (``CommonSettings``); a program's settings class
is the sections it reads, combined (``core.config.settings.Settings``,
``scheduler.settings.ExtenderSettings``). Raises ``ValueError`` (``SettingsError`` through
``load``) on a bad value, naming the variable.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from ..allocation.policy import DEFAULT_POLICY, PlacementPolicy
from ..model.sharing import (
    DEFAULT_GPU_RESOURCE,
    DEFAULT_SHARED_RESOURCE,
    DEFAULT_UNIT_MIB,
    SharedGpus,
    parse_shared_gpus,
)
from .settings_base import DNS_SUBDOMAIN, CommonSettings, Renamed

__all__ = [
    "EXTENDED_RESOURCE_NAME",
    "PlacementSection",
    "SharingSection",
    "check_resource_name",
]

#: the name part of an extended resource (a qualified name: ``gpu``, ``gpu.shared``).
EXTENDED_RESOURCE_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def check_resource_name(value: str) -> str:
    """``value`` stripped, when it is an extended resource name ``<domain>/<name>`` outside
    ``kubernetes.io`` (the kubelet's rule for a device plugin's resource). Raises
    ``ValueError`` naming the expected form otherwise."""
    value = value.strip()
    domain, slash, name = value.partition("/")
    if (
        not slash
        or len(domain) > 253
        or not DNS_SUBDOMAIN.match(domain)
        or domain == "kubernetes.io"
        or domain.endswith(".kubernetes.io")
        or len(name) > 63
        or not EXTENDED_RESOURCE_NAME.match(name)
    ):
        raise ValueError(
            "expected an extended resource name <domain>/<name> outside kubernetes.io, "
            "like 'nvidia.com/gpu'"
        )
    return value


class PlacementSection(CommonSettings):
    """What the scheduler extender and the node's device plugin or DRA driver must agree on
    (see the module docstring): one variable per fact, read alike by both programs."""

    device_plugin_resource: str = Field(
        default=DEFAULT_GPU_RESOURCE,
        validation_alias=Renamed("OMATICAYA_DEVICE_PLUGIN_RESOURCE",
                                 "OMATICAYA_EXTENDER_DEVICE_PLUGIN_RESOURCE"),
        description="Extended resource name of whole GPUs: the device plugin serves them as "
        "it, and the scheduler extender gives a pod with the memory annotation that also asks "
        "for it whole GPUs (the kubelet hands them out whole). NVIDIA's device plugin serves "
        "the same name: run one of the two on a node (docs/install.md).",
    )
    shared_resource: str = Field(
        default=DEFAULT_SHARED_RESOURCE,
        validation_alias=Renamed("OMATICAYA_SHARED_RESOURCE", "OMATICAYA_EXTENDER_SHARED_RESOURCE"),
        description="Extended resource name of the memory units of shared GPUs: the device "
        "plugin serves them as it, and the scheduler extender passes a pod asking for it only "
        "where one shared GPU has each slice free by the live reading less the reservations.",
    )
    placement_policy: PlacementPolicy = Field(
        default=DEFAULT_POLICY,
        validation_alias=Renamed("OMATICAYA_PLACEMENT_POLICY", "OMATICAYA_SHARE_POLICY",
                                 "OMATICAYA_EXTENDER_STRATEGY"),
        description="Where pods' GPU memory goes, one policy for the scheduler extender (its "
        "choice of node and GPUs) and the device plugin (its choice of a slice's shared GPU): "
        "binpack the least room that fits, spread the most.",
    )
    settle_s: float = Field(
        default=60,
        ge=0,
        le=86400,
        validation_alias=Renamed("OMATICAYA_SETTLE_S", "OMATICAYA_SHARE_SETTLE_S",
                                 "OMATICAYA_EXTENDER_SETTLE_S"),
        description="A pod placed through the scheduler extender, or a slice the device plugin "
        "hands out, counts against its GPUs' live free memory until the reading shows it in "
        "use, or for at most this many seconds (0: no in-flight accounting).",
    )

    @field_validator("device_plugin_resource", "shared_resource")
    @classmethod
    def _check_resource(cls, value: str) -> str:
        return check_resource_name(value)

    @field_validator("placement_policy", mode="before")
    @classmethod
    def _lower_policy(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _two_resources(self) -> PlacementSection:
        if self.shared_resource == self.device_plugin_resource:
            raise ValueError(
                "OMATICAYA_SHARED_RESOURCE must differ from OMATICAYA_DEVICE_PLUGIN_RESOURCE "
                f"(both {self.shared_resource!r}): a GPU is served whole or in units, never both"
            )
        return self


class SharingSection(CommonSettings):
    """GPU sharing by memory on a node (``core.model.sharing``): which GPUs, the unit, what
    enforces a slice. Read by the agent (labels, attribution), the device plugin, the DRA
    driver and ``omaticaya mps``."""

    shared_gpus: Annotated[SharedGpus, NoDecode] = Field(
        default=SharedGpus(),
        description="GPUs served as memory units instead of whole: none, all, GPU UUIDs "
        "(GPU-4a1b...: the safe form; a reboot that loses a GPU renumbers the others' indices, "
        "never their UUIDs), or indices (0-3; an index that names another GPU than at the last "
        "start is reported).",
    )
    share_unit_mib: int = Field(
        default=DEFAULT_UNIT_MIB, ge=1, le=1 << 20, description="MiB per unit of a shared GPU."
    )
    share_enforcement: Literal["mps", "none"] = Field(
        default="mps",
        description="What enforces a slice: mps (each shared GPU's CUDA MPS control daemon, run "
        "by `omaticaya mps`; a slice container becomes its client with exactly its limit; a "
        "shared GPU whose daemon is not up serves no units) or none (nothing: for runtimes that "
        "cannot run MPS; the limit is only in the container's environment).",
    )

    @field_validator("shared_gpus", mode="before")
    @classmethod
    def _parse_shared(cls, value: Any) -> SharedGpus:
        return parse_shared_gpus(value)

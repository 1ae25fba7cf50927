"""The placement policy (pure): one value, ``OMATICAYA_PLACEMENT_POLICY``, read by the scheduler
extender and the device plugin alike, and compared in one place (``PlacementPolicy.sign``)."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["DEFAULT_POLICY", "POLICIES", "PlacementPolicy", "policy_sign"]


class PlacementPolicy(StrEnum):
    """The placement policy (``OMATICAYA_PLACEMENT_POLICY``, the chart's ``placement.policy``),
    read by the scheduler extender and the device plugin alike: among the devices or nodes
    that fit, ``binpack`` prefers the one with the least room (big holes stay whole for big
    pods), ``spread`` the one with the most. A ``str``: ``PlacementPolicy("spread") ==
    "spread"``. Raises ``ValueError`` for any other value."""

    BINPACK = "binpack"
    SPREAD = "spread"

    @property
    def sign(self) -> int:
        """``+1`` (binpack: the least room first) or ``-1`` (spread: the most first): the one
        place a policy is compared; multiply a room by it to sort the preferred first."""
        return -1 if self is PlacementPolicy.SPREAD else 1


def policy_sign(policy: str) -> int:
    """``PlacementPolicy(policy).sign``: ``+1`` for ``binpack``, ``-1`` for ``spread``. Raises
    ``ValueError`` for another policy."""
    return PlacementPolicy(policy).sign


#: placement policies: the fitting device with the least room, or with the most
POLICIES: tuple[str, ...] = tuple(p.value for p in PlacementPolicy)
DEFAULT_POLICY = PlacementPolicy.BINPACK

"""The free-memory signal the extender decides on: the reading now, or the window minimum.

``now`` (the default) uses each GPU's free memory as last read. ``window-min`` uses
``min(now, the least free memory over the agent's peak window)``: a GPU whose free memory dips
every few minutes is judged by its dips (``core.window``; the agent publishes the minimum in the
telemetry as ``memory_free_min_mib``). A GPU without a published minimum (window off, not yet
half covered, an older agent) is judged by ``now``. Pure, applied once per Node change.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal, TypeVar

from ..core.schema import GpuInfo, NodeGpuState

__all__ = ["SIGNALS", "Signal", "with_signal"]

Signal = Literal["now", "window-min"]
SIGNALS: tuple[str, ...] = ("now", "window-min")

State = TypeVar("State", bound=NodeGpuState)


def with_signal(state: State, signal: str) -> State:
    """``state`` with each GPU's ``free_mib``, whole and shared (and the node's
    ``free_total_mib``), taken from ``signal``; the same object when nothing changes."""
    if signal != "window-min" or not any(
        g.free_min_mib is not None for g in (*state.gpus, *state.shared)
    ):
        return state
    gpus, shared = _window_min(state.gpus), _window_min(state.shared)
    return replace(state, gpus=gpus, shared=shared,
                   free_total_mib=sum(g.free_mib for g in gpus if g.healthy))  # fmt: skip


def _window_min(gpus: tuple[GpuInfo, ...]) -> tuple[GpuInfo, ...]:
    return tuple(
        replace(g, free_mib=min(g.free_mib, g.free_min_mib)) if g.free_min_mib is not None else g
        for g in gpus
    )

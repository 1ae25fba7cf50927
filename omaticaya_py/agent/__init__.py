"""The node agent: a tick (read, assess, render, diff, patch) on a schedule (``agent``), and its
``/metrics``, ``/healthz`` and ``/readyz`` (``metrics``)."""

from .agent import Agent, AgentStopping, SnapshotCache, TickResult

__all__ = ["Agent", "AgentStopping", "SnapshotCache", "TickResult"]

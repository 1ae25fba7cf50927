"""The node agent: a tick (read, assess, render, diff, patch: ``agent``), its lifecycle on a
schedule (``daemon``), and its ``/metrics``, ``/healthz`` and ``/readyz`` (``metrics``)."""

from .agent import Agent, NodeApi

__all__ = ["Agent", "NodeApi"]

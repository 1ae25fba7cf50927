"""The one budgeted publisher: what one tick may write of a published object (the Node's labels
and telemetry, the Node's ResourceSlice), decided once for both.

Each published object is a set of keys (label keys, telemetry units, the parts of each
ResourceSlice device) whose changes are sorted by the object's own rule into changes for the
worse (a scheduler would oversell the Node: they go at once) and for the better (they may
wait). ``Publisher`` keeps, per object, each key's calm clock (``core.publish.budget.Calm``:
the calm window, doubled when the key flaps) and when the object was last written, and answers
each tick with a ``WritePlan``: whether something goes at once, which changes for the better
go with it, which are held back (``core.publish.budget.held_keys``). The writers
(``agent.node_writer``, ``agent.resourceslice_writer``) are its I/O edges: they sort the
changes, ask for the plan, send what it lets go, and say when they wrote.

Pure: no I/O; a ``Publisher`` is frozen, each step returns a new one.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Generic, TypeVar

from .budget import Calm, held_keys, note_changes

__all__ = ["Changes", "Publisher", "WritePlan"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Changes(Generic[K]):
    """The keys that changed between two states of a published object: ``worse`` (the Node
    less attractive: must go at once) and ``better`` (more attractive, or neutral: may wait).
    A key may be in both (a label with no direction that moved: each move is a flap)."""

    worse: frozenset[K] = frozenset()
    better: frozenset[K] = frozenset()

    @classmethod
    def of(cls, worse: Iterable[K], better: Iterable[K]) -> Changes[K]:
        """``Changes`` from any two iterables of keys."""
        return cls(frozenset(worse), frozenset(better))


@dataclass(frozen=True, slots=True)
class WritePlan(Generic[K]):
    """One tick's answer for one published object: ``going`` (something goes at once: a change
    for the worse, or the writer's own reason, such as a telemetry rewrite), ``ready`` (the
    changes for the better that go now) and ``held`` (those held back: the published side
    stays)."""

    going: bool
    ready: frozenset[K]
    held: frozenset[K]


@dataclass(frozen=True, slots=True)
class Publisher(Generic[K]):
    """The write budget of one published object.

    - ``interval_s``: the budget (``OMATICAYA_MIN_PATCH_INTERVAL_S``, seconds; 0 or less: off).
    - ``calm``: each key's calm clock (only the keys that got worse lately,
      ``core.publish.budget.note_changes``).
    - ``last_write_s``: when the object was last written (the agent's monotonic seconds;
      ``None``: not yet, so nothing is held).
    """

    interval_s: float
    calm: Mapping[K, Calm] = field(default_factory=dict)
    last_write_s: float | None = None

    def noted(self, changes: Changes[K], now_s: float) -> Publisher[K]:
        """The calm clocks moved by one tick's ``changes`` (this tick's desired state against
        the last tick's, not against what is published)."""
        calm = note_changes(self.calm, changes.worse, changes.better, now_s, self.interval_s)
        return replace(self, calm=calm)

    def plan(
        self, pending: Changes[K], now_s: float, *, going: bool = False, hold: bool = True
    ) -> WritePlan[K]:
        """What goes now of the ``pending`` changes (the desired state against the published
        one): every change for the worse; each change for the better unless its key got worse
        itself within its calm window, or nothing goes this tick (no change for the worse, not
        ``going``) and the last write is under an interval old (``core.publish.budget.held_keys``).
        ``hold`` false (an annotation heartbeat: the whole state goes) holds nothing."""
        going = going or bool(pending.worse)
        if not hold:
            return WritePlan(going, pending.better, frozenset())
        held = frozenset(
            held_keys(pending.better, now_s, self.last_write_s, self.interval_s, self.calm, going)
        )
        return WritePlan(going, pending.better - held, held)

    def wrote(self, now_s: float) -> Publisher[K]:
        """After a write at ``now_s``: the budget's interval starts again."""
        return replace(self, last_write_s=now_s)

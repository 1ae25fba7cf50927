"""Say it once, say when it is over.

A problem that lasts (an API outage, a kubelet socket gone, a bad Node, a stuck tick) is logged
once when it starts, again only when it changes into another problem, and once when it ends,
never every tick or request it lasts. ``SayOnce`` keeps, per key, what holds now and since
when; the caller decides what to say (a log line, an Event, a counter) from what ``start`` and
``end`` answer. Pure: no I/O, no clock of its own, not locked (callers on several threads hold
their own lock around it and what they count with it).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Episode", "SayOnce"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Episode(Generic[V]):
    """What held for a key (``what``: a problem, an error kind, ``True``) and since when
    (``since_s``: the caller's clock, seconds; ``None`` when not given)."""

    what: V
    since_s: float | None = None


class _Whats(Mapping[K, V]):
    """A live read-only view of what holds now, per key."""

    def __init__(self, episodes: dict[K, Episode[V]]) -> None:
        self._episodes = episodes

    def __getitem__(self, key: K) -> V:
        return self._episodes[key].what

    def __iter__(self) -> Iterator[K]:
        return iter(self._episodes)

    def __len__(self) -> int:
        return len(self._episodes)

    def __contains__(self, key: object) -> bool:
        return key in self._episodes


class SayOnce(Generic[K, V]):
    """Per key, the condition that holds now, so that each is said once when it starts (or
    turns into another) and once when it is over.

    ``max_keys`` (0: no bound) bounds what is kept: past it, the key started longest ago is
    forgotten (it is said again if it comes back), so that keys from untrusted input (pod
    names, Node names) cannot grow it without end."""

    def __init__(self, max_keys: int = 0) -> None:
        self.max_keys = max_keys
        self._episodes: dict[K, Episode[V]] = {}
        #: what holds now, per key (a live read-only view)
        self.current: Mapping[K, V] = _Whats(self._episodes)

    def start(self, key: K, what: V, at_s: float | None = None) -> bool:
        """``what`` holds for ``key`` (seen at ``at_s``, the caller's clock). True when that
        is news to say: nothing held for ``key``, or something else did (a new episode from
        ``at_s``); False while the same ``what`` goes on (its start time is kept)."""
        held = self._episodes.get(key)
        if held is not None and held.what == what:
            return False
        self._episodes[key] = Episode(what, at_s)
        if self.max_keys and len(self._episodes) > self.max_keys:
            del self._episodes[next(iter(self._episodes))]
        return True

    def end(self, key: K) -> Episode[V] | None:
        """Nothing holds for ``key`` any more: the episode that ended, to say it is over, or
        ``None`` when none was on (nothing to say)."""
        return self._episodes.pop(key, None)

    def since_s(self, key: K) -> float | None:
        """When what holds for ``key`` started (``None``: nothing holds, or no time given)."""
        held = self._episodes.get(key)
        return held.since_s if held is not None else None

    def __contains__(self, key: object) -> bool:
        return key in self._episodes

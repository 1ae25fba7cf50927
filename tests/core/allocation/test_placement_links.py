"""``first_whole`` with links (issue 50 item 4): memory first, then links, each tie-break of the
rule in its docstring, table-driven over pair scores given by hand."""

from __future__ import annotations

import pytest

from omaticaya_py.core.allocation import connected
from omaticaya_py.core.allocation.placement import MEMORY_GRAIN_MIB, first_whole
from omaticaya_py.core.schema import GpuInfo

G = 80 * MEMORY_GRAIN_MIB  # free MiB of an idle GPU: 80 GiB


def _links(scores: dict[str, int]):
    """Pair scores by device names: ``{"ab": 200}``; a pair not named scores 0."""
    table = {frozenset(k): v for k, v in scores.items()}
    return lambda a, b: table.get(frozenset((a, b)), 0)


def _infos(frees: dict[str, int], unhealthy: str = "") -> dict[str, GpuInfo]:
    return {d: GpuInfo(k, f, d not in unhealthy) for k, (d, f) in enumerate(frees.items())}


CASES = [
    # (case, free MiB by device, unhealthy, count, chosen, pair scores, expected)
    ("no links: rule 1, most free first", {"a": G, "b": G + 5, "c": G}, "", 2, "", None, "ba"),
    ("links: the best pair", {"a": G, "b": G, "c": G}, "", 2, "", {"bc": 200, "ab": 10}, "bc"),
    ("fewer healthy than count: rule 1", {"a": G, "b": G}, "b", 2, "", {"ab": 300}, "ab"),
    ("an unhealthy device is no candidate", {"a": G, "b": G, "c": G}, "c", 2, "",
     {"ac": 900, "ab": 10}, "ab"),
    ("exactly count candidates: they go", {"a": G, "b": G, "c": G - 11 * MEMORY_GRAIN_MIB}, "",
     2, "", {"ac": 900}, "ab"),
    ("an eighth less free is still a candidate", {"a": G, "b": G, "c": G - 10 * MEMORY_GRAIN_MIB},
     "", 2, "", {"ac": 900}, "ac"),
    ("a CUDA context never breaks a pair", {"a": G - 119, "b": G, "c": G}, "", 2, "",
     {"ab": 1200, "bc": 20}, "ba"),
    ("free memory counts in whole GiB", {"a": G + 1023, "b": G, "c": G + 5}, "", 2, "",
     {"bc": 900}, "cb"),
    ("unknown free memory is no candidate beside known", {"a": G, "b": G, "c": -1}, "", 2, "",
     {"ac": 900}, "ab"),
    ("chosen devices count in the score", {"a": G, "b": G, "c": G}, "", 1, "x",
     {"xc": 100, "xa": 50}, "c"),
    ("pairs among chosen count alike for every set", {"a": G, "b": G}, "", 1, "xy",
     {"xy": 500, "yb": 1}, "b"),
    ("a tie of score: leave the rest best connected", {"a": G, "b": G, "c": G, "d": G}, "", 1,
     "", {"ab": 100, "cd": 300}, "a"),
    ("a tie of score and rest: the most GiB free", {"a": G, "b": G + 1024, "c": G}, "", 2, "",
     {}, "ba"),
    ("a tie of GiB: the lowest indices, not the most MiB", {"a": G, "b": G + 10, "c": G}, "",
     1, "", {}, "a"),
    ("a tie of everything: rule 1's order", {"a": G, "b": G, "c": G}, "", 2, "",
     {"ab": 5, "ac": 5, "bc": 5}, "ab"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "frees", "unhealthy", "count", "chosen", "scores", "want"),
                         CASES, ids=[c[0] for c in CASES])  # fmt: skip
def test_first_whole_with_links(case, frees, unhealthy, count, chosen, scores, want):
    infos = _infos(frees, unhealthy)
    links = None if scores is None else _links(scores)
    got = first_whole(list(frees), count, infos.__getitem__, chosen=list(chosen), links=links)
    assert "".join(got) == want, case


def test_result_is_in_rule_1_order():
    """The set is returned most free first, whatever order the combinations came in."""
    infos = _infos({"a": G, "b": G + 100, "c": G + 200})
    got = first_whole(["a", "b", "c"], 2, infos.__getitem__, links=_links({"ac": 500}))
    assert got == ["c", "a"]


def test_over_max_link_sets_the_set_grows_from_the_best_connected(monkeypatch):
    """Above ``MAX_LINK_SETS`` sets: the first is the candidate best connected to all others,
    then each the one with the highest score to those chosen; rule 1's order on a tie."""
    monkeypatch.setattr(connected, "MAX_LINK_SETS", 1)
    infos = _infos({"a": G, "b": G, "c": G, "d": G})
    links = _links({"cd": 300, "bc": 200, "ab": 100, "ad": 1})
    assert first_whole(list("abcd"), 2, infos.__getitem__, links=links) == ["c", "d"]
    assert first_whole(list("abcd"), 3, infos.__getitem__, links=links) == ["b", "c", "d"]
    # grown against the chosen devices when there are some
    got = first_whole(list("abcd"), 1, infos.__getitem__, chosen=["x"],
                      links=_links({"xa": 1, "xb": 7, "cd": 900}))  # fmt: skip
    assert got == ["b"]


def test_no_count_or_no_devices():
    infos = _infos({"a": G})
    assert first_whole(["a"], 0, infos.__getitem__, links=_links({})) == []
    assert first_whole([], 2, infos.__getitem__, links=_links({})) == []

"""``core.allocation.connected`` cases that mutation testing (``scripts/mutation``) found no test
pinned (``first_whole`` with links: test_placement_links.py), each named by the rule it pins:

- ``gib_free``: whole GiB rounded down, 0 free is known, any negative reading unknown (-1).
- ``roomy_floor``: an eighth less, rounded in the candidate's favour, a whole number.
- ``connected_set``: a tie of score goes to the set that leaves the rest best connected even
  against lower indices; a tie of everything to the lower MIG index, not to rule 1's order;
  exactly ``MAX_LINK_SETS`` sets are still all compared; a set grown one at a time comes back
  in ``ranked``'s order, grown from the lowest index on a tie; three devices already chosen.
- ``core.allocation.placement.place``: MIG devices are placed without the GPUs' links (a MIG
  device has no NVLink of its own).
"""

from __future__ import annotations

import pytest

from omaticaya_py.core.allocation import connected
from omaticaya_py.core.allocation.connected import connected_set, gib_free, roomy_floor
from omaticaya_py.core.allocation.placement import Need, place
from omaticaya_py.core.model.topology import GpuTopology, NodeTopology, PairLink
from omaticaya_py.core.schema import GpuInfo, NodeGpuState

GIB = connected.MEMORY_GRAIN_MIB
G = 80 * GIB  # free MiB of an idle GPU: 80 GiB


def _links(scores: dict[str, int]):
    """Pair scores by device names: ``{"ab": 200}``; a pair not named scores 0."""
    table = {frozenset(k): v for k, v in scores.items()}
    return lambda a, b: table.get(frozenset((a, b)), 0)


def _infos(frees: dict[str, int]) -> dict[str, GpuInfo]:
    """Healthy GPUs indexed in the order given."""
    return {d: GpuInfo(k, f, True) for k, (d, f) in enumerate(frees.items())}


# --------------------------------------------------------- gib_free, roomy_floor ----


@pytest.mark.parametrize(
    ("free_mib", "want"),
    [(0, 0), (GIB - 1, 0), (GIB, 1), (G + GIB - 1, 80), (-1, -1), (-GIB - 1, -1)],
)
def test_gib_free(free_mib, want):
    assert gib_free(GpuInfo(0, free_mib, True)) == want


@pytest.mark.parametrize(
    ("least_gib", "want"),
    [(80, 70), (81, 71), (87, 77), (8, 7), (7, 7), (1, 1), (0, 0), (-1, -1)],
)
def test_roomy_floor_is_whole_and_rounded_in_the_candidates_favour(least_gib, want):
    got = roomy_floor(least_gib)
    assert got == want and isinstance(got, int)


# ------------------------------------------------------------------ connected_set ----


def test_a_tie_of_score_leaves_the_rest_best_connected_before_the_lowest_index():
    """One GPU of four, none linked to the others it would join: taking c or d leaves the
    pair a-b (300) whole; taking a or b only c-d (100)."""
    infos = _infos(dict.fromkeys("abcd", G))
    got = connected_set(list("abcd"), 1, infos.__getitem__, [], _links({"ab": 300, "cd": 100}))
    assert got == ["c"]


def test_a_tie_of_everything_goes_to_the_lower_mig_index():
    """Two MIG devices of one GPU with as many GiB free: the lower MIG index, though rule 1
    ranks the other first (more MiB)."""
    infos = {"m1": GpuInfo(0, G + 10, True, profile="1g.10gb", mig_index=1),
             "m0": GpuInfo(0, G, True, profile="1g.10gb", mig_index=0)}  # fmt: skip
    got = connected_set(["m1", "m0"], 1, infos.__getitem__, [], _links({}))
    assert got == ["m0"]


@pytest.mark.parametrize(("limit", "want"), [(6, ["c", "d"]), (5, ["a", "b"])])
def test_max_link_sets_is_the_most_compared_whole(monkeypatch, limit, want):
    """Two of four: 6 sets. At a limit of 6 every set is compared (c-d, the best pair); below
    it the set is grown from a (best connected to the rest: 300), then its lowest-index peer."""
    monkeypatch.setattr(connected, "MAX_LINK_SETS", limit)
    infos = _infos(dict.fromkeys("abcd", G))
    links = _links({"ab": 100, "ac": 100, "ad": 100, "cd": 150})
    assert connected_set(list("abcd"), 2, infos.__getitem__, [], links) == want


def test_a_grown_set_starts_from_the_lowest_index_and_comes_back_in_ranked_order(monkeypatch):
    """No links: grown from the lowest indices (d, then c), returned most free first, not in
    any order of the devices themselves."""
    monkeypatch.setattr(connected, "MAX_LINK_SETS", 1)
    ranked = ["d", "c", "b", "a"]  # most free first, indexed 0 .. 3 in that order
    infos = _infos({"d": G + 3, "c": G + 2, "b": G + 1, "a": G})
    assert connected_set(ranked, 2, infos.__getitem__, [], _links({})) == ["d", "c"]


def test_three_devices_already_chosen():
    infos = _infos({"a": G, "b": G})
    links = _links({"xy": 500, "yz": 500, "xa": 1, "yb": 5})
    assert connected_set(["a", "b"], 1, infos.__getitem__, ["x", "y", "z"], links) == ["b"]


# ---------------------------------------------------------------- place with MIG ----


def test_mig_devices_are_placed_without_the_gpus_links():
    """A MIG device on each of three GPUs, GPUs 1 and 2 joined by NVLink: a pod of two goes
    by rule 1 (the lowest GPUs), the links are the whole GPUs'."""
    mig = tuple(GpuInfo(k, 9 * GIB, True, profile="1g.10gb", mig_index=0) for k in range(3))
    wiring = NodeTopology(tuple(GpuTopology(k) for k in range(3)),
                          {(1, 2): PairLink(nvlinks=12), (0, 1): PairLink(), (0, 2): PairLink()})  # fmt: skip
    state = NodeGpuState("n", True, "Healthy", mig=mig, topology=wiring)
    taken = place(state, Need(0, count=2, exclusive=True, profile="1g.10gb"))
    assert taken is not None and taken.migs == ((0, 0), (1, 0))
    # the same wiring does choose for whole GPUs
    whole = NodeGpuState("n", True, "Healthy", gpus=tuple(GpuInfo(k, G, True) for k in range(3)),
                         free_total_mib=3 * G, topology=wiring)  # fmt: skip
    taken = place(whole, Need(0, count=2, exclusive=True))
    assert taken is not None and taken.gpus == (1, 2)

"""Why a node fails (``scheduler.reasons``) pinned where a mutation run found no test
(``scripts/mutation``): a reason's text filled in and carrying its code, and how a reason names
the pod's need (``wanted_text``): MIG devices, one and several; whole devices asked with no
memory; memory with no device; whole devices beside slices, joined."""

from __future__ import annotations

import pytest

from omaticaya_py.scheduler.need import Need
from omaticaya_py.scheduler.reasons import Reason, ReasonText, reason_text, wanted_text

R = "omaticaya.io/gpu-memory"
WANTED = [
    (Need(5000, 1, exclusive=True, profile="1g.10gb"),
     "pod needs a MIG device 1g.10gb with 5000 MiB free"),
    (Need(5000, 2, exclusive=True, profile="1g.10gb"),
     "pod needs 2 MIG devices 1g.10gb with 5000 MiB free"),
    (Need(0, 1, exclusive=True, profile="1g.10gb"), "pod needs a MIG device 1g.10gb no container holds"),
    (Need(0, 2, exclusive=True), "pod needs 2 GPUs no container holds"),
    (Need(1000, 1, exclusive=True), "pod needs a GPU with 1000 MiB free"),
    (Need(0, 1), "pod needs a GPU with 0 MiB free"),
    (Need(0, 2, slices=(5,), exclusive=True),
     f"pod needs 2 GPUs no container holds and 5 units of {R} on one shared GPU with the slice "
     "free"),
    (Need(1000, 1, slices=(5, 10), exclusive=True),
     f"pod needs a GPU with 1000 MiB free and slices of 10 + 5 units of {R} (each on one shared "
     "GPU) with the slice free"),
]  # fmt: skip


@pytest.mark.parametrize(("need", "text"), WANTED, ids=[w[1] for w in WANTED])
def test_how_a_reason_names_the_need(need, text):
    assert wanted_text(need) == text


def test_a_reason_is_its_text_filled_in_carrying_its_code():
    text = reason_text(Reason.NO_ROOM, wanted="pod needs a GPU with 1 MiB free", prefix="p")
    assert text == "node(s) had no room: pod needs a GPU with 1 MiB free (p)"
    assert text.code is Reason.NO_ROOM
    assert isinstance(text, ReasonText)
    with pytest.raises(KeyError):
        reason_text(Reason.NO_ROOM, prefix="p")  # a field its text names is missing

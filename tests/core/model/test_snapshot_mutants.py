"""``core.model.snapshot`` cases that mutation testing (``scripts/mutation``) found no test
pinned: the MIG profile name of a GPU whose memory is not a whole number of GiB (rounded up:
an H200's 141 GiB), a half GiB rounded up as NVIDIA's tools do (``3g.71gb``, not ``3g.70gb``),
and what is refused, in so many words."""

from __future__ import annotations

import pytest

from omaticaya_py.core.model.snapshot import mig_profile_name

MIB = 1 << 20
GIB = 1 << 30
H200_TOTAL_BYTES = 143771 * MIB  # 140.4 GiB: 141 GiB rounded up, NVIDIA's "141GB"


@pytest.mark.parametrize(
    ("gi", "ci", "mib", "total", "name"),
    [
        (7, 7, 140_000, H200_TOTAL_BYTES, "7g.141gb"),  # the whole GPU: 141, not 140.4
        (3, 3, 70_000, H200_TOTAL_BYTES, "3g.71gb"),  # half of 141: 70.5 up
        (4, 4, 70_000, H200_TOTAL_BYTES, "4g.71gb"),
        (2, 2, 35_000, H200_TOTAL_BYTES, "2g.35gb"),  # a quarter: 35.25
        (1, 1, 16_000, H200_TOTAL_BYTES, "1g.18gb"),  # an eighth: 17.625
        (1, 1, 0, 1, "1g.0gb"),  # one byte is positive: refused only at 0 (an absurd GPU)
    ],
)
def test_mig_profile_names_of_an_odd_number_of_gib(gi, ci, mib, total, name) -> None:
    assert mig_profile_name(gi, ci, mib, total) == name


@pytest.mark.parametrize(
    "args",
    [(0, 1, 9984, 80 * GIB), (1, 0, 9984, 80 * GIB), (1, -1, 9984, 80 * GIB), (1, 1, 9984, -1)],
)
def test_what_mig_profile_name_refuses(args) -> None:
    with pytest.raises(ValueError) as raised:
        mig_profile_name(*args)
    assert str(raised.value) == "MIG slice counts and the parent's memory must be positive"

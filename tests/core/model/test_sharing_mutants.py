"""``core.model.sharing`` cases that mutation testing (``scripts/mutation``) found no test
pinned: indices given as numbers (their range, their error), the edges of a GPU UUID's and a
unit ID's length, how much of a bad part an error quotes, a GPU shared by its UUID alone, the
moved indices past one never seen, a persisted index of four digits, the edges of units and
slices, the sort key of a GPU whose free memory is unknown, over-use episodes, and what the
sharing objects say of themselves."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from omaticaya_py.core.model.sharing import (
    SHARED_GPUS_FORM,
    IndexMoved,
    SharedGpus,
    Sharing,
    device_order,
    episodes,
    is_shared,
    moved_indices,
    parse_indices,
    parse_shared_gpus,
    parse_unit_id,
    slice_mib,
    unit_count,
    unit_gpu,
)
from tests.helpers import gpu

A = "GPU-4a1b2c3d-1111-2222-3333-444455556666"
B = "GPU-9c8d7e6f-aaaa-bbbb-cccc-ddddeeeeffff"


# --- OMATICAYA_SHARED_GPUS ----------------------------------------------------------------------


def test_indices_given_as_numbers_are_taken_from_0_to_1023() -> None:
    assert parse_shared_gpus([0, 1023, 5]) == SharedGpus(indices=frozenset({0, 5, 1023}))
    assert parse_shared_gpus(()) == SharedGpus()


@pytest.mark.parametrize("value", [[1024], [-1], [0, "1"], [2.0]])
def test_indices_given_as_numbers_out_of_range_say_the_form(value) -> None:
    with pytest.raises(ValueError) as raised:
        parse_shared_gpus(value)
    assert str(raised.value) == f"expected {SHARED_GPUS_FORM}"


def test_a_gpu_uuid_of_80_characters_is_one_and_of_81_is_not() -> None:
    longest = "gpu-" + "a" * 76
    assert parse_shared_gpus(longest) == SharedGpus(uuids=frozenset({longest}))
    with pytest.raises(ValueError, match="not a GPU UUID"):
        parse_shared_gpus(longest + "a")


@pytest.mark.parametrize(
    ("part", "quoted", "tail"),
    [
        ("gpu-" + "z" * 60, 48, ", not a GPU UUID"),
        ("x" * 40, 32, ""),
        ("0-" + "9" * 40, 32, ""),
    ],
)
def test_an_error_quotes_the_start_of_the_bad_part(part, quoted, tail) -> None:
    with pytest.raises(ValueError) as raised:
        parse_shared_gpus(part)
    assert str(raised.value).endswith(f"{part[:quoted]!r}{tail}")


def test_a_gpu_is_shared_by_its_uuid_at_an_index_not_listed() -> None:
    sharing = Sharing(parse_shared_gpus(f"{A},7"))
    assert is_shared(gpu(3, uuid=A), sharing)
    assert not is_shared(gpu(3, uuid=B), sharing)
    assert not is_shared(gpu(3, uuid=A, mig_enabled=True), sharing)
    assert not is_shared(gpu(3, uuid=A), None)


def test_the_sharing_objects_say_whether_they_share_anything() -> None:
    assert SharedGpus(uuids=frozenset({A.lower()}))
    assert SharedGpus(indices=frozenset({0}))
    assert not SharedGpus()
    assert not Sharing() and Sharing(SharedGpus(all=True))
    assert not Sharing(SharedGpus(), 512)


def test_sharing_of_the_settings_takes_both() -> None:
    gpus = SharedGpus(all=True)
    assert Sharing.of(SimpleNamespace(shared_gpus=gpus, share_unit_mib=512)) == Sharing(gpus, 512)


# --- indices that moved -------------------------------------------------------------------------


def test_an_index_never_seen_does_not_end_the_check() -> None:
    shared = SharedGpus(indices=frozenset({0, 1, 2}))
    moved = moved_indices(shared, {1: A, 2: B}, {1: B, 2: B})  # 0: not in before
    assert moved == [IndexMoved(1, A, B)]


def test_the_message_of_an_index_with_no_gpu_now() -> None:
    assert IndexMoved(2, A, None).message() == (
        f"OMATICAYA_SHARED_GPUS names GPU index 2, which was GPU {A} at the last start and is "
        "no GPU now (a GPU lost or added renumbered the indices): sharing follows the index; "
        "name GPUs by UUID to keep sharing on the same GPU"
    )
    assert f"is GPU {B} now" in IndexMoved(2, A, B).message()


def test_a_persisted_index_of_four_digits_is_read_and_of_five_is_not() -> None:
    doc = {"version": 1, "gpus": {"1023": A, "9999": B, "10000": B}}
    assert parse_indices(doc) == {1023: A, 9999: B}


# --- units and slices ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total_mib", "unit_mib", "units"),
    [(1, 1, 1), (5, 1, 5), (1024, 0, 0), (1024, -1, 0), (0, 1024, 0), (-1, 1024, 0)],
)
def test_unit_count_at_its_edges(total_mib, unit_mib, units) -> None:
    assert unit_count(total_mib, unit_mib) == units


def test_a_slice_of_no_unit_or_fewer_is_no_memory() -> None:
    assert (slice_mib(0, 1024), slice_mib(-3, 1024), slice_mib(2, 1024)) == (0, 0, 2048)


def test_a_unit_id_of_256_characters_is_read_and_of_257_is_not() -> None:
    uuid = "GPU-" + "a" * 249
    assert parse_unit_id(uuid + "::7") == (uuid, 7)  # 256 characters
    assert parse_unit_id(uuid + "a::7") is None
    assert unit_gpu(uuid + "::7") == uuid
    assert unit_gpu(A) is None  # a whole GPU's ID names no unit


# --- the order of whole GPUs --------------------------------------------------------------------


def test_a_gpu_whose_free_memory_is_unknown_sorts_as_one_mib_short() -> None:
    """After every GPU with memory free (none included), before an unhealthy one."""
    order = sorted([(True, None, 0), (True, 0, 1), (True, 10, 2), (False, 100, 3)],
                   key=lambda a: device_order(*a))  # fmt: skip
    assert [i for *_, i in order] == [2, 1, 0, 3]
    assert device_order(True, None, 4) == device_order(True, -1, 4) == (False, 1, 4)


# --- over-use episodes --------------------------------------------------------------------------


def test_episodes_start_for_the_new_keys_once_and_end_for_the_gone() -> None:
    started, ongoing = episodes(frozenset({"a", "b"}), ["c", "b", "c", "d"])
    assert started == ["c", "d"]  # once each, in the order met
    assert ongoing == frozenset({"b"})  # "a" is over
    assert episodes(frozenset(), []) == ([], frozenset())

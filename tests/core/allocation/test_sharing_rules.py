"""GPU sharing by memory: the pure rules (core/model/sharing.py) and their settings."""

from __future__ import annotations

import pytest

from omaticaya_py.core.config.settings import SettingsError, load_settings
from omaticaya_py.core.model.sharing import (
    SharedGpus,
    parse_shared_gpus,
    parse_unit_id,
    unit_count,
    unit_id,
    unit_ids,
)


@pytest.mark.parametrize(
    ("value", "shared", "not_shared"),
    [
        ("", (), (0, 7)),
        ("none", (), (0,)),
        ("all", (0, 7, 1023), ()),
        ("ALL", (0, 7), ()),
        ("0,1,2,3", (0, 1, 2, 3), (4, 7)),
        ("0-3", (0, 1, 2, 3), (4,)),
        ("0-1 6", (0, 1, 6), (2, 5, 7)),
        (" 5 , 2 ", (2, 5), (0, 3)),
        ("3-3", (3,), (2, 4)),
    ],
)
def test_shared_gpus_forms(value, shared, not_shared):
    got = parse_shared_gpus(value)
    assert all(got.shares(i, None) for i in shared)
    assert not any(got.shares(i, None) for i in not_shared)


A = "GPU-4a1b2c3d-1111-2222-3333-444455556666"
B = "GPU-9c8d7e6f-aaaa-bbbb-cccc-ddddeeeeffff"


# (value, (index, UUID) of GPUs shared, of GPUs not shared): a GPU named by UUID is shared at
# any index (a reboot that lost a GPU renumbers it), one named by index at that index only
@pytest.mark.parametrize(
    ("value", "shared", "not_shared"),
    [
        (A, [(0, A), (3, A), (None, A), (3, A.lower())], [(0, B), (0, None)]),
        (A.lower(), [(5, A)], [(5, B)]),
        (f"{A},{B}", [(0, A), (1, B)], [(0, "GPU-other")]),
        (f"{A} 2", [(7, A), (2, B), (2, None)], [(3, B), (0, None)]),
        ("all", [(0, A), (9, None)], []),
        ("1", [(1, B)], [(0, A)]),
    ],
)  # fmt: skip
def test_shared_gpus_by_uuid(value, shared, not_shared):
    got = parse_shared_gpus(value)
    assert all(got.shares(i, u) for i, u in shared), shared
    assert not any(got.shares(i, u) for i, u in not_shared), not_shared


@pytest.mark.parametrize("value", ["x", "-1", "3-1", "0-1024", "gpu0", "1.5", "0,,a", "GPU-xyz",
                                   "GPU-", "GPU-1a2b/3", "GPU-" + "a" * 80])  # fmt: skip
def test_shared_gpus_bad_forms_name_the_form(value):
    with pytest.raises(ValueError, match=r"'all', GPU UUIDs like .* or GPU indices"):
        parse_shared_gpus(value)


def test_shared_gpus_str_round_trips():
    for value in ("none", "all", "0,1,6", f"0,{A},{B}"):
        assert str(parse_shared_gpus(value)) == value
    assert not SharedGpus() and SharedGpus(all=True)


@pytest.mark.parametrize(
    ("total_mib", "unit_mib", "units"),
    [(81559, 1024, 79), (81920, 1024, 80), (1023, 1024, 0), (None, 1024, 0), (0, 1024, 0),
     (-5, 1024, 0), (81559, 2048, 39), (40960, 10240, 4)],
)  # fmt: skip
def test_unit_count(total_mib, unit_mib, units):
    assert unit_count(total_mib, unit_mib) == units


@pytest.mark.parametrize(
    ("device_id", "parsed"),
    [
        ("GPU-abc::0", ("GPU-abc", 0)),
        ("GPU-abc::78", ("GPU-abc", 78)),
        ("GPU-a::b::3", ("GPU-a::b", 3)),
        ("GPU-abc", None),
        ("GPU-abc::", None),
        ("GPU-abc::01", None),
        ("GPU-abc::-1", None),
        ("::3", None),
        ("GPU-" + "x" * 300 + "::1", None),
        ("MIG-1234", None),
    ],
)
def test_unit_ids_name_their_gpu(device_id, parsed):
    assert parse_unit_id(device_id) == parsed


def test_unit_ids_round_trip():
    ids = unit_ids("GPU-1", 3)
    assert ids == ["GPU-1::0", "GPU-1::1", "GPU-1::2"]
    assert [parse_unit_id(i) for i in ids] == [("GPU-1", k) for k in range(3)]
    assert unit_id("GPU-9", 7) == "GPU-9::7"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"OMATICAYA_SHARED_GPUS": "gpu0"}, "OMATICAYA_SHARED_GPUS='gpu0': expected 'none'"),
        ({"OMATICAYA_SHARE_UNIT_MIB": "0"}, "OMATICAYA_SHARE_UNIT_MIB='0'"),
        ({"OMATICAYA_DEVICE_LIST_STRATEGY": "volumes"},
         "OMATICAYA_DEVICE_LIST_STRATEGY='volumes': expected one or more of envvar"),
        ({"OMATICAYA_DEVICE_LIST_STRATEGY": ""}, "OMATICAYA_DEVICE_LIST_STRATEGY=''"),
        ({"OMATICAYA_SHARED_RESOURCE": "gpu-memory"}, "OMATICAYA_SHARED_RESOURCE='gpu-memory'"),
        ({"OMATICAYA_SHARED_RESOURCE": "nvidia.com/gpu"},
         "OMATICAYA_SHARED_RESOURCE must differ from OMATICAYA_DEVICE_PLUGIN_RESOURCE"),
    ],
)  # fmt: skip
def test_bad_sharing_settings_name_the_variable(monkeypatch, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert message in str(err.value)


def test_sharing_settings_defaults_and_forms(monkeypatch):
    s = load_settings()
    assert not s.shared_gpus and s.share_unit_mib == 1024
    assert s.shared_resource == "omaticaya.io/gpu-memory"
    assert s.device_list_strategy == ("envvar", "volume-mounts")
    monkeypatch.setenv("OMATICAYA_SHARED_GPUS", "0-3")
    monkeypatch.setenv("OMATICAYA_DEVICE_LIST_STRATEGY", "cdi-cri, envvar,cdi-cri")
    s = load_settings()
    assert [s.shared_gpus.shares(i, None) for i in range(5)] == [True] * 4 + [False]
    assert s.device_list_strategy == ("cdi-cri", "envvar")

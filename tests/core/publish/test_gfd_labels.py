"""GPU Feature Discovery's names and meanings (issue 30): a selector copied from GFD
(``nvidia.com/...``, moved under our prefix) matches the same nodes on our labels.

- ``gpu.family`` is GFD's word: compute capability 8.9 is ``ada-lovelace`` (it was ``ada``);
- the driver version and the CUDA version sit under GFD's current keys with GFD's meanings:
  ``cuda.driver-version.{major,minor,revision,full}`` is the display driver
  (``nvmlSystemGetDriverVersion``, 580.65.06 -> 580, 65, 06), ``cuda.runtime-version.{major,
  minor,full}`` the CUDA version it supports (``nvmlSystemGetCudaDriverVersion_v2``, 13000 ->
  13, 0, 13.0). Our old ``cuda.driver.major/minor`` held the CUDA version, where GFD's legacy
  key of that name holds the driver's: they are gone, and an upgraded agent removes them from
  a Node an older one labelled;
- docs/labels.md and the README document each key with its NVML source, and the upgrade note.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from omaticaya_py.core.model.snapshot import ARCHITECTURES
from omaticaya_py.core.publish.budget import urgent
from omaticaya_py.core.publish.patch import NodeMeta, apply_patch, diff
from omaticaya_py.core.publish.render import driver_version_parts, render
from omaticaya_py.core.rules.health import assess
from omaticaya_py.sources.replay import TraceReader
from tests.helpers import H100_TRACE, VERSIONS, gpu, prefixed, rendered_labels, settings, snapshot

ROOT = Path(__file__).resolve().parents[3]
P = "omaticaya.io/"
#: the keys this project wrote before (holding the CUDA version): gone
OLD_KEYS = ("cuda.driver.major", "cuda.driver.minor")
DRIVER_KEYS = tuple(f"cuda.driver-version.{p}" for p in ("major", "minor", "revision", "full"))
CUDA_KEYS = tuple(f"cuda.runtime-version.{p}" for p in ("major", "minor", "full"))


def short(labels: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix(P): v for k, v in labels.items()}


# ------------------------------------------------------------------------------ gpu.family

#: NVML architecture (``NVML_DEVICE_ARCH_*``), a compute capability of it, and the family GFD
#: writes for that compute capability (k8s-device-plugin, internal/lm/resource.go getArchFamily)
GFD_FAMILIES = [
    (2, (3, 5), "kepler"),
    (3, (5, 2), "maxwell"),
    (4, (6, 0), "pascal"),
    (5, (7, 0), "volta"),
    (6, (7, 5), "turing"),
    (7, (8, 0), "ampere"),
    (7, (8, 6), "ampere"),
    (8, (8, 9), "ada-lovelace"),
    (9, (9, 0), "hopper"),
    (10, (10, 0), "blackwell"),
    (10, (12, 0), "blackwell"),
]


@pytest.mark.parametrize(("arch", "cc", "family"), GFD_FAMILIES, ids=[f"{a}-{c[0]}.{c[1]}" for a, c, _ in GFD_FAMILIES])
def test_family_is_gfds_word_through_the_nvml_architecture(tmp_path, arch, cc, family) -> None:
    """A GPU whose NVML architecture is ``arch`` (as a recorded trace holds it) is labelled
    with the family GFD gives its compute capability: an L4 (Ada, 8.9) is ``ada-lovelace``."""
    trace = json.loads(H100_TRACE.read_text())
    trace["devices"][0].update(architecture=arch, cuda_compute_capability=list(cc))
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    snap = TraceReader(path, at_s=0.0, window_s=0.0).read()
    desired = render(snap, assess(snap), settings())
    assert not desired.dropped
    labels = short(desired.labels)
    assert labels["gpu.family"] == family
    assert (labels["gpu.compute.major"], labels["gpu.compute.minor"]) == tuple(map(str, cc))


def test_ada_is_ada_lovelace_not_ada() -> None:
    assert ARCHITECTURES[8] == "ada-lovelace"
    assert "ada" not in ARCHITECTURES.values()


# ------------------------------------------------------------------ driver and CUDA versions


def test_driver_and_cuda_versions_under_gfds_keys_and_meanings() -> None:
    """Driver 580.65.06 supporting CUDA 13.0: ``cuda.driver-version.*`` is the driver (580, not
    the CUDA version 13), ``cuda.runtime-version.*`` the CUDA version; the old keys are gone."""
    labels = short(rendered_labels(snapshot(gpu(0), driver="580.65.06", cuda=(13, 0))))
    versions = {k: v for k, v in labels.items() if k.startswith("cuda.")}
    assert versions == {
        "cuda.driver-version.major": "580",
        "cuda.driver-version.minor": "65",
        "cuda.driver-version.revision": "06",  # text, as GFD keeps it: not 6
        "cuda.driver-version.full": "580.65.06",
        "cuda.runtime-version.major": "13",
        "cuda.runtime-version.minor": "0",
        "cuda.runtime-version.full": "13.0",
    }
    assert not set(OLD_KEYS) & labels.keys()


def test_the_recorded_h100_trace_gives_its_driver_and_cuda_versions() -> None:
    """Through the replay reader: the trace's ``driver_version`` 580.159.04 and
    ``cuda_driver_version`` 13000 (as NVML gives them)."""
    snap = TraceReader(H100_TRACE, at_s=0.0, window_s=0.0).read()
    labels = short(render(snap, assess(snap), settings()).labels)
    assert {k: labels[k] for k in DRIVER_KEYS + CUDA_KEYS} == VERSIONS


def test_a_driver_version_of_two_parts_has_no_revision() -> None:
    """GFD writes the revision of ``535.54`` empty; the agent writes no empty value (render
    would drop it as bad), so the key is absent and nothing is dropped."""
    desired = render(s := snapshot(gpu(0), driver="535.54", cuda=(12, 2)), assess(s), settings())
    assert not desired.dropped
    labels = short(desired.labels)
    assert "cuda.driver-version.revision" not in labels
    assert [labels.get(k) for k in DRIVER_KEYS] == ["535", "54", None, "535.54"]
    assert [labels[k] for k in CUDA_KEYS] == ["12", "2", "12.2"]


@pytest.mark.parametrize("driver", [None, "", "580", "580.65.06.1"])
def test_no_driver_version_or_one_not_x_y_z_gives_no_driver_labels(driver) -> None:
    """GFD refuses a driver version that is not ``X.Y[.Z]``; we leave its keys out (and keep
    the CUDA version), never a guess."""
    desired = render(s := snapshot(gpu(0), driver=driver), assess(s), settings())
    assert not desired.dropped
    labels = short(desired.labels)
    assert not set(DRIVER_KEYS) & labels.keys()
    assert labels["cuda.runtime-version.major"] == "13"


def test_no_cuda_version_gives_no_runtime_labels() -> None:
    labels = short(rendered_labels(snapshot(gpu(0), cuda=None)))
    assert not set(CUDA_KEYS) & labels.keys()
    assert labels["cuda.driver-version.major"] == "580"


@pytest.mark.parametrize(
    ("text", "parts"),
    [("580.65.06", ("580", "65", "06")), ("535.54", ("535", "54", "")), ("580", None),
     ("1.2.3.4", None), (None, None), ("", None)],
)  # fmt: skip
def test_driver_version_parts(text, parts) -> None:
    assert driver_version_parts(text) == parts


# ------------------------------------------------------------------------------- upgrading


def test_an_upgraded_agent_removes_the_old_keys_from_a_node_an_older_one_labelled() -> None:
    """The Node as the previous version left it on an L4 (``gpu.family=ada``,
    ``cuda.driver.major/minor`` = the CUDA version) beside GFD's own labels: the first patch of
    the upgraded agent removes the old keys, writes the new ones and GFD's word for the family,
    leaves every key outside the prefix alone, and is urgent (not held by the write budget)."""
    snap = snapshot(gpu(0, product="NVIDIA L4", architecture=ARCHITECTURES[8], compute_major=8,
                        compute_minor=9, memory_total_mib=23034, memory_free_mib=22000),
                    driver="580.65.06", cuda=(13, 0))  # fmt: skip
    desired = render(snap, assess(snap), settings())
    old = {
        **{k: v for k, v in desired.labels.items() if not k.startswith(P + "cuda.")},
        P + "gpu.family": "ada",
        P + "cuda.driver.major": "13",
        P + "cuda.driver.minor": "0",
    }
    gfd = {"nvidia.com/cuda.driver.major": "580", "nvidia.com/cuda.runtime.major": "13",
           "nvidia.com/gpu.family": "ada-lovelace"}  # fmt: skip
    node = NodeMeta(name="gpu-node-1", labels={**old, **gfd}, annotations=desired.annotations)
    patch = diff(desired.labels, desired.annotations, node, "omaticaya.io")
    assert patch is not None
    changes = patch["metadata"]["labels"]
    assert {k: v for k, v in changes.items() if v is None} == prefixed(dict.fromkeys(OLD_KEYS)), changes
    assert changes[P + "gpu.family"] == "ada-lovelace"
    assert {k.removeprefix(P) for k, v in changes.items() if v is not None} == {
        "gpu.family", *DRIVER_KEYS, *CUDA_KEYS,
    }
    after = apply_patch(node, patch)
    assert after.labels == {**desired.labels, **gfd}
    assert urgent(old, desired.labels)
    # our family now reads as GFD's, key for key under the two prefixes
    assert after.labels[P + "gpu.family"] == after.labels["nvidia.com/gpu.family"]
    assert after.labels[P + "cuda.driver-version.major"] == "580"
    assert after.labels[P + "cuda.runtime-version.major"] == "13"


# ------------------------------------------------------------------------------------ docs


def _row(path: Path, key: str) -> str:
    """The label-table row of ``path`` whose first cell names ``key``."""
    for line in path.read_text().splitlines():
        if line.startswith("|") and f"`{key}`" in line.split("|")[1]:
            return line
    raise AssertionError(f"{path.name}: no label-table row for {key}")


@pytest.mark.parametrize(
    ("keys", "source"),
    [(DRIVER_KEYS, "nvmlSystemGetDriverVersion"), (CUDA_KEYS, "nvmlSystemGetCudaDriverVersion_v2")],
    ids=["driver-version", "runtime-version"],
)
def test_docs_name_each_version_key_with_its_nvml_source(keys, source) -> None:
    doc = ROOT / "docs" / "labels.md"
    for key in keys:
        row = _row(doc, key)
        assert f"`{source}`" in row, row


def test_docs_say_ada_lovelace_and_the_old_keys_only_in_the_upgrade_note() -> None:
    """The old keys appear in docs/labels.md only in its upgrade note, which names them and
    what replaced them; the README's table has the new keys."""
    doc = (ROOT / "docs" / "labels.md").read_text()
    assert "`ada-lovelace`" in doc
    head, _, note = doc.partition("## Upgrade notes")
    assert note, "docs/labels.md has no upgrade notes"
    for key in OLD_KEYS:
        assert key not in head
        assert f"`{key}`" in note
    for key in ("cuda.driver-version.major", "cuda.runtime-version.major", "ada-lovelace"):
        assert key in note
    readme = (ROOT / "README.md").read_text()
    assert not re.search(r"`cuda\.driver\.(major|minor)`", readme)
    for key in ("cuda.driver-version.major", "cuda.runtime-version.major"):
        _row(ROOT / "README.md", key)

"""What a pod's containers ask for (``scheduler.container_asks``) pinned where a mutation run
found no test (``scripts/mutation``): the whole ``Asks`` of a malformed pod (what was read
before the bad value, the text naming the container's kind and the value), the length limit
of a quantity, how a value is cut for a message, the memory of a slice that three containers
reuse. Table-driven; each row names what it pins.
"""

from __future__ import annotations

from typing import Any

import pytest

from omaticaya_py.scheduler.container_asks import Asks, container_asks, held_groups, shown_value

R = "omaticaya.io/gpu-memory"


def c(name: str, n: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": {R: n}}, **extra}


def pod(app: list[Any], init: list[Any] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return {"spec": {"initContainers": list(init), "containers": list(app)}}


ASKS = [
    ("a malformed app container: what was read before it kept, its kind named",
     pod([c("a", 5), c("b", "1.5")], [c("i", 3)]),
     Asks(((3, False),), (5,), f"pod container 'b' asks for {R}='1.5'")),
    ("a malformed init container", pod([c("a", 5)], [c("s", 2, restartPolicy="Always"),
                                                      c("i", "-1")]),
     Asks(((2, True),), (), f"pod init container 'i' asks for {R}='-1'")),
    ("a container asking for none hides none after it",
     pod([{"name": "x"}, c("a", 5)], [{"name": "j"}, c("i", 3)]), Asks(((3, False),), (5,))),
    ("a quantity of 64 characters is read", pod([c("a", "0" * 62 + "1k")]), Asks((), (1000,))),
    ("one of 65 is not", pod([c("a", "0" * 63 + "1k")]),
     Asks((), (), f"pod container 'a' asks for {R}={'0' * 40 + '...'!r}")),
]  # fmt: skip


@pytest.mark.parametrize(("case", "doc", "asks"), ASKS, ids=[a[0] for a in ASKS])
def test_each_pod_gets_its_whole_asks(case, doc, asks):
    assert container_asks(doc, R) == asks, case


def test_a_value_is_cut_to_forty_characters_for_a_message():
    assert shown_value("x" * 40) == repr("x" * 40)
    assert shown_value("x" * 41) == repr("x" * 40 + "...")


def test_a_slice_reused_by_three_containers_counts_each_of_theirs_in_memory():
    """A 20-unit plain init container, then three 5-unit app containers on its units: 20 units
    held on one GPU, 15 of them counting in its memory once the pod is admitted (the init
    container is over; each app container's 5 are its own for the pod's life)."""
    assert held_groups((5, 5, 5), ((20, False),)) == ((20,), (20,), (15,))
    assert held_groups((5, 5, 5, 5), ((20, False),)) == ((20,), (20,), (20,))


def test_units_left_for_reuse_are_on_the_last_plain_init_containers_gpu():
    """A plain init container of 10 units, a second of 5 reusing them, a sidecar of 10 taking
    them all, then a plain init container of 4 on a GPU of its own: the app container after it
    reuses that one's 4 units, on its GPU (the second slice), not the first's."""
    init = ((10, False), (5, False), (10, True), (4, False))
    assert held_groups((6,), init) == ((10, 6), (10, 4), (10, 6))

"""``views.top.NodeFeed``: ``omaticaya top``'s Nodes through the one list+watch (a
``kube.NodeCache``), on the real kube-apiserver; and when it gives up before the first LIST."""

from __future__ import annotations

import os

import pytest

from omaticaya_py.kube import KubeForbidden, KubeUnavailable
from omaticaya_py.views.top import RBAC, NodeFeed, TopOptions
from tests.waiting import wait_for


@pytest.mark.cluster
def test_the_feed_lists_then_follows_changes_of_the_selected_nodes(dev_cluster, admin_api,
                                                                   make_node):
    tag = f"feed-{os.getpid()}"
    one = make_node(labels={"omaticaya-test": tag})
    make_node(labels={"omaticaya-test": "other"})
    feed = NodeFeed(TopOptions(selector=f"omaticaya-test={tag}",
                               kubeconfig=str(dev_cluster.kubeconfig)))
    try:
        assert set(feed.start(wait_s=30)) == {one}
        assert feed.changes(0.05) == []  # the first LIST's own changes are in the snapshot
        two = make_node(labels={"omaticaya-test": tag})
        admin_api.patch_node(one, {"metadata": {"annotations": {"x": "1"}}})
        seen: dict = {}

        def follow():
            for name, node in feed.changes(0.5):
                seen[name] = node
            return two in seen and one in seen and seen[one].annotations.get("x") == "1"

        wait_for("both changes through the watch", follow, 30)
        admin_api.delete_node(two)

        def gone():
            for name, node in feed.changes(0.5):
                seen[name] = node
            return seen[two] is None

        wait_for("the deletion", gone, 30)
    finally:
        feed.close()


class _Cache:
    """A stand-in ``NodeCache`` (the real one above) that never syncs and reports ``errors``
    through ``on_error`` when started; records what it was built with."""

    def __init__(self, errors):
        self.errors, self.built = errors, {}

    def __call__(self, transform, **kwargs):
        self.built = kwargs
        return self

    def start(self):
        for err in self.errors:
            self.built["on_error"](err)

    synced = False

    def wait_synced(self, timeout_s):
        return False


def test_the_feed_asks_for_the_selected_nodes_and_says_what_top_needs():
    cache = _Cache([])
    NodeFeed(TopOptions(selector="a=b", context="c"), factory=cache)
    assert cache.built["query"] == {"labelSelector": "a=b"} and cache.built["context"] == "c"
    assert cache.built["rbac"] == RBAC == "omaticaya top needs list and watch on nodes"
    NodeFeed(TopOptions(), factory=cache)
    assert cache.built["query"] == {}


@pytest.mark.parametrize(
    ("errors", "wait_s", "raised"),
    [
        # refused: at once (a wait of 600 s would fail the test by its timeout)
        ([KubeForbidden("list nodes: HTTP 403", status=403)], 600, "list nodes: HTTP 403"),
        # transient: waits for the retries until wait_s, then the last one
        ([KubeUnavailable("list nodes: refused"), KubeUnavailable("list nodes: 503", status=503)],
         0.2, "list nodes: 503"),
        ([], 0.2, "list nodes: no answer in 0.2s"),
    ],
)
def test_before_the_first_list_a_refusal_ends_at_once_and_no_answer_after_wait_s(
    errors, wait_s, raised
):
    feed = NodeFeed(TopOptions(), factory=_Cache(errors))
    with pytest.raises((KubeForbidden, KubeUnavailable), match=raised):
        feed.start(wait_s=wait_s)

"""What other test files share of test_preemption_cluster.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

import re
from typing import Any

from tests.scheduler.scheduling_cluster_support import (  # noqa: F401  (api: a module fixture)
    EXAMPLES,
    api,
    schedulable,
    unschedulable_message,
)


def server_minor(core: Any) -> int:
    """The API server's minor version from ``/version`` (``"37"``, or ``"37+"`` on some
    distributions); the dev cluster runs kube-scheduler of the same release."""
    from kubernetes import client

    return int(re.sub(r"\D", "", client.VersionApi(core.api_client).get_code().minor))

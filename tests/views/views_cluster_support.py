"""What other test files share of test_views_cluster.py (moved here so that no test file imports another: issue 49)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import token_kubeconfig


def _token_kubeconfig(dev_cluster, admin_api, tmp_path: Path, sa: str) -> Path:
    admin_api.create_namespaced_service_account("default", {"metadata": {"name": sa}})
    token = admin_api.create_namespaced_service_account_token(
        sa, "default", {"spec": {"audiences": [], "expirationSeconds": 600}}
    ).status.token
    return token_kubeconfig(dev_cluster, token, tmp_path / f"{sa}.kubeconfig")

"""Kubernetes resource quantities (``30Gi``, ``1.5Gi``) by the official client's parser."""

from __future__ import annotations

from typing import Any

__all__ = ["parse_quantity"]


def parse_quantity(text: str) -> Any:
    """A Kubernetes resource quantity (``30Gi``, ``1.5Gi``, ``30G``, ``512Mi``, ``100m``) as a
    ``decimal.Decimal`` in base units, by the official client's parser
    (``kubernetes.utils.parse_quantity``). Raises ``ValueError`` for text that is not a
    quantity."""
    from kubernetes.utils.quantity import parse_quantity as parse

    try:
        return parse(text)
    except (ValueError, ArithmeticError) as exc:
        raise ValueError(f"not a quantity: {text!r}") from exc

"""Kubernetes API failures as our own exceptions, and which of them are worth another try.

Failures are raised as ``KubeError`` and subclasses (the client's exception chained as
``__cause__``), so that nothing above ``kube/`` handles library types. Transient failures
(connection refused or reset, timeouts, 429, 5xx, and 409 for a PATCH or PUT, never for a
create) are retried by ``ApiSession`` with exponential backoff and full jitter (tenacity),
never sooner than a ``Retry-After``; a 401 reloads the credentials once; 403 and 404 are not
retried.

The classes split the answers as kopf's ``clients/errors.py`` does: ``KubeUnauthorized`` (401),
``KubeForbidden`` (403; 401 is one too, so that a caller pausing on any refusal catches one
type), ``KubeNotFound`` (404, for any kind of object), ``KubeConflict`` (409) and
``KubeTooManyRequests`` (429), both ``KubeUnavailable`` (worth another try), ``KubeRejected``
(any other 4xx). What RBAC a refused request needed is said by the caller, which knows what it
asked for (``wrap``'s ``rbac``, ``ApiSession.call``'s), never guessed here.
"""

from __future__ import annotations

import json
import re

import tenacity
from kubernetes.client.exceptions import ApiException

__all__ = [
    "KubeConflict",
    "KubeError",
    "KubeForbidden",
    "KubeNotFound",
    "KubeRejected",
    "KubeTooManyRequests",
    "KubeUnauthorized",
    "KubeUnavailable",
    "RetryWait",
    "is_transient",
    "wrap",
]

_TRANSIENT_STATUS = frozenset({409, 429, 500, 502, 503, 504})


class KubeError(RuntimeError):
    """A Kubernetes API request failed. ``status`` is the HTTP status (``None`` when no answer
    came back); ``verb`` names the operation (``get``, ``patch``, ``create``)."""

    def __init__(self, message: str, *, status: int | None = None, verb: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.verb = verb
        self.retry_after_s: float | None = None


class KubeUnavailable(KubeError):
    """No answer, a timeout, or a transient status (409, 429, 5xx) after the retries."""


class KubeConflict(KubeUnavailable):
    """409: the object changed since it was read (an update), or exists already (a create)."""


class KubeTooManyRequests(KubeUnavailable):
    """429: the API server asks for fewer requests (its ``Retry-After`` in ``retry_after_s``)."""


class KubeForbidden(KubeError):
    """403: RBAC does not allow the request (and the base of ``KubeUnauthorized``: a refusal)."""


class KubeUnauthorized(KubeForbidden):
    """401: the credentials are wrong, expired or missing."""


class KubeNotFound(KubeError):
    """404: the object does not exist (a Node deleted or ``NODE_NAME`` wrong, a pod gone, ...)."""


class KubeRejected(KubeError):
    """Any other 4xx: the API server refused the request (a bug, not a fault to retry)."""


#: the class of each status that has one of its own
_BY_STATUS: dict[int, type[KubeError]] = {
    401: KubeUnauthorized,
    403: KubeForbidden,
    404: KubeNotFound,
    409: KubeConflict,
    429: KubeTooManyRequests,
}


def _retry_after_s(exc: ApiException) -> float | None:
    headers = getattr(exc, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


#: how the API server words a refusal by admission (not by RBAC): a ValidatingAdmissionPolicy's
#: "... with binding '...' denied request: ..." and an admission webhook's "admission webhook
#: \"...\" denied the request: ..."
_ADMISSION_DENIAL = re.compile(r"denied (the )?request")


def wrap(exc: Exception, verb: str, what: str, rbac: str = "") -> KubeError:
    """The ``KubeError`` for a failed request: by HTTP status for an ``ApiException`` (with its
    ``Retry-After``), ``KubeUnavailable`` for no answer. ``rbac``: what the caller's request
    needs (``"the agent needs get and patch on nodes"``), added to a 403's message as
    ``(RBAC: ...)``; nothing is added without it, nor to a refusal by admission (a
    ValidatingAdmissionPolicy or webhook "denied request": RBAC allowed it)."""
    if isinstance(exc, ApiException):
        status = exc.status
        reason = (exc.reason or "").strip()
        detail = ""
        try:
            detail = json.loads(exc.body or "{}").get("message", "")
        except (ValueError, AttributeError):
            pass
        message = f"{verb} {what}: HTTP {status} {reason}" + (f": {detail}" if detail else "")
        kind: type[KubeError]
        if status in _BY_STATUS:
            kind = _BY_STATUS[status]
        elif status in _TRANSIENT_STATUS or not status or status >= 500:  # 0: no answer (TLS)
            kind = KubeUnavailable
        else:
            kind = KubeRejected
        if status == 403 and rbac and not _ADMISSION_DENIAL.search(detail):
            message += f" (RBAC: {rbac})"
        err = kind(message, status=status, verb=verb)
        err.retry_after_s = _retry_after_s(exc)
        return err
    return KubeUnavailable(f"{verb} {what}: {type(exc).__name__}: {exc}", verb=verb)


#: verbs whose 409 (Conflict) is worth another attempt: an update that raced another writer
_RETRY_CONFLICT_VERBS = frozenset({"patch", "put", "update"})


def is_transient(exc: BaseException) -> bool:
    """Whether tenacity tries again: no answer, 429, 5xx; a 409 only for a PATCH or PUT. A 409
    on a create (POST) means the object exists (an earlier attempt succeeded and its answer was
    lost): another POST would only say so again."""
    if not isinstance(exc, KubeUnavailable):
        return False
    return exc.status != 409 or exc.verb in _RETRY_CONFLICT_VERBS


class RetryWait(tenacity.wait.wait_base):
    """Exponential backoff with full jitter, but never shorter than a ``Retry-After``."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self.backoff = tenacity.wait_random_exponential(multiplier=initial_s, max=max_s)

    def __call__(self, retry_state: tenacity.RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        retry_after = getattr(exc, "retry_after_s", None) or 0.0
        return max(float(retry_after), self.backoff(retry_state))

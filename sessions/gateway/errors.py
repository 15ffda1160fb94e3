"""The gateway's one exception root."""

from __future__ import annotations


class GatewayError(Exception):
    """A request the gateway refuses or an upstream that failed. ``status`` is
    the HTTP status the caller gets, ``code`` a snake_case name; ``permanent``
    is false only when the same request may succeed later (an upstream's 5xx,
    a timeout), so a caller that retries knows whether to."""

    status = 400
    code = "invalid_request"
    permanent = True

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class BadRequest(GatewayError):
    """The harness sent something malformed (from inside the sandbox: untrusted)."""


class NotFound(GatewayError):
    status = 404
    code = "not_found"


class UpstreamError(GatewayError):
    """The upstream model answered with an error, garbage, or not at all."""

    status = 502
    code = "upstream_error"
    permanent = False


class BudgetExceeded(GatewayError):
    """The agent's workspace has spent its daily budget (budget.py): a 429 in
    the caller's shape, its message starting ``budget_exceeded:``."""

    status = 429
    code = "budget_exceeded"

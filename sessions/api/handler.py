"""The shell every JSON view runs in: method check, authentication, CSRF for
browser sessions, request parsing, and errors turned into JSON.

Everything a client can get wrong becomes a 4xx {"code", "message"} here or in
sessions.commands. What is left (a bug, a database that went away) is logged
and answered with a JSON 5xx, never an HTML page.
"""

from __future__ import annotations

import logging
from functools import wraps
from typing import Any

from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import InternalError, OperationalError
from django.http import HttpRequest, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from .. import inputs, journal
from ..access import user_from_bearer
from ..commands import CommandRefused, Outcome
from .errors import ApiError, error_response

log = logging.getLogger(__name__)

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def api_view(*methods: str):
    """Wrap a view `fn(request, user, **kwargs)` so it only ever answers JSON."""
    allowed = set(methods) | ({"HEAD"} if "GET" in methods else set())

    def decorate(fn):
        @csrf_exempt  # CSRF is checked below, for session-authenticated requests only
        @wraps(fn)
        def view(request: HttpRequest, *args, **kwargs):
            try:
                if request.method not in allowed:
                    return _not_allowed(request, sorted(allowed))
                user = authenticate(request)
                return fn(request, user, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - every exception becomes JSON
                return exception_response(request, exc)

        return view

    return decorate


def authenticate(request: HttpRequest):
    """The user making the request, or an ApiError 401/403."""
    header = request.headers.get("Authorization")
    if header:
        user = user_from_bearer(header)
        if user is None:
            raise ApiError(
                401,
                "auth.invalid_token",
                "The Authorization header does not carry a valid "
                "API token (expected: Authorization: Bearer aln_…).",
            )
        return user  # a bearer token cannot be sent by a cross-site form: no CSRF check
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        raise ApiError(
            401,
            "auth.required",
            "Authentication required: send Authorization: Bearer "
            "<token> (manage.py issue_token USERNAME) or log in.",
        )
    if request.method not in SAFE_METHODS:
        _check_csrf(request)
    return user


def _check_csrf(request: HttpRequest) -> None:
    """A browser session's unsafe request must carry the CSRF token (X-CSRFToken)."""
    try:
        # Read the body first: the CSRF check may parse a form, after which it is unreadable.
        _ = request.body
        checker = CsrfViewMiddleware(lambda r: None)
        checker.process_request(request)
        refused = checker.process_view(request, None, (), {})
    except RequestDataTooBig:
        raise
    except Exception:  # a malformed form body: the token cannot be in it
        refused = True
    if refused is not None:
        raise ApiError(
            403,
            "auth.csrf_failed",
            "CSRF check failed: a session-authenticated request "
            "must send the csrftoken cookie's value in an X-CSRFToken header.",
        )


def exception_response(request: HttpRequest, exc: Exception) -> JsonResponse:
    """Map an exception to a JSON error; only the unexpected ones are logged as errors."""
    if isinstance(exc, ApiError):
        response = exc.response()
        if exc.status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="alineo"'
        return response
    if isinstance(exc, CommandRefused):
        return error_response(exc.status, exc.code, exc.message, **exc.extra)
    if isinstance(exc, RequestDataTooBig):
        return error_response(413, "request.too_large", "The request body is too large.")
    if isinstance(exc, SuspiciousOperation):
        return error_response(400, "request.invalid", "The request was refused as malformed.")
    if isinstance(exc, journal.UnknownAgent):
        return error_response(404, "agent.not_found", "No such agent.")
    # A read-only PostgreSQL refuses the first locking read with InternalError.
    if isinstance(exc, (journal.JournalUnavailable, OperationalError, InternalError)):
        log.warning("%s %s: storage unavailable: %s", request.method, request.path, exc)
        response = error_response(
            503,
            "server.unavailable",
            "The transcript store is busy or "
            "unavailable; nothing was written. Retry with the same Idempotency-Key.",
        )
        response["Retry-After"] = "1"
        return response
    log.exception("%s %s failed", request.method, request.path)
    return error_response(500, "server.error", "An unexpected error occurred; nothing was written.")


def _not_allowed(request: HttpRequest, allowed: list[str]) -> JsonResponse:
    response = error_response(
        405,
        "method.not_allowed",
        f"{request.method} is not allowed here; use {', '.join(allowed)}.",
    )
    response["Allow"] = ", ".join(allowed)
    return response


# --- request parsing --------------------------------------------------------------


def json_body(request: HttpRequest) -> Any:
    """The parsed JSON body, None when empty; ApiError 400 when it is not JSON
    we accept (sessions/inputs.py: no NaN, no 5,000-digit number, no deep nesting)."""
    raw = request.body
    if not raw.strip():
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "request.malformed_json", "The request body is not UTF-8.") from None
    try:
        return inputs.loads(text)
    except inputs.InputError as exc:  # one code for all (clients match on it), the reason in words
        what = "is not valid JSON" if exc.code == "malformed_json" else "is refused"
        raise ApiError(400, "request.malformed_json", f"The request body {what}: {exc}.") from None


def idempotency_key(request: HttpRequest) -> str | None:
    return request.headers.get("Idempotency-Key")


def query_int(
    request: HttpRequest, name: str, *, minimum: int = 0, maximum: int | None = None
) -> int | None:
    """A non-negative integer query parameter, None when absent; ApiError 400 when malformed."""
    value = request.GET.get(name)
    if value is None:
        return None
    number = inputs.cursor(value)
    if number is None:
        raise ApiError(
            400, f"{name}.invalid", f"{name} must be a non-negative integer, not {value[:40]!r}."
        )
    if number < minimum or (maximum is not None and number > maximum):
        bounds = (
            f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        )
        raise ApiError(400, f"{name}.invalid", f"{name} must be {bounds}.")
    return number


def outcome_response(outcome: Outcome) -> JsonResponse:
    response = JsonResponse(outcome.body, status=outcome.status)
    if outcome.replayed:
        response["Idempotent-Replayed"] = "true"
    return response

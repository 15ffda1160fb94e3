"""The page a client gets while django-axes has it locked out of logging in
(settings.AXES_LOCKOUT_CALLABLE): a 429 that says why and for how long, with
Retry-After, instead of a bare 403."""

from __future__ import annotations

import math

from django.conf import settings
from django.shortcuts import render


def locked_out(request, original_response=None, credentials=None):
    seconds = max(1, math.ceil(settings.AXES_COOLOFF_TIME.total_seconds()))
    context = {"failures": settings.AXES_FAILURE_LIMIT, "wait": _duration(seconds),
               "by_username": settings.AXES_LOCKOUT_PARAMETERS != ["ip_address"]}
    response = render(request, "registration/locked_out.html", context, status=429)
    response["Retry-After"] = str(seconds)
    return response


def _duration(seconds: int) -> str:
    """The cool-off in words, rounded up: '15 minutes', '1 hour', '45 seconds'."""
    if seconds % 3600 == 0:
        n, unit = seconds // 3600, "hour"
    elif seconds >= 60:
        n, unit = math.ceil(seconds / 60), "minute"
    else:
        n, unit = seconds, "second"
    return f"{n} {unit}{'' if n == 1 else 's'}"

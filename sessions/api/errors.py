"""API errors: every failure a client can cause is a 4xx JSON {"code", "message"}."""

from __future__ import annotations

from django.http import JsonResponse


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra):
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra

    def response(self) -> JsonResponse:
        return error_response(self.status, self.code, self.message, **self.extra)


def error_response(status: int, code: str, message: str, **extra) -> JsonResponse:
    return JsonResponse({"code": code, "message": message, **extra}, status=status)


def not_found(what: str = "agent") -> ApiError:
    return ApiError(404, f"{what}.not_found", f"No such {what}.")

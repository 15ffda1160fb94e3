"""Strict readers for the JSON a harness sends (untrusted: from a sandbox).
Each names the field it refuses, so the harness's error says what to fix."""

from __future__ import annotations

from .errors import BadRequest

MAX_MESSAGES = 10_000
MAX_TOOLS = 512
MAX_NAME = 256
MAX_ID = 1_024


def text(value, where: str, *, optional: bool = False, limit: int | None = None) -> str:
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string")
    if limit is not None and len(value) > limit:
        raise BadRequest(f"{where} is over {limit} characters")
    return value


def name(value, where: str) -> str:
    value = text(value, where, limit=MAX_NAME)
    if not value:
        raise BadRequest(f"{where} must not be empty")
    return value


def obj(value, where: str, *, optional: bool = False) -> dict:
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be an object")
    return value


def items(value, where: str, limit: int, *, optional: bool = False) -> list:
    if value is None and optional:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"{where} must be a list")
    if len(value) > limit:
        raise BadRequest(f"{where} has over {limit} entries")
    return value


def flag(value, where: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{where} must be true or false")
    return value


def count(value, where: str, *, optional: bool = True) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000_000:
        raise BadRequest(f"{where} must be a whole number from 1")
    return value


def blocks_text(value, where: str) -> str:
    """Text content: a string, or a list of parts of which the text ones count."""
    if isinstance(value, str) or value is None:
        return value or ""
    parts = items(value, where, MAX_MESSAGES)
    out = []
    for i, part in enumerate(parts):
        part = obj(part, f"{where}[{i}]")
        if part.get("type") == "text":
            out.append(text(part.get("text"), f"{where}[{i}].text"))
    return "".join(out)

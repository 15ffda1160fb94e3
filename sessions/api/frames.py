"""Server-sent event frames: a transcript event, a cursor reset. Encoded once,
sent to every stream that needs them (sessions/api/tails.py)."""

from __future__ import annotations

import json
import re

_LINE_BREAK = re.compile(r"[\r\n]")

SSE_HEADERS = [
    (b"Content-Type", b"text/event-stream; charset=utf-8"),
    (b"Cache-Control", b"no-cache"),
    (b"X-Accel-Buffering", b"no"),
]


def format_event(record: dict) -> bytes:
    # json.dumps escapes CR/LF, so `data` is one line; the type is made safe
    # too, since a line break in it would split the frame.
    data = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
    etype = _LINE_BREAK.sub(" ", record["type"])
    return f"id: {record['seq']}\nevent: {etype}\ndata: {data}\n\n".encode()


def format_reset(head: int) -> bytes:
    # The id moves the client's Last-Event-ID to the head, so its next
    # reconnect resumes from there instead of being reset again.
    data = json.dumps({"head": head, "reason": "cursor_beyond_head"})
    return f"id: {head}\nevent: reset\ndata: {data}\n\n".encode()


def format_frame(seq: int, etype: str, data: dict) -> bytes:
    """Any other event: `etype` is ours (no line break), `data` one JSON line."""
    body = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"id: {seq}\nevent: {etype}\ndata: {body}\n\n".encode()

"""Agent memory: the notes an agent keeps through its `memory` tool.

The bridge asks with `request.memory {op, key, value}`; the worker answers
with :func:`handle`. Notes are keyed by agent identity (not by sandbox), so a
restored or rebuilt sandbox finds them again.
"""

from __future__ import annotations

from typing import Any

from .models import AgentMemory

MAX_KEY = 200
MAX_LIST = 500


class MemoryRequestError(ValueError):
    """A request the memory cannot serve; the message goes back to the tool."""


def handle(agent_id: str, op: Any, key: Any = None, value: Any = None) -> Any:
    """Serve one request: `get` → {"key", "value", "found"}; `set` → {"key", "ok"};
    `list` → {"keys": [...]}. Raises MemoryRequestError for a bad request."""
    if op == "list":
        keys = list(
            AgentMemory.objects.filter(agent_id=agent_id)
            .order_by("key")
            .values_list("key", flat=True)[:MAX_LIST]
        )
        return {"keys": keys}
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY:
        raise MemoryRequestError(f"key must be a non-empty string of at most {MAX_KEY} characters")
    if op == "get":
        row = AgentMemory.objects.filter(agent_id=agent_id, key=key).first()
        return {"key": key, "found": row is not None, "value": row.value if row else None}
    if op == "set":
        AgentMemory.objects.update_or_create(agent_id=agent_id, key=key, defaults={"value": value})
        return {"key": key, "ok": True}
    raise MemoryRequestError(f"unknown memory op {op!r} (get, set or list)")

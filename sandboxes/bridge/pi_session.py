"""Writing a Pi session file (JSONL v3) from the provider-neutral conversation.

Used when Pi has no file of its own to continue from but the bridge knows the
conversation: the "rebuild" rung (a seed from the transcript), and a resume
after Pi was killed during the first model call of a new session (Pi writes
its file only once the first assistant message exists, so the prompt would be
lost). Entries form a chain by ``id``/``parentId``; tool calls keep their ids.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import secrets
import time
import uuid
from pathlib import Path

from .pi_rpc import MODEL_ID, PROVIDER

ZERO_USAGE = {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 0,
              "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}


def _iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def pi_message(msg: dict, ms: int) -> dict:
    """One neutral message (conversation.py) as a Pi AgentMessage."""
    if msg["role"] == "user":
        return {"role": "user", "content": [{"type": "text", "text": msg["text"]}], "timestamp": ms}
    if msg["role"] == "assistant":
        content = [{"type": "text", "text": msg["text"]}] if msg["text"] else []
        content += [{"type": "toolCall", "id": c["id"], "name": c["name"], "arguments": c["input"]}
                    for c in msg.get("tool_calls", ())]
        return {"role": "assistant", "content": content, "api": "openai-completions",
                "provider": PROVIDER, "model": MODEL_ID, "usage": ZERO_USAGE,
                "stopReason": "toolUse" if msg.get("tool_calls") else "stop", "timestamp": ms}
    return {"role": "toolResult", "toolCallId": msg["tool_call_id"], "toolName": msg["name"],
            "content": [{"type": "text", "text": msg["output"]}], "isError": bool(msg["is_error"]),
            "timestamp": ms}


def write_session(path: Path, messages: list[dict], cwd: str) -> None:
    """Replace ``path`` with a session holding ``messages`` (atomically)."""
    ms = int(time.time() * 1000)
    lines = [{"type": "session", "version": 3, "id": str(uuid.uuid4()), "timestamp": _iso(),
              "cwd": cwd}]
    parent = None
    for msg in messages:
        entry_id = secrets.token_hex(4)
        lines.append({"type": "message", "id": entry_id, "parentId": parent, "timestamp": _iso(),
                      "message": pi_message(msg, ms)})
        parent = entry_id
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)

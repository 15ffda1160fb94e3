"""The provider-neutral conversation: plain dicts, translated by each provider.

    {"role": "user", "text": str, "kind": "prompt" | "steer"}
    {"role": "assistant", "text": str, "tool_calls": [{"id", "name", "input"}],
     "interrupted": bool?}
    {"role": "tool", "tool_call_id": str, "name": str, "output": str,
     "exit_code": int, "is_error": bool, "interrupted": bool?, "stderr": str?}

A tool's stderr is kept apart from its output (stdout) for the transcript; a
model reads both, through :func:`model_output`.

The one invariant every provider needs: each tool call of an assistant message
is answered by a tool message before the next user or assistant message.
"""

from __future__ import annotations

INTERRUPTED_OUTPUT = (
    "[interrupted: this tool call did not finish ({reason}); its side effects are unknown]"
)


def user(text: str, kind: str = "prompt") -> dict:
    return {"role": "user", "text": text, "kind": kind}


def assistant(text: str, tool_calls: list[dict] | None = None, interrupted: bool = False) -> dict:
    msg = {"role": "assistant", "text": text, "tool_calls": list(tool_calls or [])}
    if interrupted:
        msg["interrupted"] = True
    return msg


def tool_result(call: dict, output: str, exit_code: int, is_error: bool,
                interrupted: bool = False, stderr: str = "") -> dict:
    msg = {"role": "tool", "tool_call_id": call["id"], "name": call["name"],
           "output": output, "exit_code": exit_code, "is_error": is_error}
    if interrupted:
        msg["interrupted"] = True
    if stderr:
        msg["stderr"] = stderr
    return msg


def model_output(msg: dict) -> str:
    """What a model reads of a tool message: its output, then its stderr after a line that says so."""
    stderr = msg.get("stderr")
    if not isinstance(stderr, str) or not stderr:
        return msg["output"]
    out = msg["output"]
    return f"{out}{'' if not out or out.endswith(chr(10)) else chr(10)}[stderr]\n{stderr}"


def interrupted_result(call: dict, reason: str) -> dict:
    return tool_result(call, INTERRUPTED_OUTPUT.format(reason=reason), -1, True, interrupted=True)


def dangling_calls(messages: list[dict]) -> list[dict]:
    """Tool calls that were dispatched and have no result, oldest first."""
    answered = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    return [
        call
        for m in messages
        if m["role"] == "assistant"
        for call in m.get("tool_calls", ())
        if call["id"] not in answered
    ]


def close_dangling(messages: list[dict], reason: str) -> list[dict]:
    """Answer every dangling call with an interrupted result, right after its
    assistant message's other results, so the next model call is well-formed.
    Returns the results it added."""
    added = []
    for call in dangling_calls(messages):
        idx = _result_slot(messages, call["id"])
        result = interrupted_result(call, reason)
        messages.insert(idx, result)
        added.append(result)
    return added


def _result_slot(messages: list[dict], call_id: str) -> int:
    """Index just after the assistant message holding ``call_id`` and the
    tool results that follow it."""
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and any(c["id"] == call_id for c in m.get("tool_calls", ())):
            j = i + 1
            while j < len(messages) and messages[j]["role"] == "tool":
                j += 1
            return j
    return len(messages)


def validate(messages) -> list[dict]:
    """Check a seed conversation (the "rebuild" rung); raise ValueError naming the problem."""
    if not isinstance(messages, list):
        raise ValueError("messages must be a list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "tool"):
            raise ValueError(f"messages[{i}]: role must be user, assistant or tool")
        out.append(_normalize(i, m))
    return out


def _normalize(i: int, m: dict) -> dict:
    if m["role"] == "user":
        if not isinstance(m.get("text"), str):
            raise ValueError(f"messages[{i}].text must be a string")
        return user(m["text"], m.get("kind", "prompt"))
    if m["role"] == "assistant":
        calls = m.get("tool_calls") or []
        for c in calls:
            if not (isinstance(c, dict) and isinstance(c.get("id"), str)
                    and isinstance(c.get("name"), str)):
                raise ValueError(f"messages[{i}].tool_calls: each needs an id and a name")
        calls = [{"id": c["id"], "name": c["name"], "input": c.get("input") or {}} for c in calls]
        return assistant(str(m.get("text") or ""), calls, bool(m.get("interrupted")))
    if not isinstance(m.get("tool_call_id"), str):
        raise ValueError(f"messages[{i}].tool_call_id must be a string")
    call = {"id": m["tool_call_id"], "name": str(m.get("name") or "")}
    stderr = m.get("stderr")
    return tool_result(call, str(m.get("output") or ""), int(m.get("exit_code") or 0),
                       bool(m.get("is_error")), bool(m.get("interrupted")),
                       stderr if isinstance(stderr, str) else "")

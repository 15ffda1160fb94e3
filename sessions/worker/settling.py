"""The transcript's view of a conversation, for the restore ladder: the turn
that started and never settled (:func:`dangling`), the facts that settle it
exactly once (:func:`settle_facts`), and the neutral conversation a rebuilt
bridge is seeded with (:func:`seed_conversation`, docs/BRIDGE.md). Pure
functions over events (dicts with ``type``/``data`` in seq order), plus the one
query that reads those events."""

from __future__ import annotations

import json

from sessions.models import Event

# A turn is over once one of these is journaled.
SETTLED = ("turn.finished", "turn.interrupted")


def dangling(events) -> tuple[dict | None, list[dict], str]:
    """The turn of ``events`` (dicts with type/data, in seq order) that started
    and never settled, its tool calls with no result, and the text that survived."""
    turn, calls, texts, partial = None, {}, [], ""
    for ev in events:
        t, d = ev["type"], ev.get("data") or {}
        if t == "turn.started":
            turn, calls, texts, partial = d, {}, [], ""
        elif turn is None:
            continue
        elif t in SETTLED:
            turn, calls, texts, partial = None, {}, [], ""
        elif t == "message.delta":
            partial += str(d.get("text") or "")
        elif t == "message.assistant":
            texts.append(str(d.get("text") or ""))
            partial = ""
        elif t == "tool.dispatched":
            calls[str(d.get("tool_call_id"))] = d
        elif t == "tool.result":
            calls.pop(str(d.get("tool_call_id")), None)
    if turn is None:
        return None, [], ""
    text = "\n\n".join([*texts, partial] if partial else texts)
    return turn, list(calls.values()), text


def settle_facts(events, reason: str = "sandbox_lost", skip_turn: int | None = None) -> list:
    """Facts that settle the dangling turn of ``events`` (none when it settled)."""
    turn, calls, text = dangling(events)
    if turn is None or (skip_turn is not None and turn.get("turn") == skip_turn):
        return []
    n = turn.get("turn")
    facts = [("tool.result", {"turn": n, "tool_call_id": c.get("tool_call_id"), "name": c.get("name"),
                              "output": f"interrupted: {reason.replace('_', ' ')}",
                              "exit_code": -1, "is_error": True, "interrupted": True})
             for c in calls]
    facts.append(("turn.interrupted", {"turn": n, "text": text, "reason": reason}))
    return facts


def seed_conversation(events) -> dict:
    """The neutral conversation (docs/BRIDGE.md) the transcript holds, for the
    rebuild rung's seed: ``{"messages", "turns"}``."""
    msgs: list[dict] = []
    partial, turns = "", 0
    for ev in events:
        t, d = ev["type"], ev.get("data") or {}
        if t == "turn.started":
            turns = max(turns, int(d.get("turn") or 0))
            partial = ""
        elif t == "message.user":
            msgs.append({"role": "user", "text": str(d.get("text") or ""), "kind": "prompt"})
        elif t == "steer.delivered":
            msgs.append({"role": "user", "text": str(d.get("text") or ""), "kind": "steer"})
        elif t == "message.delta":
            partial += str(d.get("text") or "")
        elif t == "message.assistant":
            msgs.append({"role": "assistant", "text": str(d.get("text") or ""), "tool_calls": []})
            partial = ""
        elif t == "tool.dispatched":
            call = {"id": str(d.get("tool_call_id") or ""), "name": str(d.get("name") or ""),
                    "input": d.get("input") if isinstance(d.get("input"), dict) else {}}
            last = msgs[-1] if msgs else None
            if last and last["role"] == "assistant" and not last.get("interrupted"):
                last["tool_calls"].append(call)
            else:
                msgs.append({"role": "assistant", "text": "", "tool_calls": [call]})
        elif t == "tool.result":
            out = d.get("output")
            call_id = str(d.get("tool_call_id") or "")
            msgs.insert(_result_slot(msgs, call_id), {
                "role": "tool", "tool_call_id": call_id, "name": str(d.get("name") or ""),
                "output": out if isinstance(out, str) else json.dumps(out),
                "exit_code": _int(d.get("exit_code")), "is_error": bool(d.get("is_error")),
                "interrupted": bool(d.get("interrupted")),
                **({"stderr": d["stderr"]} if isinstance(d.get("stderr"), str) and d["stderr"] else {})})
        elif t == "turn.interrupted":
            if partial:
                msgs.append({"role": "assistant", "text": partial, "tool_calls": [],
                             "interrupted": True})
            partial = ""
        elif t == "turn.finished":
            partial = ""
    return {"messages": msgs, "turns": turns}


def _result_slot(msgs: list[dict], call_id: str) -> int:
    """Where a tool result goes: after the assistant message that made the
    call and the results already following it (normally the end)."""
    for i in range(len(msgs) - 1, -1, -1):
        m = msgs[i]
        if m["role"] == "assistant" and any(c["id"] == call_id for c in m.get("tool_calls", ())):
            j = i + 1
            while j < len(msgs) and msgs[j]["role"] == "tool":
                j += 1
            return j
    return len(msgs)


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


_TRANSCRIPT_TYPES = ("turn.started", "turn.finished", "turn.interrupted", "message.user",
                     "message.assistant", "message.delta", "steer.delivered", "tool.dispatched",
                     "tool.result")


def conversation_events(agent_id: str, through: int | None = None) -> list[dict]:
    """The conversation's facts of an agent's transcript (through ``through``), in seq order."""
    rows = Event.objects.filter(agent_id=agent_id, type__in=_TRANSCRIPT_TYPES)
    if through is not None:
        rows = rows.filter(seq__lte=through)
    rows = (rows
            .order_by("seq").values_list("type", "data").iterator(chunk_size=2000))
    return [{"type": t, "data": d} for t, d in rows]

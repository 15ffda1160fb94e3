"""What a sandbox may write into its agent's transcript.

Everything a bridge sends comes from inside the sandbox, where the model's
code runs: it is untrusted. The relay (sessions/worker/relay.py) journals a
bridge event only when its type is one a bridge emits (docs/BRIDGE.md,
"Events") and its data has exactly that type's fields, of the right kinds and
within bounds. Anything else — a control-plane fact (``command.*``,
``credential.*``, ``agent.*``: the facts that drive the agent's status, its
sandbox id, approvals, leases), an unknown type, a field too long or of the
wrong kind — is never applied: the relay journals ``bridge.refused {bseq,
type, reason}`` in its place, so the refusal is a fact too and the cursor
moves on. The same check covers what a restored or restarted bridge replays
from its session file, since that comes through the relay as well.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

#: The fact journaled in place of an event a sandbox may not write.
REFUSED = "bridge.refused"
#: Text a bridge reports (replies, tool output, prompts echoed): bounded.
MAX_TEXT = 1_000_000
MAX_NAME = 256
#: A tool's input or a child spec, as JSON.
MAX_OBJECT = 1_000_000
_WORD = re.compile(r"[a-z][a-z0-9_]{0,63}")

Check = Callable[[Any], str | None]  # None when the value is fine, else why not


@dataclass(frozen=True)
class Optional:
    """A field that may be absent."""

    check: Check


def _int(value) -> str | None:
    return None if isinstance(value, int) and not isinstance(value, bool) else "must be an integer"


def _count(value) -> str | None:
    return _int(value) or (None if value >= 0 else "must not be negative")


def _turn(value) -> str | None:
    return None if value is None else (_int(value) or (None if value >= 1 else "must be ≥ 1"))


def _bool(value) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _text(limit: int) -> Check:
    def check(value) -> str | None:
        if not isinstance(value, str):
            return "must be a string"
        return None if len(value) <= limit else f"is longer than {limit} characters"
    return check


def _nullable(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


def _word(value) -> str | None:
    ok = isinstance(value, str) and _WORD.fullmatch(value)
    return None if ok else "must be a snake_case word"


def _json(limit: int, kind: type | None = None) -> Check:
    def check(value) -> str | None:
        if kind is not None and not isinstance(value, kind):
            return f"must be a JSON {'object' if kind is dict else kind.__name__}"
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
        return None if size <= limit else f"is larger than {limit} bytes of JSON"
    return check


def _strings(limit: int) -> Check:
    def check(value) -> str | None:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return "must be a list of strings"
        return None if sum(map(len, value)) <= limit else f"is longer than {limit} characters"
    return check


TEXT, NAME, ID = _text(MAX_TEXT), _text(MAX_NAME), _text(MAX_NAME)
_TURN_TEXT = {"turn": _turn, "text": TEXT}
_CALL = {"turn": _turn, "tool_call_id": ID, "name": NAME}
_REQUEST = {"turn": _turn, "request_id": ID, "tool_call_id": ID}

#: Each type a bridge emits, with its fields (docs/BRIDGE.md "Events").
SCHEMAS: dict[str, dict[str, Check | Optional]] = {
    "bridge.started": {"resumed": _bool, "session_start_source": _word, "model": NAME,
                       "harness": Optional(_word)},
    # The pi harness (sandboxes/bridge/pi.py): Pi ended on its own; a session
    # file written from the bridge's conversation (Pi had none yet).
    "harness.exited": {"harness": _word, "exit_code": _nullable(_int), "log_tail": TEXT},
    "harness.session_written": {"harness": _word, "messages": _count},
    "bridge.paused": {"turn": _turn},
    "bridge.unpaused": {"turn": _turn},
    "bridge.error": {"turn": _turn, "message": TEXT},
    "model.error": {"turn": _turn, "message": TEXT},
    # Made by the host's parser for an event that broke the protocol's rules
    # (sandboxes/bridge/protocol.py); only its field and reason are kept.
    "bridge.event_refused": {"field": NAME, "reason": TEXT},
    "session.seeded": {"messages": _count, "turns": _count},
    "turn.started": {"turn": _turn, "command_id": _nullable(ID)},
    "turn.held": {"turn": _turn, "step": _count},
    "message.user": _TURN_TEXT,
    "message.delta": _TURN_TEXT,
    "message.assistant": _TURN_TEXT,
    "steer.delivered": _TURN_TEXT,
    "turn.finished": _TURN_TEXT,
    "turn.interrupted": {**_TURN_TEXT, "reason": _word,
                         "undelivered_steers": Optional(_strings(MAX_TEXT))},
    "tool.dispatched": {**_CALL, "input": _json(MAX_OBJECT, dict)},
    "tool.result": {**_CALL, "output": TEXT, "exit_code": _int, "is_error": _bool, "stderr": Optional(TEXT),
                    "interrupted": Optional(_bool)},
    "request.spawn": {**_REQUEST, "prompt": _nullable(TEXT), "spec": Optional(_json(MAX_OBJECT, dict))},
    "request.memory": {**_REQUEST, "op": _nullable(_text(16)), "key": _nullable(_json(MAX_NAME)),
                       "value": _json(MAX_OBJECT)},
    "hook.verdict": {"hook": _word, "verdict": _word, "exit_code": _nullable(_int),
                     "output": TEXT, "source": Optional(_word), "turn": Optional(_turn),
                     "tool_call_id": Optional(ID)},
}


def refusal(etype: str, data: dict) -> str | None:
    """Why an event of type ``etype`` with ``data`` may not be journaled, or None."""
    schema = SCHEMAS.get(etype)
    if schema is None:
        return "not an event a sandbox may emit"
    for key in data:
        if key not in schema:
            return f"unknown field {str(key)[:64]!r}"
    for key, check in schema.items():
        if key not in data:
            if isinstance(check, Optional):
                continue
            return f"missing field {key!r}"
        why = (check.check if isinstance(check, Optional) else check)(data[key])
        if why:
            return f"{key} {why}"
    return None


def refused_fact(bseq: int, etype: str, reason: str) -> tuple[str, dict]:
    """What is journaled instead: the type (cut to a safe length) and why."""
    return REFUSED, {"bseq": bseq, "type": etype[:64], "reason": reason[:500]}

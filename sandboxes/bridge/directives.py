"""The demo model's directives, parsed: pure, stdlib only, no other import.

The one definition shared by the bridge's demo provider (providers/demo.py)
and the control plane's model gateway (sessions/gateway/demo.py), which may
import this module and sandboxes.bridge.protocol, nothing else of the bridge.

One directive a line:

    run: <shell command>      → a bash tool call
    write <path>: <text>      → a write tool call ("\\n" in <text> becomes a newline)
    read: <path>              → a read tool call
    spawn: <prompt>           → a spawn tool call (asks the control plane for a child)
    spawn: {"prompt": …, "spec": {…}}
                              → the same with a child spec, as a real model may send
    memory: set <key> <value> → a memory tool call (also `memory: get <key>`,
                                `memory: list`): the agent's notes, kept by the control plane
    sleep: <seconds>          → a bash `sleep` tool call (a long step, for fault tests)
    think: <seconds>          → the model call itself takes that long (a long model
                                call, for fault tests; the bridge's demo only, ≤ 600 s)
    say: <text>               → <text> in the reply
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

_WRITE = re.compile(r"^write\s+(?P<path>[^:]+?)\s*:\s?(?P<text>.*)$")
_KEYED = re.compile(r"^(?P<key>run|read|spawn|memory|sleep|say)\s*:\s?(?P<value>.*)$")
_THINK = re.compile(r"^think\s*:\s*(?P<seconds>\d+(?:\.\d+)?)\s*$")
#: The longest a demo model call may think (a typo must not hang a turn for hours).
MAX_THINK_S = 600.0

#: The reply to a message without a directive.
NO_DIRECTIVE = ("[demo] I am the demo model. Give me directives, one a line: "
                "run:, write <path>:, read:, spawn:, memory:, sleep:, say:.")


@dataclass(frozen=True)
class Directive:
    """One tool directive: the bridge's tool name and its input."""
    name: str
    input: dict


@dataclass(frozen=True)
class Plan:
    """What the demo does with one user message."""
    says: tuple[str, ...] = ()
    calls: tuple[Directive, ...] = field(default_factory=tuple)
    think_s: float = 0.0  # how long the model call takes before it answers

    @property
    def reply(self) -> str:
        if self.says:
            return "[demo] " + "\n".join(self.says)
        if self.calls:
            n = len(self.calls)
            return f"[demo] Running {n} tool call{'s' if n > 1 else ''}."
        return NO_DIRECTIVE


def plan(text: str) -> Plan:
    """The directives of a message, in order."""
    says, calls, think = [], [], 0.0
    for line in text.splitlines():
        thinking = _THINK.match(line.strip())
        if thinking:
            think += float(thinking["seconds"])
            continue
        directive, say = parse_line(line.strip())
        if say is not None:
            says.append(say)
        elif directive is not None:
            calls.append(directive)
    return Plan(tuple(says), tuple(calls), min(think, MAX_THINK_S))


def parse_line(line: str) -> tuple[Directive | None, str | None]:
    """(tool directive, say text) of one line; (None, None) when neither."""
    m = _WRITE.match(line)
    if m:
        return Directive("write", {"path": m["path"],
                                   "content": m["text"].replace("\\n", "\n")}), None
    m = _KEYED.match(line)
    if not m:
        return None, None
    key, value = m["key"], m["value"].strip()
    if key == "say":
        return None, value
    if key == "run":
        return Directive("bash", {"command": value}), None
    if key == "sleep":
        return Directive("bash", {"command": f"sleep {shlex.quote(value)}"}), None
    if key == "read":
        return Directive("read", {"path": value}), None
    if key == "memory":
        return Directive("memory", memory_input(value)), None
    return Directive("spawn", spawn_input(value)), None


def memory_input(value: str) -> dict:
    """`memory:`'s tool input: `set <key> <value>`, `get <key>` or `list`.
    Anything else passes as the op, for the tool to refuse as a model's
    malformed call would be."""
    op, _, rest = value.partition(" ")
    if op == "set":
        key, _, text = rest.strip().partition(" ")
        return {"op": "set", "key": key, "value": text.strip()}
    if op == "get":
        return {"op": "get", "key": rest.strip()}
    return {"op": op}


def spawn_input(value: str) -> dict:
    """`spawn:`'s tool input: a JSON object with a prompt (and a spec) passes
    as is, so the demo can ask for any child a real model could; any other
    text is the child's prompt."""
    if value.startswith("{"):
        try:
            asked = json.loads(value)
        except ValueError:
            asked = None
        if isinstance(asked, dict) and isinstance(asked.get("prompt"), str):
            return {k: v for k, v in asked.items() if k in ("prompt", "spec")}
    return {"prompt": value}


def chunks(text: str, size: int = 16):
    """Text in pieces like a real model's stream, so deltas are exercised offline."""
    for i in range(0, len(text), size):
        yield text[i:i + size]

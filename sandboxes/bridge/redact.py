"""Bound secret values out of everything the bridge writes: its events, its
session file (which a turn checkpoint carries into backups and forks) and
its log. The config names the bindings (``redact``: ``[{"name", "env"}]``,
written by the control plane, sandboxes/launch.py); their values are read
from the bridge's own environment, like the model's key. A value the agent
writes into a file of its own stays in that file: only what the bridge
writes is redacted."""

from __future__ import annotations

import json
import logging

#: Shorter values would redact ordinary words (the control plane's sessions/credentials.py).
MIN_LEN = 6


def placeholder(name: str) -> str:
    """What a bound value named `name` is replaced with."""
    return f"[redacted:{name}]"


class Redactor:
    def __init__(self, values: dict[str, str] | None = None):
        # value -> placeholder; longest first, so a value inside another goes last
        kept = {v: placeholder(name) for name, v in (values or {}).items()
                if isinstance(v, str) and len(v) >= MIN_LEN}
        self.values = dict(sorted(kept.items(), key=lambda kv: -len(kv[0])))

    @classmethod
    def from_config(cls, config: dict, environ, key_envs=()) -> "Redactor":
        values = {}
        for binding in config.get("redact") or []:
            if isinstance(binding, dict) and isinstance(binding.get("env"), str):
                values[str(binding.get("name") or binding["env"])] = environ.get(binding["env"])
        for env in key_envs:  # the model's key: never in a tool's env, never in a file
            values.setdefault(env, environ.get(env))
        return cls(values)

    def text(self, text: str) -> str:
        for value, placeholder in self.values.items():
            if value in text:
                text = text.replace(value, placeholder)
        return text

    def value(self, obj):
        """A JSON value with every bound value in its strings (and keys) redacted."""
        if not self.values:
            return obj
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self.value(k): self.value(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.value(v) for v in obj]
        return obj

    def dumps(self, obj) -> str:
        """``obj`` as compact JSON, redacted (what the session file holds)."""
        return self.json_text(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))

    def json_text(self, text: str) -> str:
        """JSON text (e.g. a harness's JSONL session file) with every bound
        value redacted inside its strings, as JSON escapes them."""
        for value, placeholder in self.values.items():
            escaped = json.dumps(value, ensure_ascii=False)[1:-1]
            if escaped in text:
                text = text.replace(escaped, json.dumps(placeholder, ensure_ascii=False)[1:-1])
        return text

    def held(self, text: str) -> int:
        """How many characters at the end of ``text`` could begin a value: a
        stream holds them back until the next chunk tells."""
        longest = 0
        for value in self.values:
            for n in range(min(len(value) - 1, len(text)), longest, -1):
                if text.endswith(value[:n]):
                    longest = n
                    break
        return longest


class RedactingFilter(logging.Filter):
    def __init__(self, redactor: Redactor):
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        if self.redactor.values:
            record.msg, record.args = self.redactor.text(record.getMessage()), ()
            if record.exc_info:
                record.exc_text = self.redactor.text(logging.Formatter().formatException(
                    record.exc_info))
                record.exc_info = None
        return True

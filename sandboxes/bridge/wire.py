"""Strict reading of JSON messages: the machinery under protocol.py.

protocol.py says *what* the bridge's messages are; this module says *how* a
field is read: every reader checks a type and a bound and raises
:class:`ProtocolError` naming the field (``events[2].bseq``). A message is a
frozen dataclass of :class:`Message` whose fields are made by
:func:`message_field`, so the field list is the schema: ``from_wire`` reads
each field with its reader, ``to_wire`` writes it back.

A reader is ``read(wire, key, where, *, default, **bounds) -> value``: ``wire``
the JSON object, ``key`` the field, ``where`` the path of the object (for the
error), ``default`` what an absent field means (``MISSING``: it is required).
Standard library only, like the rest of the bridge.
"""

from __future__ import annotations

import json
import math
from dataclasses import field, fields
from enum import StrEnum

#: Integers are stored in 64-bit database columns on the host.
MAX_INT = 2**63 - 1
#: The default of a required field.
MISSING = object()


class ProtocolError(ValueError):
    """A message that breaks the protocol; ``field`` says where (``events[2].bseq``)."""

    def __init__(self, field: str, reason: str, message: str | None = None):
        super().__init__(message or f"{field} {reason}")
        self.field = field
        self.reason = reason


# --- lines ----------------------------------------------------------------------------------


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def decode_line(line: bytes) -> object:
    """One line of standard JSON; ProtocolError otherwise (NaN, or nested too deep)."""
    try:
        return json.loads(line, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise ProtocolError("line", "is not JSON") from None


def encode_line(message: dict) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n"


# --- values ---------------------------------------------------------------------------------


def path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def as_object(value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError(where or "answer", "must be a JSON object")
    return value


def get(wire: dict, key: str, where: str, default: object) -> object:
    value = wire.get(key, default)
    if value is MISSING:
        raise ProtocolError(path(where, key), "is required")
    return value


def is_int(value: object, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_INT


def is_scalar(value: object) -> bool:
    """null, a boolean, a 64-bit integer or a finite number."""
    return (value is None or isinstance(value, bool) or is_int(value, -MAX_INT)
            or (isinstance(value, float) and math.isfinite(value)))


def int_value(value: object, where: str, low: int = 0) -> int:
    if not is_int(value, low):
        kind = "a positive" if low == 1 else "a non-negative"
        raise ProtocolError(where, f"must be {kind} integer")
    return value


def str_value(value: object, where: str, limit: int) -> str:
    if not isinstance(value, str):
        raise ProtocolError(where, "must be a string")
    if len(value) > limit:
        raise ProtocolError(where, f"is longer than {limit} characters")
    return value


def check_depth(value: object, where: str, limit: int) -> None:
    """Refuse JSON nested deeper than ``limit``. Iterative: a recursive walk is
    what this bound protects the reader from."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list)):
            continue
        children = item.values() if isinstance(item, dict) else item
        if children and depth > limit:
            raise ProtocolError(where, f"nests deeper than {limit} levels")
        stack.extend((child, depth + 1) for child in children)


# --- readers --------------------------------------------------------------------------------


def read_int(wire, key, where="", *, default=MISSING, low=0, nullable=False):
    value = get(wire, key, where, default)
    return None if value is None and nullable else int_value(value, path(where, key), low)


def read_str(wire, key, where="", *, default=MISSING, limit, nullable=False):
    value = get(wire, key, where, default)
    return None if value is None and nullable else str_value(value, path(where, key), limit)


def read_bool(wire, key, where="", *, default=MISSING) -> bool:
    value = get(wire, key, where, default)
    if not isinstance(value, bool):
        raise ProtocolError(path(where, key), "must be true or false")
    return value


def read_list(wire, key, where="", *, default=MISSING, limit) -> list:
    value = get(wire, key, where, default)
    if not isinstance(value, list):
        raise ProtocolError(path(where, key), "must be a list")
    if len(value) > limit:
        raise ProtocolError(path(where, key), f"has more than {limit} entries")
    return value


def read_ints(wire, key, where="", *, default=MISSING, items, low=0) -> tuple[int, ...]:
    values = read_list(wire, key, where, default=default, limit=items)
    return tuple(int_value(v, f"{path(where, key)}[{i}]", low) for i, v in enumerate(values))


def read_strs(wire, key, where="", *, default=MISSING, items, limit) -> tuple[str, ...]:
    values = read_list(wire, key, where, default=default, limit=items)
    return tuple(str_value(v, f"{path(where, key)}[{i}]", limit) for i, v in enumerate(values))


def read_any(wire, key, where="", *, default=MISSING):
    return get(wire, key, where, default)


def read_object(wire, key, where="", *, default=MISSING, depth) -> dict:
    value = as_object(get(wire, key, where, default), path(where, key))
    check_depth(value, path(where, key), depth)
    return value


def read_pattern(wire, key, where="", *, default=MISSING, pattern, limit, what) -> str:
    """A string of at most ``limit`` characters matching ``pattern`` (``what`` it is)."""
    value = read_str(wire, key, where, default=default, limit=limit)
    if not pattern.fullmatch(value):
        raise ProtocolError(path(where, key), f"must be {what}")
    return value


def read_message(wire, key, where="", *, default=MISSING, message_type, nullable=False):
    value = get(wire, key, where, default)
    if value is None and nullable:
        return None
    return message_type.from_wire(value, path(where, key))


def read_messages(wire, key, where="", *, default=MISSING, message_type, items) -> tuple:
    values = read_list(wire, key, where, default=default, limit=items)
    return tuple(message_type.from_wire(v, f"{path(where, key)}[{i}]")
                 for i, v in enumerate(values))


# --- messages -------------------------------------------------------------------------------


def message_field(read, default=MISSING, *, omit=MISSING, **bounds):
    """A message field read by ``read`` with ``bounds``; absent on the wire, it
    is ``default``. ``to_wire`` leaves it out when its value equals ``omit``."""
    meta = {"read": read, "default": default, "omit": omit, "bounds": bounds}
    return field(metadata=meta) if default is MISSING else field(default=default, metadata=meta)


def plain(value: object) -> object:
    """A field's value as JSON: messages by their to_wire, tuples as lists."""
    if isinstance(value, Message):
        return value.to_wire()
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value.value if isinstance(value, StrEnum) else value


class Message:
    """``from_wire``/``to_wire`` from the fields' readers (see :func:`message_field`).
    Fields the wire has and the message does not are ignored: formats only grow."""

    @classmethod
    def from_wire(cls, wire: object, where: str = ""):
        wire = as_object(wire, where)
        values = {}
        for f in fields(cls):
            meta = f.metadata
            values[f.name] = meta["read"](wire, f.name, where, default=meta["default"],
                                          **meta["bounds"])
        message = cls(**values)
        message.check()
        return message

    def check(self) -> None:
        """Rules across fields (raise ProtocolError); none by default."""

    def to_wire(self) -> dict:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata["omit"] is MISSING or value != f.metadata["omit"]:
                out[f.name] = plain(value)
        return out

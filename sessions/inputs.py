"""What a client may send, read the one way both doors use (the JSON API,
sessions/api/handler.py, and the dashboard, sessions/dashboard/ and
sessions/forms.py): cursors in ASCII digits, and JSON without NaN or
Infinity, without a number past Python's integer conversion limit, and
nested at most MAX_DEPTH levels. A refusal is an InputError (a ValueError)
whose message a person can read, so no caller turns what a client typed
into a 5xx: `"²".isdigit()` is true but `int("²")` raises, a 5,000-digit
integer raises ValueError in `json.loads`, and deep nesting raises
RecursionError in whatever walks it next."""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

#: Cursors and limits: at most 18 ASCII digits, so every value fits a 64-bit column.
_CURSOR = re.compile(r"[0-9]{1,18}")
#: A spec nests three levels; tool inputs from models nest more (sandboxes/bridge/protocol.py
#: allows 100 from the bridge). 64 leaves room and keeps every recursive walk shallow.
MAX_DEPTH = 64
#: Python's own limit (sys.set_int_max_str_digits); 4300 when it is switched off.
MAX_INT_DIGITS = sys.get_int_max_str_digits() or 4300


class InputError(ValueError):
    """Client input that cannot be what it claims to be. `code` is
    "malformed_json" (not JSON, or NaN/Infinity), "out_of_range" (a number
    JSON allows but no field can hold) or "too_deep"."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def cursor(value: Any) -> int | None:
    """A non-negative integer written in ASCII digits, else None (absent,
    empty, signed, other scripts' digits, superscripts, too long)."""
    if not isinstance(value, str) or not _CURSOR.fullmatch(value):
        return None
    return int(value)


def loads(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse JSON text; InputError when it is not JSON we accept."""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float,
                           parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise InputError("malformed_json",
                         f"{exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise InputError("too_deep", f"it nests deeper than {max_depth} levels") from None
    except _OutOfRange as exc:
        raise InputError("out_of_range", str(exc)) from None
    except ValueError as exc:  # _no_constant, or a number float() cannot read
        raise InputError("malformed_json", str(exc)[:200]) from None
    if depth(value, stop_after=max_depth) > max_depth:
        raise InputError("too_deep", f"it nests deeper than {max_depth} levels")
    return value


def depth(value: Any, stop_after: int | None = None) -> int:
    """How deep lists and objects nest in `value` (a scalar is 0, `[]` is 1),
    walked without recursion; it stops counting once past `stop_after`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if stop_after is not None and deepest > stop_after:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


class _OutOfRange(ValueError):
    pass


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OutOfRange(f"the number {text[:20]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _OutOfRange(f"a number has more than {MAX_INT_DIGITS} digits")
    return int(text)

"""The agent's tools: bash, read, write, edit, spawn, memory.

Paths are relative to the home dir (absolute paths are taken as they are: the
sandbox, not the tool, is the boundary). Every tool answers with a
:class:`ToolOutcome`; failures are outcomes the model can read, not exceptions.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .cancel import Cancelled, CancelToken
from .requests import RequestFailed, Requests

#: Characters of tool output kept for the model and the transcript.
MAX_OUTPUT = 30_000
#: Bytes `read` returns at most.
MAX_READ = 256 * 1024

SCHEMAS = {
    "bash": {
        "description": "Run a shell command with bash -lc in the home directory. "
                       "Returns its stdout, its stderr (after a [stderr] line) and its exit code.",
        "input_schema": {"type": "object", "properties": {
            "command": {"type": "string"},
            "timeout": {"type": "number", "description": "seconds (optional)"}},
            "required": ["command"]},
    },
    "read": {
        "description": "Read a text file (path relative to the home directory).",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}},
                         "required": ["path"]},
    },
    "write": {
        "description": "Create or overwrite a text file (parent directories are created).",
        "input_schema": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"]},
    },
    "edit": {
        "description": "Replace one exact, unique occurrence of old with new in a file.",
        "input_schema": {"type": "object", "properties": {
            "path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}},
            "required": ["path", "old", "new"]},
    },
    "spawn": {
        "description": "Ask for a child agent that works on a prompt; returns its id.",
        "input_schema": {"type": "object", "properties": {
            "prompt": {"type": "string"}, "spec": {"type": "object"}},
            "required": ["prompt"]},
    },
    "memory": {
        "description": "Notes kept by the control plane for this agent across sandboxes: "
                       "op get|set|list, with a key (and a value for set).",
        "input_schema": {"type": "object", "properties": {
            "op": {"type": "string", "enum": ["get", "set", "list"]},
            "key": {"type": "string"}, "value": {"type": "string"}},
            "required": ["op"]},
    },
}


@dataclass
class ToolOutcome:
    output: str
    exit_code: int = 0
    is_error: bool = False
    interrupted: bool = False
    stderr: str = ""  # bash's stderr, apart from its stdout (output)


@dataclass
class ToolLimits:
    bash_timeout: float = 600.0       # default per command
    bash_timeout_max: float = 3600.0  # a model may ask for more, up to this
    request_timeout: float = 300.0    # spawn / memory replies


@dataclass
class ToolContext:
    home: str
    run_dir: str
    env: dict                          # environment for commands (model key removed)
    requests: Requests
    #: emit(type, data): journal a request.* event (the runner commits it).
    emit: Callable[[str, dict], None]
    #: on_process(pid): a bash command started (its pid is its process group).
    on_process: Callable[[int], None] = lambda pid: None
    limits: ToolLimits = field(default_factory=ToolLimits)
    #: The tools of the agent's spec (None = all): others are refused, even
    #: when a model (or the demo's directives) asks for them.
    enabled: frozenset | None = None


def schemas(enabled: list[str] | None) -> list[dict]:
    names = [n for n in (enabled or list(SCHEMAS)) if n in SCHEMAS]
    return [{"name": n, **SCHEMAS[n]} for n in names]


def run_tool(ctx: ToolContext, call: dict, cancel: CancelToken) -> ToolOutcome:
    """Run one tool call; never raises for a tool's own failure."""
    fn = _TOOLS.get(call["name"])
    if fn is None or (ctx.enabled is not None and call["name"] not in ctx.enabled):
        return ToolOutcome(f"no tool named {call['name']!r} is available", 1, True)
    args = call.get("input") or {}
    if "__invalid_json__" in args:
        return ToolOutcome("the tool arguments were not valid JSON: "
                           + str(args["__invalid_json__"])[:500], 1, True)
    try:
        return fn(ctx, call, args, cancel)
    except _BadArgs as exc:
        return ToolOutcome(str(exc), 1, True)
    except OSError as exc:
        return ToolOutcome(f"{call['name']} failed: {exc}", 1, True)


class _BadArgs(Exception):
    pass


def _arg(args: dict, name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise _BadArgs(f"argument {name!r} must be a string")
    return value


def _path(ctx: ToolContext, args: dict) -> Path:
    return Path(ctx.home) / os.path.expanduser(_arg(args, "path"))


# --- bash ------------------------------------------------------------------------
def _bash(ctx: ToolContext, call: dict, args: dict, cancel: CancelToken) -> ToolOutcome:
    command = _arg(args, "command")
    timeout = _timeout(args.get("timeout"), ctx.limits)
    env = {**ctx.env, "HOME": ctx.home, "ALINEO_TOOL_CALL_ID": call["id"]}
    # Output goes to unnamed files, not pipes: a background process left
    # holding a pipe open would otherwise keep the call from ever ending.
    # stdout and stderr apart, so the transcript can show them apart.
    with tempfile.TemporaryFile(dir=ctx.run_dir) as out, tempfile.TemporaryFile(dir=ctx.run_dir) as err:
        proc = subprocess.Popen(["bash", "-lc", command], cwd=ctx.home, env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                start_new_session=True)
        ctx.on_process(proc.pid)
        unregister = cancel.on_cancel(lambda: _kill_group(proc))
        try:
            code, note = _wait(proc, timeout)
        finally:
            unregister()
        text, errors = _read_capped(out), _read_capped(err)
    if cancel.cancelled:
        return ToolOutcome(text + "\n[interrupted: the turn was aborted]", -1, True, True, errors)
    return ToolOutcome(text + note, code, code != 0, stderr=errors)


def _timeout(value, limits: ToolLimits) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return min(float(value), limits.bash_timeout_max)
    return limits.bash_timeout


def _wait(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        return proc.wait(timeout=timeout), ""
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()
        return 124, f"\n[timed out after {timeout:g} s; the process group was killed]"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_capped(fh) -> str:
    """The output, or its head and tail with a note when it is too long."""
    size = fh.seek(0, os.SEEK_END)
    fh.seek(0)
    if size <= MAX_OUTPUT:
        return fh.read().decode("utf-8", "replace")
    half = MAX_OUTPUT // 2
    head = fh.read(half).decode("utf-8", "replace")
    fh.seek(size - half)
    tail = fh.read(half).decode("utf-8", "replace")
    return f"{head}\n[output truncated: {size - 2 * half} of {size} bytes left out]\n{tail}"


# --- files ------------------------------------------------------------------------
def _read(ctx, call, args, cancel) -> ToolOutcome:
    path = _path(ctx, args)
    if not path.is_file():
        return ToolOutcome(f"no such file: {args['path']}", 1, True)
    with open(path, "rb") as fh:
        data = fh.read(MAX_READ + 1)
    text = data[:MAX_READ].decode("utf-8", "replace")
    if len(data) > MAX_READ:
        text += f"\n[truncated: only the first {MAX_READ} bytes are shown]"
    return ToolOutcome(text)


def _write(ctx, call, args, cancel) -> ToolOutcome:
    path, content = _path(ctx, args), _arg(args, "content")
    path.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode("utf-8")
    path.write_bytes(data)
    return ToolOutcome(f"wrote {len(data)} bytes to {args['path']}")


def _edit(ctx, call, args, cancel) -> ToolOutcome:
    path, old, new = _path(ctx, args), _arg(args, "old"), _arg(args, "new")
    if not path.is_file():
        return ToolOutcome(f"no such file: {args['path']}", 1, True)
    text = path.read_text(encoding="utf-8")
    count = text.count(old) if old else 0
    if count != 1:
        why = "was not found" if count == 0 else f"is not unique ({count} matches)"
        return ToolOutcome(f"edit refused: the old text {why} in {args['path']}", 1, True)
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return ToolOutcome(f"edited {args['path']}")


# --- control-plane requests ---------------------------------------------------------
def _spawn(ctx, call, args, cancel) -> ToolOutcome:
    data = {"prompt": _arg(args, "prompt")}
    if isinstance(args.get("spec"), dict):
        data["spec"] = args["spec"]
    return _ask(ctx, call, "request.spawn", data, cancel)


def _memory(ctx, call, args, cancel) -> ToolOutcome:
    op = args.get("op")
    if op not in ("get", "set", "list"):
        raise _BadArgs("argument 'op' must be get, set or list")
    data = {"op": op, "key": args.get("key"), "value": args.get("value")}
    if op in ("get", "set") and not isinstance(data["key"], str):
        raise _BadArgs(f"memory {op} needs a string 'key'")
    return _ask(ctx, call, "request.memory", data, cancel)


def _ask(ctx, call, event_type: str, data: dict, cancel: CancelToken) -> ToolOutcome:
    # The tool call id makes the request id: it is the idempotency key the
    # control plane can use if the same call is ever asked again.
    request_id = f"req-{call['id']}"
    event = {"request_id": request_id, "tool_call_id": call["id"], **data}
    try:
        result = ctx.requests.ask(request_id, lambda: ctx.emit(event_type, event),
                                  cancel=cancel, timeout=ctx.limits.request_timeout)
    except RequestFailed as exc:
        return ToolOutcome(f"{call['name']} failed: {exc}", 1, True)
    except Cancelled:  # the abort handler has already closed this call
        return ToolOutcome("[interrupted: the turn was aborted]", -1, True, True)
    if not isinstance(result, str):
        result = json.dumps(result, ensure_ascii=False)
    return ToolOutcome(result)


_TOOLS = {"bash": _bash, "read": _read, "write": _write, "edit": _edit,
          "spawn": _spawn, "memory": _memory}

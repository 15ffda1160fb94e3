"""Template helpers for the dashboard: relative times with the exact time on
hover, status badges that are coloured *and* labelled, and a display view of a
transcript event (what to show, and whether its raw input/output is long
enough to start collapsed)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from sessions.access import AGENT_ID
from sessions.gateway.usage import usage_line
from sessions.worker.plans import REBUILD_REASONS

register = template.Library()

# Label, and an icon so a status never relies on colour alone. Icons are inline
# SVG: a font without ⏸ or ⏹ drew them as empty boxes.
_SHAPES = {
    "dot": '<circle cx="8" cy="8" r="5"/>',
    "ring": '<circle cx="8" cy="8" r="5" fill="none" stroke="currentColor" stroke-width="2" stroke-dasharray="3 2"/>',
    "play": '<path d="M4 2.5v11l9.5-5.5z"/>',
    "pause": '<path d="M3.5 2.5h3v11h-3zM9.5 2.5h3v11h-3z"/>',
    "stop": '<path d="M3 3h10v10H3z"/>',
    "halt": '<path d="M3 3h10v10H3z" fill="none" stroke="currentColor" stroke-width="2"/>',
    "cycle": '<path d="M8 2a6 6 0 1 0 6 6h-2a4 4 0 1 1-4-4v2.5L11.5 3 8 0z"/>',
    "cross": '<path d="M3.5 2 8 6.5 12.5 2 14 3.5 9.5 8l4.5 4.5-1.5 1.5L8 9.5 3.5 14 2 12.5 6.5 8 2 3.5z"/>',
    "warn": '<path d="M8 1 15 14H1zM7 6v4h2V6zm0 5v2h2v-2z"/>',
}
STATUS = {
    "starting": ("Starting", "ring"),
    "running": ("Running", "play"),
    "idle": ("Idle", "dot"),
    "paused": ("Paused", "pause"),
    "interrupted": ("Interrupted", "halt"),
    "restoring": ("Restoring", "cycle"),
    "stopped": ("Stopped", "stop"),
    "lost": ("Lost", "cross"),
    "unrecoverable": ("Unrecoverable", "warn"),
    "ready": ("Ready", "dot"),  # sandbox sessions (sessions/dashboard/sandboxes.py)
    "failed": ("Failed", "warn"),
    "removed": ("Removed", "stop"),
}


def icon(shape: str):
    """An inline SVG icon in the text's colour (decorative: the label says it)."""
    return mark_safe(  # noqa: S308 - constant markup from _SHAPES, no input in it
        '<svg class="icon" viewBox="0 0 16 16" width="11" height="11" fill="currentColor" '
        f'aria-hidden="true" focusable="false">{_SHAPES.get(shape, _SHAPES["dot"])}</svg>')

LONG_CHARS = 600
LONG_LINES = 12


def _aware(value) -> datetime | None:
    """A timezone-aware UTC datetime, or None for anything that is not a time
    (event data is the bridge's, so a "started_at" may be any JSON)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    try:
        return value.astimezone(timezone.utc)
    except (OverflowError, ValueError):  # "0001-01-01T00:00:00+01:00" has no UTC time
        return None


WEEK = 7 * 86400


def relative(value, now: datetime | None = None) -> str:
    """'just now', '42 s ago', '5 min ago', '3 h ago', '2 d ago'; the future
    as what is left (alineo.js's rel() says the same)."""
    value = _aware(value)
    if value is None:
        return ""
    now = now or datetime.now(timezone.utc)
    seconds = (now - value).total_seconds()
    if abs(seconds) < 5:
        return "just now"
    if seconds < 0:
        return "in " + time_left(-seconds)
    for limit, unit, size in ((60, "s", 1), (3600, "min", 60), (86400, "h", 3600)):
        if seconds < limit:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds // 86400)} d ago"


def time_left(seconds: float) -> str:
    """Time to come, not floored to a whole day: an expiry 5.99 days away is
    '5 d 23 h', not '5 d'. Hours under a week, else the nearest day."""
    if seconds < 60:
        return f"{int(seconds)} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    if seconds >= WEEK:
        return f"{round(seconds / 86400)} d"
    days, hours = divmod(int(seconds // 3600), 24)
    parts = (f"{days} d" if days else "", f"{hours} h" if hours else "")
    return " ".join(part for part in parts if part)


@register.filter
def reltime(value):
    """<time> with a relative text (kept fresh by alineo.js) and the exact UTC time on hover."""
    value = _aware(value)
    if value is None:
        return ""
    exact = value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return format_html(
        '<time datetime="{}" title="{}" data-rel>{}</time>',
        value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z"),
        exact,
        relative(value),
    )


@register.simple_tag
def elapsed_since(value):
    """'1 min 5 s' since value (for a running turn); alineo.js keeps it ticking."""
    value = _aware(value)
    if value is None:
        return ""
    seconds = max(0, int((datetime.now(timezone.utc) - value).total_seconds()))
    text = f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"
    return format_html(
        '<time datetime="{}" title="started {}" data-elapsed>{}</time>',
        value.isoformat().replace("+00:00", "Z"),
        value.strftime("%Y-%m-%d %H:%M:%S UTC"),
        text,
    )


@register.filter
def status_badge(status: str):
    label, shape = STATUS.get(status, (str(status).title(), "dot"))
    return format_html(
        '<span class="badge status-{}" data-status="{}"><span aria-hidden="true">{}</span> {}</span>',
        status, status, icon(shape), label,
    )


@register.filter
def row_tag(r) -> str:
    """The opening <li> of a transcript row (sessions/_event_rows.html), built in one
    go: a 300-row page resolves far fewer template variables this way."""
    ev, v = r["ev"], r["v"]
    attrs = [("id", f"row-{ev.seq}"), ("data-seq", ev.seq), ("data-type", ev.type),
             ("data-ts", isots(ev.ts))]
    if v.get("turn") is not None:
        attrs.append(("data-turn", v["turn"]))
    if v.get("run"):
        attrs.append(("data-run", v["run"]))
        if v.get("final"):
            attrs.append(("data-final", "1"))
    for key, name in (("call", "data-call"), ("result_of", "data-result-of")):
        if v.get(key):
            attrs.append((name, v[key]))
    bridge_ts = isots(v.get("bridge_ts"))
    if bridge_ts:
        attrs.append(("data-bts", bridge_ts))
    classes = ["row", f"kind-{v['kind']}"]
    classes += [c for c, on in (("failed", v.get("failed")), ("sys", v.get("sys"))) if on]
    if v.get("run"):
        classes.append("run-head" if v.get("head") else "merged")
    attrs.append(("class", " ".join(classes)))
    return format_html("<li{}>", format_html_join("", ' {}="{}"', attrs))


@register.filter
def isots(value) -> str:
    """ISO 8601 UTC with microseconds, or "" for what is not a time (data-ts,
    data-bts: alineo.js times tool calls with them)."""
    value = _aware(value)
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if value else ""


@register.filter
def filesize(n) -> str:
    try:
        n = float(n)
    except (TypeError, ValueError):
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _raw(value) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    except (RecursionError, TypeError, ValueError):
        # indent=2 takes json's recursive pure-Python encoder, and sort_keys
        # refuses mixed key types; the C encoder shows it on one line.
        try:
            return json.dumps(value, ensure_ascii=False)
        except (RecursionError, TypeError, ValueError):
            return "(too deeply nested to show)"


def _is_long(text: str) -> bool:
    return len(text) > LONG_CHARS or text.count("\n") >= LONG_LINES


#: Blocks whose kind is plain from what they hold; any other says its label.
PLAIN_BLOCKS = ("command", "path", "input", "output", "stderr")


def _block(label: str, value, long: bool | None = None) -> dict:
    text = _raw(value)
    return {"label": label, "text": text, "long": _is_long(text) if long is None else long,
            "labelled": label not in PLAIN_BLOCKS,
            "size": len(text), "bytes": filesize(len(text.encode("utf-8", "replace"))),
            "lines": text.count("\n") + 1}


#: Shell tools by the names harnesses give them: the built-in bridge's and
#: Pi's ``bash`` (sandboxes/bridge/tools.py, pi_rpc.PI_TOOLS), and ``run``,
#: which older transcripts carry.
SHELL_TOOLS = ("bash", "run")
#: Keys a shell tool's input may have besides its command (Pi's and ours: a timeout).
SHELL_EXTRAS = {"timeout"}
#: The file tools' keys: ours (path, content, old, new) and Pi's (offset,
#: limit, edits of {oldText, newText}).
FILE_KEYS = {"path", "content", "old", "new", "offset", "limit", "edits"}


def _tool_input(name, value) -> list[dict]:
    """A tool call's input as the operator reads it: ``$ command`` for a shell
    tool (or any tool whose input is only a command), the path first for the
    file tools, else the JSON."""
    value = value if isinstance(value, dict) else {"input": value}
    command = value.get("command")
    only_a_command = set(value) <= {"command"} | SHELL_EXTRAS
    if isinstance(command, str) and (name in SHELL_TOOLS or only_a_command):
        rest = {k: v for k, v in value.items() if k != "command"}
        return [_block("command", "$ " + command)] + [_block(k, v) for k, v in sorted(rest.items())]
    if isinstance(value.get("path"), str) and set(value) <= FILE_KEYS:
        return [_block("path", value["path"])] + _file_details(value)
    return [_block("input", value)]


def _file_details(value: dict) -> list[dict]:
    """What a file tool does besides naming its path; Pi's edits read as old/new pairs."""
    rest = {k: v for k, v in value.items() if k not in ("path", "edits")}
    blocks = [_block(k, v) for k, v in sorted(rest.items())]
    edits = value.get("edits")
    if edits is None:
        return blocks
    pairs = edits if isinstance(edits, list) and all(
        isinstance(e, dict) and set(e) <= {"oldText", "newText"} for e in edits) else None
    if pairs is None:  # not Pi's shape: shown as it came
        return blocks + [_block("edits", edits)]
    for i, edit in enumerate(pairs, 1):
        n = f" {i}" if len(pairs) > 1 else ""
        blocks += [_block(f"old{n}", edit.get("oldText", "")),
                   _block(f"new{n}", edit.get("newText", ""))]
    return blocks


_TITLES = {
    "agent.spawned": "Spawned",
    "agent.status": "Status",
    "agent.restored": "Restored",
    "agent.lost": "Lost",
    "credential.approval_requested": "Approval requested",
    "credential.approved": "Credential approved",
    "credential.denied": "Credential denied",
    "agent.child_spawned": "Child spawned",
    "agent.checkpointed": "Checkpoint",
    "agent.checkpoint_failed": "Checkpoint failed",
    "agent.home_snapshot": "Live home looked at",
    "agent.home_snapshot_failed": "Live home not looked at",
    "command.home_snapshot": "Look at the live home",
    "turn.started": "Turn started",
    "turn.finished": "Turn finished",
    "turn.interrupted": "Turn interrupted",
    "message.user": "You",
    "message.assistant": "Assistant",
    "message.delta": "…",
    "tool.dispatched": "Tool call",
    "tool.result": "Tool result",
    "steer.delivered": "Steer delivered",
    "command.prompt": "Prompt",
    "command.steer": "Steer",
    "operator.note": "Note",
    "command.failed": "Command failed",
    "model.call": "Model call",
    "model.replayed": "Model call (from the journal)",
    "budget.exceeded": "Budget exceeded",
}


# What each rung of the restore ladder did, and why it was taken (the
# reasons the worker journals: sessions/worker/ladder.py, operations.py, plans.py).
RUNGS = {
    "reattach": "Reattached to its running sandbox",
    "resume": "Restarted its bridge on its session",
    "restart": "Started its stopped sandbox again, disk intact",
    "restore": "Restored into a fresh sandbox from a checkpoint",
    "rebuild": "Rebuilt from the transcript on a fresh sandbox",
}
CAUSES = {
    "control_plane_restart": "after the control plane restarted",
    "worker_takeover": "after another worker took the agent over",
    "bridge_unresponsive": "because its bridge stopped answering",
    "bridge_exited": "because its bridge had exited",
    "client_resume": "because a client asked to resume it",
    "sandbox_exited": "because the sandbox had stopped (a reboot or an engine restart)",
    "sandbox_missing": "because the sandbox was gone",
    "sandbox_cannot_start": "because the sandbox could not start",
    "engine_unreachable_from_worker": "because its engine is on a machine this worker cannot reach",
}


@register.filter
def restore_sentence(data) -> str:
    """An ``agent.restored`` fact (or the state's last restore) in plain words."""
    data = data if isinstance(data, dict) else {}
    rung, reason = data.get("rung"), data.get("reason")
    text = RUNGS.get(rung, f"Recovered ({rung})")
    if rung == "restore" and data.get("checkpoint"):
        text = text.replace("a checkpoint", f"checkpoint {data['checkpoint']}"
                            + (f" (turn {data['checkpoint_turn']})" if data.get("checkpoint_turn") else ""))
    cause = CAUSES.get(data.get("cause") or reason)
    if cause:
        text += f" {cause}"
    if rung == "rebuild" and reason in REBUILD_REASONS:
        text += f"; its files are not back: {REBUILD_REASONS[reason]}"
    return text + "."


def _call_meta(data: dict) -> str:
    """provider · tokens in/out · cost · latency of a ``model.call`` (docs/GATEWAY.md)."""
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    parts = [str(data.get("provider", "?")),
             f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens"]
    cost = data.get("cost_usd")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool):
        parts.append(f"${cost:.6f}")
    parts.append(f"{data.get('latency_ms', '?')} ms")
    return " · ".join(parts)


@register.filter
def event_view(event) -> dict:
    """How a transcript row is shown: a title, an optional text, optional raw blocks."""
    etype = event.type
    data = event.data if isinstance(event.data, dict) else {"value": event.data}
    kind = etype.split(".")[0]
    view = {"title": _TITLES.get(etype, etype), "kind": kind, "text": "", "meta": "", "blocks": []}
    if etype in ("message.user", "message.assistant", "message.delta", "command.prompt",
                 "command.steer", "steer.delivered", "operator.note"):
        view["text"] = str(data.get("text", ""))
        if data.get("by"):
            view["meta"] = f"by {data['by']}"
        if data.get("model") == "demo" or data.get("provider") == "demo":
            view["meta"] = (view["meta"] + " · demo model").strip(" ·")
    elif etype == "tool.dispatched":
        view["title"] = f"Tool call · {data.get('name', '?')}"
        view["meta"] = str(data.get("tool_call_id", ""))
        view["blocks"] = _tool_input(data.get("name"), data.get("input", {}))
    elif etype == "tool.result":
        code = data.get("exit_code", data.get("exit"))
        view["meta"] = ("" if code is None else f"exit {code}") + (
            " · interrupted" if data.get("interrupted") else "")
        view["failed"] = code not in (None, 0)
        view["blocks"] = [_block("output", data.get("output", ""))]
        if isinstance(data.get("stderr"), str) and data["stderr"]:
            view["blocks"].append(_block("stderr", data["stderr"]))
    elif etype == "agent.status":
        view["status"] = str(data.get("status", ""))
        view["meta"] = str(data.get("reason", ""))
    elif etype == "agent.restored":
        view["text"] = restore_sentence(data)
        view["meta"] = f"rung {data.get('rung', '?')} · {data.get('reason', '')}"
    elif etype in ("turn.started", "turn.finished", "turn.interrupted"):
        # The turn's text is already on screen, message by message: shown once.
        n = data.get("turn")
        view["title"] = {"turn.started": "Turn {}", "turn.finished": "Turn {} finished",
                         "turn.interrupted": "Turn {} interrupted"}[etype].format(n if n is not None else "")
        view["usage"] = usage_line(data.get("usage")) if etype != "turn.started" else ""
        if etype == "turn.interrupted":
            view["meta"] = str(data.get("reason", "")).replace("_", " ")
            if data.get("text"):
                view["blocks"] = [_block("text that survived", data["text"], long=True)]
    elif etype == "agent.lost":
        view["text"] = str(data.get("text", "") or data.get("reason", ""))
    elif etype in ("credential.approved", "credential.denied"):
        names = ", ".join(str(n) for n in data.get("bindings") or [])
        view["text"] = f"{names} by {data.get('by', '?')}" + (
            f": {data['reason']}" if data.get("reason") else "")
    elif etype == "agent.spawned":
        spec = data.get("spec") or {}
        model = spec.get("model", "?") if isinstance(spec, dict) else "?"
        view["meta"] = f"model {model}" + (" (demo model)" if model == "demo" else "") + (
            f" · by {data['by']}" if data.get("by") else "")
        view["blocks"] = [_block("spec", spec)]
    elif etype == "model.call":
        view["meta"] = _call_meta(data)
        view["failed"] = data.get("status") == "error"
        view["blocks"] = [_block("response" if "response" in data else "error",
                                 data.get("response", data.get("error", {})))]
    elif etype == "budget.exceeded":
        unit = "tokens" if data.get("limit") == "tokens" else "USD"
        view["text"] = (f"The workspace's daily {unit} budget is spent: the model call was "
                        "refused and the turn ends.")
        view["meta"] = f"{data.get('spent', '?')} of {data.get('budget', '?')} {unit} · {data.get('day', '')} UTC"
        view["failed"] = True
    elif etype == "command.failed":
        view["text"] = str(data.get("reason", ""))
        view["meta"] = " · ".join(str(data[k]) for k in ("verb", "code") if data.get(k))
        view["failed"] = True
    elif etype == "agent.child_spawned":
        child = data.get("child")
        if isinstance(child, str) and AGENT_ID.fullmatch(child):  # else {% url %} would raise
            view["child"] = child
        else:
            view["blocks"] = [_block("data", data)]
    else:
        if data:
            view["blocks"] = [_block("data", data)]
    return view


@register.simple_tag
def new_key() -> str:
    """A fresh Idempotency-Key for a form drawn now."""
    import uuid

    return str(uuid.uuid4())


@register.filter
def cut_prefix(name: str, path: str) -> str:
    """A name inside the directory `path`, without the directory (the Files view)."""
    return name[len(path) + 1:] if path and name.startswith(path + "/") else name

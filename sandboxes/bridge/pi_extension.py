"""What Pi cannot do by itself, through a Pi extension that asks the bridge.

Pi loads extensions (``--extension <file>``) that can block a tool call
(``tool_call``), rewrite a tool's result (``tool_result``) and register tools
(``registerTool``). In RPC mode an extension's dialog (``ctx.ui.input``) is
an ``extension_ui_request`` on Pi's stdout, answered by an
``extension_ui_response`` on its stdin: that is the channel. The extension
the bridge writes (into the run dir at every Pi start, so the agent cannot
have changed what Pi loads) uses it for:

- ``pre_tool_use``: before each of Pi's tool calls, the bridge runs the spec's
  hook (hooks.py) and journals ``hook.verdict``; a denial blocks the call,
  its result "denied by the pre_tool_use hook: …", as with the built-in harness;
- the ``spawn`` and ``memory`` tools: run by the bridge (tools.py), as the
  built-in harness runs them (a ``request.*`` fact, the control plane's reply);
- redaction: bound values are replaced in every tool result before Pi keeps it
  (its session file, the model's context), so no checkpoint carries them.

Config comes in the environment (``ALINEO_PI_EXTENSION``, JSON, no secret
values: the extension reads bound values by their variable's name).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from .tools import SCHEMAS

log = logging.getLogger("bridge")

#: Tools the bridge runs for Pi (the extension registers them).
BRIDGE_TOOLS = ("spawn", "memory")
#: The dialog titles the extension asks with.
ASK_HOOK = "alineo:pre_tool_use"
ASK_TOOL = "alineo:tool"
#: Pi's dialogs that wait for an answer; any other of them is cancelled.
DIALOGS = ("select", "confirm", "input", "editor")
EXTENSION_FILE = "pi-extension.mjs"
ENV = "ALINEO_PI_EXTENSION"
MAX_ANSWER = 30_000

SOURCE = r"""// Written by the Alineo bridge at every Pi start (sandboxes/bridge/pi_extension.py).
const config = JSON.parse(process.env.ALINEO_PI_EXTENSION || "{}");
const MIN_LEN = 6;
const secrets = (config.redact || [])
  .map((b) => [process.env[b.env], b.placeholder])
  .filter(([v]) => typeof v === "string" && v.length >= MIN_LEN)
  .sort((a, b) => b[0].length - a[0].length);

function redact(value) {
  if (typeof value === "string") {
    for (const [secret, placeholder] of secrets) value = value.split(secret).join(placeholder);
    return value;
  }
  if (Array.isArray(value)) return value.map(redact);
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, redact(v)]));
  }
  return value;
}

async function ask(ctx, title, data, signal) {
  const answer = await ctx.ui.input(title, JSON.stringify(data), { signal });
  try {
    return JSON.parse(answer ?? "");
  } catch {
    return { error: "the bridge did not answer" };
  }
}

export default function (pi) {
  if (config.pre_tool_use) {
    pi.on("tool_call", async (event, ctx) => {
      const verdict = await ask(ctx, "alineo:pre_tool_use",
        { toolCallId: event.toolCallId, toolName: event.toolName, input: event.input }, ctx.signal);
      if (verdict.allow !== true) {
        return { block: true, reason: verdict.reason || verdict.error || "denied by the pre_tool_use hook" };
      }
    });
  }
  if (secrets.length) {
    pi.on("tool_result", async (event) => ({ content: redact(event.content), details: redact(event.details) }));
  }
  for (const tool of config.tools || []) {
    pi.registerTool({
      name: tool.name,
      label: tool.name,
      description: tool.description,
      parameters: tool.parameters,
      async execute(toolCallId, params, signal, onUpdate, ctx) {
        const result = await ask(ctx, "alineo:tool", { toolCallId, name: tool.name, input: params }, signal);
        const output = typeof result.output === "string" ? result.output : (result.error || "no answer");
        if (result.is_error !== false) throw new Error(output);
        return { content: [{ type: "text", text: output }], details: {} };
      },
    });
  }
}
"""


@dataclass(frozen=True)
class ExtensionConfig:
    """What the extension does for one Pi: the hook, the tools, the bindings."""

    pre_tool_use: bool
    tools: tuple[str, ...]
    redact: tuple[tuple[str, str], ...]  # (env variable, placeholder)

    @property
    def wanted(self) -> bool:
        return bool(self.pre_tool_use or self.tools or self.redact)

    def environ(self) -> dict:
        return {ENV: json.dumps({
            "pre_tool_use": self.pre_tool_use,
            "tools": [{"name": n, "description": SCHEMAS[n]["description"],
                       "parameters": SCHEMAS[n]["input_schema"]} for n in self.tools],
            "redact": [{"env": env, "placeholder": p} for env, p in self.redact]})}

    def write(self, run_dir: str) -> Path:
        path = Path(run_dir) / EXTENSION_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(SOURCE)
        tmp.replace(path)
        return path


def dialog_answer(request_id: str, value: str | None) -> dict:
    """Pi's extension_ui_response: a value, or cancelled (None)."""
    if value is None:
        return {"type": "extension_ui_response", "id": request_id, "cancelled": True}
    return {"type": "extension_ui_response", "id": request_id, "value": value[:MAX_ANSWER * 2]}


def asked(event: dict) -> tuple[str, dict] | None:
    """(title, data) of one of our extension's questions, or None."""
    title = event.get("title")
    if event.get("method") != "input" or title not in (ASK_HOOK, ASK_TOOL):
        return None
    try:
        data = json.loads(event.get("placeholder") or "")
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("toolCallId"), str):
        return None
    return title, data

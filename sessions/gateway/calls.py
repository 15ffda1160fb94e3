"""A model call as a fact: what `model.call` journals and `model.replayed`
answers from (docs/GATEWAY.md "What is journaled"). Pure: no database here."""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import asdict, dataclass

from .messages import ModelReply, ModelRequest, Stop, ToolCall, Usage


class CallStatus(str, enum.Enum):
    OK = "ok"
    ERROR = "error"


@dataclass(frozen=True)
class CallRecord:
    provider: str                 # the upstream: demo, openai:<model>, anthropic:<model>
    model: str                    # what the harness asked for (the spec's model answers)
    api: str                      # the API the harness spoke: openai / anthropic
    request_hash: str
    latency_ms: int
    status: CallStatus
    usage: Usage = Usage()
    cost_usd: float | None = 0.0
    reply: ModelReply | None = None
    error: str = ""
    error_status: int = 0

    def fact(self) -> dict:
        """The `model.call` data: the response, never the request body again
        (the conversation is already in the transcript)."""
        data = {"provider": self.provider, "model": self.model, "api": self.api,
                "request_hash": self.request_hash, "latency_ms": self.latency_ms,
                "status": self.status.value, "usage": asdict(self.usage),
                "cost_usd": self.cost_usd}
        if self.reply is not None:
            data["response"] = {"text": self.reply.text, "stop": self.reply.stop.value,
                                "tool_calls": [{"id": c.id, "name": c.name, "input": c.input}
                                               for c in self.reply.tool_calls]}
        if self.status is CallStatus.ERROR:
            data["error"] = {"status": self.error_status, "message": self.error[:4000]}
        return data


def request_hash(request: ModelRequest) -> str:
    """The same call whatever API, stream flag or key it came with: the
    conversation, system, tools and token limit, canonically."""
    canonical = {
        "system": request.system, "max_tokens": request.max_tokens,
        "messages": [[m.role.value, m.text, [[c.id, c.name, c.input] for c in m.tool_calls],
                      m.tool_call_id, m.is_error] for m in request.messages],
        "tools": [[t.name, t.description, t.schema] for t in request.tools],
    }
    raw = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(raw.encode()).hexdigest()


def reply_of(fact: dict) -> ModelReply:
    """The reply a journaled `model.call` carried (for `model.replayed`)."""
    response, usage = fact["response"], fact.get("usage") or {}
    return ModelReply(response["text"],
                      tuple(ToolCall(c["id"], c["name"], c["input"])
                            for c in response["tool_calls"]),
                      Stop(response["stop"]), Usage(**usage))


def cost_usd(provider: str, usage: Usage, prices: dict) -> float | None:
    """USD from the price table (per million tokens; ALINEO_MODEL_PRICES);
    0 for the demo, None for a model without a price."""
    if provider == "demo":
        return 0.0
    price = prices.get(provider)
    if price is None:
        return None
    total = (usage.input_tokens * price.get("input", 0)
             + usage.output_tokens * price.get("output", 0)
             + usage.cache_read_tokens * price.get("cache_read", price.get("input", 0))
             + usage.cache_write_tokens * price.get("cache_write", price.get("input", 0)))
    return round(total / 1_000_000, 8)

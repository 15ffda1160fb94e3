"""Real upstreams: an OpenAI-compatible base URL, or Anthropic. The key is
added HERE, by the control plane, to the upstream request: it never enters
the sandbox (docs/GATEWAY.md "Credentials"). The call is made without
streaming and re-streamed to the harness by the server."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from dataclasses import dataclass

from . import anthropic_wire, openai_wire
from .errors import UpstreamError
from .messages import ModelReply, ModelRequest

OPENAI_BASE = "https://api.openai.com/v1"
ANTHROPIC_BASE = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
#: An upstream answer larger than this is refused (a model reply is far smaller).
MAX_ANSWER = 64 << 20


@dataclass(frozen=True)
class Target:
    """Where an upstream is and the key it takes (empty: a local server without one)."""
    model: str
    base_url: str
    key: str = ""
    timeout: float = 300.0

    def __repr__(self) -> str:  # never print the key by accident
        return f"Target(model={self.model!r}, base_url={self.base_url!r}, key=<hidden>)"


class OpenAIUpstream:
    def __init__(self, target: Target):
        self.target = target
        self.label = f"openai:{target.model}"

    def model_ids(self) -> list[str]:
        return [self.target.model]

    async def complete(self, request: ModelRequest) -> ModelReply:
        t = self.target
        headers = {"authorization": f"Bearer {t.key}"} if t.key else {}
        data = await asyncio.to_thread(post, f"{t.base_url.rstrip('/')}/chat/completions",
                                       openai_wire.request_body(request, t.model), headers, t)
        return openai_wire.parse_completion(data)


class AnthropicUpstream:
    def __init__(self, target: Target):
        self.target = target
        self.label = f"anthropic:{target.model}"

    def model_ids(self) -> list[str]:
        return [self.target.model]

    async def complete(self, request: ModelRequest) -> ModelReply:
        t = self.target
        headers = {"x-api-key": t.key, "anthropic-version": ANTHROPIC_VERSION}
        data = await asyncio.to_thread(post, f"{t.base_url.rstrip('/')}/v1/messages",
                                       anthropic_wire.request_body(request, t.model), headers, t)
        return anthropic_wire.parse_message(data)


def post(url: str, body: dict, headers: dict, target: Target) -> dict:
    """POST JSON, read JSON. Every failure is an UpstreamError whose message
    never holds the key (an upstream may echo request headers back)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=target.timeout) as answer:
            raw = answer.read(MAX_ANSWER + 1)
    except urllib.error.HTTPError as exc:
        raise _http_error(exc, target) from None
    except (socket.timeout, TimeoutError):
        raise UpstreamError("the upstream did not answer in time", status=504,
                            code="upstream_timeout") from None
    except (urllib.error.URLError, OSError) as exc:
        raise UpstreamError(_clean(f"the upstream cannot be reached: {exc}", target)) from None
    if len(raw) > MAX_ANSWER:
        raise UpstreamError("the upstream's answer is too large")
    try:
        value = json.loads(raw)
    except ValueError:
        raise UpstreamError("the upstream's answer is not JSON") from None
    if not isinstance(value, dict):
        raise UpstreamError("the upstream's answer is not a JSON object")
    return value


def _http_error(exc: urllib.error.HTTPError, target: Target) -> UpstreamError:
    """The upstream's own status and message: a 4xx stays the caller's 4xx."""
    try:
        detail = json.loads(exc.read(64 * 1024) or b"{}")
        message = (detail.get("error") or {}).get("message") or exc.reason
    except (ValueError, AttributeError, OSError):
        message = exc.reason
    status = exc.code if 400 <= exc.code < 500 else 502
    error = UpstreamError(_clean(f"upstream {exc.code}: {message}", target), status=status)
    error.permanent = status < 500 and status != 429
    return error


def _clean(text: str, target: Target) -> str:
    if target.key and len(target.key) >= 4:
        text = text.replace(target.key, "[redacted]")
    return text[:4000]

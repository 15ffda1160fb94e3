"""Streaming clients (the real `openai` and `anthropic` SDKs, `stream=True`)
against a real (fake) upstream on 127.0.0.1, journaled as the worker does:
the stream carries the text, tool calls and usage, and the `model.call` fact
holds the same. Upstream errors and timeouts, streaming or not, are facts too
and reach the harness in its own API's error shape (its SDK's exception)."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from sessions.gateway.upstreams import AnthropicUpstream, OpenAIUpstream, Target
from tests.unit.bridge.fake_models import Hang, Raw

from .conftest import anthropic_client, facts, openai_client, turn
from .test_upstreams import BASH, CANARY, completion, message

pytestmark = pytest.mark.django_db(transaction=True)

PRICES = {"openai:gpt-fake": {"input": 1.0, "output": 2.0, "cache_read": 0.5},
          "anthropic:claude-fake": {"input": 3.0, "output": 15.0, "cache_read": 0.3,
                                    "cache_write": 3.75}}
ASK = [{"role": "user", "content": "where am I"}]


def openai_upstream(fake, timeout: float = 300.0):
    return OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", CANARY, timeout=timeout))


def anthropic_upstream(fake, timeout: float = 300.0):
    return AnthropicUpstream(Target("claude-fake", fake.url, CANARY, timeout=timeout))


def test_an_openai_stream_with_tool_calls_and_usage_is_journaled(listen, fake, agent):
    turn(agent, 1)
    fake.script = [completion("Let me look at a rather long directory listing.",
                              [("bash", {"command": "pwd"})])]
    stream = openai_client(listen(openai_upstream(fake))).chat.completions.create(
        model="gpt-4o", messages=ASK, tools=[BASH], stream=True,
        stream_options={"include_usage": True})
    text, calls, usage, finish = [], {}, None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": "", "name": "", "args": ""})
                slot["id"] = call.id or slot["id"]
                slot["name"] = (call.function.name or slot["name"]) if call.function else slot["name"]
                slot["args"] += (call.function.arguments or "") if call.function else ""
    assert "".join(text) == "Let me look at a rather long directory listing."
    assert [(c["name"], json.loads(c["args"])) for c in calls.values()] == [
        ("bash", {"command": "pwd"})]
    assert finish == "tool_calls" and usage.completion_tokens == 7
    assert fake.requests[0]["headers"]["authorization"] == f"Bearer {CANARY}"
    assert fake.requests[0]["body"]["stream"] is False
    [call] = facts(agent, "model.call")
    data = call.data
    assert (data["status"], data["api"], data["provider"], data["turn"]) == (
        "ok", "openai", "openai:gpt-fake", 1)
    assert data["response"] == {"text": "Let me look at a rather long directory listing.",
                                "stop": "tool_use", "tool_calls": [
                                    {"id": calls[0]["id"], "name": "bash",
                                     "input": {"command": "pwd"}}]}
    assert data["usage"] == {"input_tokens": 20, "output_tokens": 7, "cache_read_tokens": 100,
                             "cache_write_tokens": 0}
    assert data["cost_usd"] == pytest.approx((20 * 1.0 + 7 * 2.0 + 100 * 0.5) / 1e6)


def test_an_anthropic_stream_with_tool_use_and_cache_usage_is_journaled(listen, fake, agent):
    turn(agent, 1)
    fake.script = [message("Checking.", [("Bash", {"command": "ls -a"})])]
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
    with anthropic_client(listen(anthropic_upstream(fake))).messages.stream(
            model="claude", max_tokens=100, messages=ASK, tools=tools) as stream:
        pieces = [event.delta.text for event in stream
                  if event.type == "content_block_delta" and event.delta.type == "text_delta"]
        final = stream.get_final_message()
    assert "".join(pieces) == "Checking." and final.stop_reason == "tool_use"
    use = next(b for b in final.content if b.type == "tool_use")
    assert (use.name, use.input) == ("Bash", {"command": "ls -a"})
    assert fake.requests[0]["headers"]["x-api-key"] == CANARY
    [call] = facts(agent, "model.call")
    data = call.data
    assert (data["status"], data["api"], data["provider"]) == (
        "ok", "anthropic", "anthropic:claude-fake")
    assert data["response"]["tool_calls"] == [{"id": use.id, "name": "Bash",
                                               "input": {"command": "ls -a"}}]
    assert data["usage"] == {"input_tokens": 50, "output_tokens": 9, "cache_read_tokens": 30,
                             "cache_write_tokens": 4}
    assert data["cost_usd"] == pytest.approx((50 * 3.0 + 9 * 15.0 + 30 * 0.3 + 4 * 3.75) / 1e6)


def test_upstream_errors_while_streaming_are_facts_in_the_callers_shape(listen, fake, agent):
    turn(agent, 1)
    fake.script = [Raw(500, b"internal oops"),
                   Raw(401, json.dumps({"type": "error", "error": {
                       "type": "authentication_error", "message": f"bad key {CANARY}"}}).encode()),
                   Raw(200, b"not json at all")]
    sock = listen(openai_upstream(fake))
    with pytest.raises(openai.InternalServerError) as caught:
        openai_client(sock).chat.completions.create(model="m", messages=ASK, stream=True)
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "upstream_error"  # OpenAI's shape: {"error": {…}}
    with pytest.raises(anthropic.AuthenticationError) as denied:
        with anthropic_client(sock).messages.stream(model="m", max_tokens=10, messages=ASK) as s:
            s.get_final_message()
    body = denied.value.body
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert CANARY not in json.dumps(body) and "[redacted]" in body["error"]["message"]
    with pytest.raises(openai.APIStatusError) as garbled:
        openai_client(sock).chat.completions.create(model="m", messages=ASK + ASK, stream=True)
    assert garbled.value.status_code == 502
    calls = [c.data for c in facts(agent, "model.call")]
    assert [(c["status"], c["error"]["status"]) for c in calls] == [
        ("error", 502), ("error", 401), ("error", 502)]
    assert calls[1]["api"] == "anthropic" and CANARY not in json.dumps(calls)
    assert "not JSON" in calls[2]["error"]["message"]
    assert all("response" not in c for c in calls)


def test_an_upstream_timeout_is_a_fact_and_a_504_in_either_shape(listen, fake, agent):
    turn(agent, 1)
    fake.script = [Hang(3), Hang(3)]
    sock = listen(openai_upstream(fake, timeout=0.5))
    with pytest.raises(openai.APIStatusError) as caught:
        openai_client(sock).chat.completions.create(model="m", messages=ASK, stream=True)
    assert caught.value.status_code == 504 and caught.value.body["code"] == "upstream_timeout"
    with pytest.raises(anthropic.APIStatusError) as late:
        anthropic_client(sock).messages.create(model="m", max_tokens=10, messages=ASK + ASK)
    assert late.value.status_code == 504 and late.value.body["type"] == "error"
    calls = [c.data for c in facts(agent, "model.call")]
    assert [(c["status"], c["error"]["status"], c["api"]) for c in calls] == [
        ("error", 504, "openai"), ("error", 504, "anthropic")]
    assert all("did not answer in time" in c["error"]["message"] for c in calls)

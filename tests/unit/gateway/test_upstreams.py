"""Real upstreams behind the gateway: a fake OpenAI-compatible / Anthropic
server on 127.0.0.1 (tests/unit/bridge/fake_models.py) and the real SDKs in
front. The key is added by the gateway: it reaches the upstream, and nothing
the harness sends or gets back holds it."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from sessions.gateway.upstreams import AnthropicUpstream, OpenAIUpstream, Target
from tests.unit.bridge.fake_models import FakeModelServer, Hang, Raw

from .conftest import anthropic_client, openai_client

CANARY = "sk-canary-7f3a9b2c4d"
BASH = {"type": "function", "function": {"name": "bash", "description": "run",
                                         "parameters": {"type": "object", "properties": {
                                             "command": {"type": "string"}}}}}


def completion(content=None, calls=()):
    return Raw(200, json.dumps({
        "id": "x", "object": "chat.completion", "model": "gpt-fake",
        "choices": [{"index": 0, "finish_reason": "tool_calls" if calls else "stop",
                     "message": {"role": "assistant", "content": content, "tool_calls": [
                         {"id": f"call_{i}", "type": "function",
                          "function": {"name": n, "arguments": json.dumps(a)}}
                         for i, (n, a) in enumerate(calls)] or None}}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 7,
                  "prompt_tokens_details": {"cached_tokens": 100}}}).encode())


def message(text="", uses=()):
    content = ([{"type": "text", "text": text}] if text else []) + [
        {"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": a}
        for i, (n, a) in enumerate(uses)]
    return Raw(200, json.dumps({
        "id": "msg_x", "type": "message", "role": "assistant", "model": "claude-fake",
        "content": content, "stop_reason": "tool_use" if uses else "end_turn",
        "usage": {"input_tokens": 50, "output_tokens": 9, "cache_read_input_tokens": 30,
                  "cache_creation_input_tokens": 4}}).encode())


@pytest.fixture
def fake():
    with FakeModelServer() as server:
        yield server


def test_openai_sdk_to_an_openai_upstream_with_the_key_injected(serve, fake):
    fake.script = [completion("let me look", [("bash", {"command": "ls"})])]
    sock = serve(OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", CANARY)))
    done = openai_client(sock).chat.completions.create(
        model="anything", tools=[BASH], messages=[{"role": "user", "content": "list files"}])
    call = done.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("bash", {"command": "ls"})
    assert done.usage.prompt_tokens == 120 and done.usage.prompt_tokens_details.cached_tokens == 100
    got = fake.requests[0]
    assert got["path"] == "/v1/chat/completions"
    assert got["headers"]["authorization"] == f"Bearer {CANARY}"   # the gateway's key
    assert got["body"]["model"] == "gpt-fake"                      # the spec's model
    assert got["body"]["messages"] == [{"role": "user", "content": "list files"}]
    assert "placeholder" not in json.dumps(got)                    # the harness's key stays here


def test_a_stream_to_the_harness_from_an_upstream_answer(serve, fake):
    fake.script = [completion("a streamed answer from upstream")]
    sock = serve(OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", CANARY)))
    chunks = list(openai_client(sock).chat.completions.create(
        model="x", stream=True, messages=[{"role": "user", "content": "hi"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "a streamed answer from upstream"
    assert fake.requests[0]["body"]["stream"] is False


def test_anthropic_sdk_to_anthropic_with_the_key_injected(serve, fake):
    fake.script = [message("ok", [("Bash", {"command": "pwd"})])]
    sock = serve(AnthropicUpstream(Target("claude-fake", fake.url, CANARY)))
    with anthropic_client(sock).messages.stream(
            model="x", max_tokens=100, messages=[{"role": "user", "content": "where am I"}],
            tools=[{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]
    ) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        ("Bash", {"command": "pwd"})]
    assert final.usage.cache_read_input_tokens == 30 and final.usage.input_tokens == 50
    got = fake.requests[0]
    assert got["path"] == "/v1/messages" and got["headers"]["x-api-key"] == CANARY
    assert got["body"]["model"] == "claude-fake"


def test_anthropic_sdk_to_an_openai_upstream_is_translated(serve, fake):
    fake.script = [completion(None, [("bash", {"command": "id"})]), completion("done")]
    client = anthropic_client(serve(OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", CANARY))))
    tools = [{"name": "bash", "description": "run", "input_schema": {"type": "object"}}]
    first = client.messages.create(model="x", max_tokens=64, tools=tools,
                                   messages=[{"role": "user", "content": "who am I"}])
    use = next(b for b in first.content if b.type == "tool_use")
    client.messages.create(model="x", max_tokens=64, tools=tools, messages=[
        {"role": "user", "content": "who am I"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": "bash",
                                           "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "root"}]}])
    sent = fake.requests[1]["body"]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == use.id
    assert sent[2] == {"role": "tool", "tool_call_id": use.id, "content": "root"}


def test_an_upstream_error_keeps_its_status_and_never_the_key(serve, fake):
    echo = json.dumps({"error": {"message": f"bad key {CANARY}"}}).encode()
    fake.script = [Raw(401, echo), Raw(500, b"oops")]
    client = openai_client(serve(OpenAIUpstream(Target("gpt-fake", f"{fake.url}/v1", CANARY))))
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
    assert CANARY not in str(caught.value.body) and "[redacted]" in caught.value.message
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 502


def test_an_unreachable_or_slow_upstream_is_a_5xx_in_the_callers_shape(serve, fake):
    dead = anthropic_client(serve(AnthropicUpstream(Target("c", "http://127.0.0.1:9", CANARY)),
                                  agent_id="a-dead"))
    with pytest.raises(anthropic.APIStatusError) as caught:
        dead.messages.create(model="x", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 502
    fake.script = [Hang(3)]
    slow = openai_client(serve(OpenAIUpstream(Target("g", f"{fake.url}/v1", CANARY, timeout=0.5)),
                               agent_id="a-slow"))
    with pytest.raises(openai.APIStatusError) as caught:
        slow.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}])
    assert caught.value.status_code == 504

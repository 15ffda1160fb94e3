"""The real openai SDK against the gateway's demo upstream."""

from __future__ import annotations

import json

import openai
import pytest

from .conftest import openai_client

BASH = {"type": "function", "function": {
    "name": "bash", "description": "run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                   "required": ["command"]}}}
READ = {"type": "function", "function": {
    "name": "read_file", "description": "read a file",
    "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}}}}


def test_models_lists_the_demo(serve):
    client = openai_client(serve())
    assert [m.id for m in client.models.list()] == ["demo"]


def test_a_run_directive_is_a_tool_call_in_the_callers_schema(serve):
    client = openai_client(serve())
    done = client.chat.completions.create(
        model="whatever", tools=[BASH, READ],
        messages=[{"role": "user", "content": "run: ls -la\nread: notes.txt"}])
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls]
    assert calls == [("bash", {"command": "ls -la"}), ("read_file", {"file_path": "notes.txt"})]
    assert choice.message.content.startswith("[demo] Running 2 tool calls")
    assert done.usage.prompt_tokens > 0 and done.usage.completion_tokens > 0
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens


def test_the_stream_carries_text_in_chunks_tool_calls_and_usage(serve):
    client = openai_client(serve())
    chunks = list(client.chat.completions.create(
        model="demo", tools=[BASH], stream=True, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": "be brief"},
                  {"role": "user", "content": "say: hello there, this is a long-ish line\nrun: pwd"}]))
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) > 1  # streamed in pieces
    assert "".join(texts) == "[demo] hello there, this is a long-ish line"
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.function.name, json.loads(tc.function.arguments)) for tc in calls] == [
        ("bash", {"command": "pwd"})]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_tool_results_get_a_summary_and_no_more_calls(serve):
    client = openai_client(serve())
    done = client.chat.completions.create(model="demo", tools=[BASH], messages=[
        {"role": "user", "content": "run: echo hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "bash", "arguments": '{"command": "echo hi"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "hi\n"}])
    message = done.choices[0].message
    assert done.choices[0].finish_reason == "stop" and not message.tool_calls
    assert message.content == "[demo] Done.\n- bash done: hi"


def test_no_tool_offered_is_said_not_invented(serve):
    done = openai_client(serve()).chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "run: ls"}])
    assert not done.choices[0].message.tool_calls
    assert "no tool offered for: bash" in done.choices[0].message.content


def test_a_bad_request_is_a_400_in_openais_shape(serve):
    client = openai_client(serve())
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="demo", messages=[{"role": "wizard", "content": "x"}])
    assert "messages[0].role" in caught.value.message
    # the listener still serves
    assert client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "say: ok"}]).choices[0].message.content \
        == "[demo] ok"


def test_an_unknown_endpoint_is_a_404(serve):
    with pytest.raises(openai.NotFoundError):
        openai_client(serve()).embeddings.create(model="demo", input="x")


def test_demo_call_ids_are_never_reused(serve):
    """A sandbox restored to an earlier checkpoint asks the same again: its
    calls must not get ids its lost calls had (an id is an idempotency key)."""
    client = openai_client(serve())
    ids = [client.chat.completions.create(
        model="demo", tools=[BASH], messages=[{"role": "user", "content": "run: ls"}]
    ).choices[0].message.tool_calls[0].id for _ in range(2)]
    assert ids[0] != ids[1] and all(i.startswith("call_demo_") for i in ids)

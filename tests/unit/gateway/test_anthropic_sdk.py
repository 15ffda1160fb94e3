"""The real anthropic SDK against the gateway's demo upstream."""

from __future__ import annotations

import anthropic
import pytest

from .conftest import anthropic_client

BASH = {"name": "Bash", "description": "run a shell command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}
WRITE = {"name": "Write", "description": "write a file",
         "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"},
                                                           "content": {"type": "string"}}}}


def test_tool_use_in_the_callers_schema_with_usage(serve):
    done = anthropic_client(serve()).messages.create(
        model="claude-whatever", max_tokens=1024, tools=[BASH, WRITE], system="be brief",
        messages=[{"role": "user", "content": "run: make test\nwrite a.txt: one\\ntwo"}])
    assert done.stop_reason == "tool_use"
    uses = [(b.name, b.input) for b in done.content if b.type == "tool_use"]
    assert uses == [("Bash", {"command": "make test"}),
                    ("Write", {"file_path": "a.txt", "content": "one\ntwo"})]
    assert done.content[0].type == "text" and done.content[0].text.startswith("[demo]")
    assert done.usage.input_tokens > 0 and done.usage.output_tokens > 0


def test_the_stream_carries_text_in_chunks_and_tool_use(serve):
    client = anthropic_client(serve())
    with client.messages.stream(
            model="demo", max_tokens=512, tools=[BASH],
            messages=[{"role": "user", "content": "say: a reply long enough for chunks\nrun: id"}]
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == "[demo] a reply long enough for chunks"
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        ("Bash", {"command": "id"})]
    assert final.stop_reason == "tool_use" and final.usage.output_tokens > 0


def test_tool_results_in_a_user_turn_get_a_summary(serve):
    done = anthropic_client(serve()).messages.create(
        model="demo", max_tokens=256, tools=[BASH], messages=[
            {"role": "user", "content": "run: false"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "false"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "boom",
                 "is_error": True}]}])
    assert done.stop_reason == "end_turn"
    assert [b.text for b in done.content] == ["[demo] Done.\n- Bash failed: boom"]


def test_models_in_anthropics_shape(serve):
    assert [m.id for m in anthropic_client(serve()).models.list()] == ["demo"]


def test_a_bad_request_is_a_400_in_anthropics_shape(serve):
    client = anthropic_client(serve())
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="demo", max_tokens=0,
                               messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in caught.value.body["error"]["message"]

"""The OpenAI-compatible and Anthropic providers against a fake server on
127.0.0.1 that speaks their streaming wire formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .fake_models import SSE, Hang, Raw, anthropic_events, openai_events
from .harness import types

CANARY = "sk-canary-3f9c1e77d2b04a51"


def openai_bridge(make_bridge, server, **provider):
    return make_bridge(
        config={"model": "openai:fake-gpt",
                "provider": {"base_url_env": "MY_BASE", "api_key_env": "MY_KEY", **provider}},
        env={"MY_BASE": server.url + "/v1", "MY_KEY": CANARY})


def anthropic_bridge(make_bridge, server):
    return make_bridge(config={"model": "anthropic:fake-claude"},
                       env={"ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": CANARY})


def test_openai_streams_a_reply_and_a_tool_call(make_bridge, model_server):
    model_server.script = [
        SSE(openai_events(["Let me ", "write it."], [
            ("call_abc", "write", ['{"path": "out', '.txt", "content"', ': "from the model"}'])])),
        SSE(openai_events(["All ", "done."])),
    ]
    bridge = openai_bridge(make_bridge, model_server)
    events = bridge.client.run_turn("please write out.txt")

    assert types(events)[-5:] == ["message.assistant", "tool.dispatched", "tool.result",
                                  "message.assistant", "turn.finished"]
    by_type = {e["type"]: e["data"] for e in events}
    assert by_type["tool.dispatched"] == {"turn": 1, "tool_call_id": "call_abc", "name": "write",
                                          "input": {"path": "out.txt", "content": "from the model"}}
    assert by_type["turn.finished"]["text"] == "All done."
    assert Path(bridge.home, "out.txt").read_text() == "from the model"

    first, second = model_server.requests
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["authorization"] == f"Bearer {CANARY}"
    assert first["body"]["stream"] is True and first["body"]["model"] == "fake-gpt"
    assert {t["function"]["name"] for t in first["body"]["tools"]} >= {"bash", "write", "edit"}
    roles = [m["role"] for m in second["body"]["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    assert second["body"]["messages"][2]["tool_calls"][0]["id"] == "call_abc"
    assert second["body"]["messages"][3] == {"role": "tool", "tool_call_id": "call_abc",
                                             "content": "wrote 14 bytes to out.txt"}


def test_anthropic_streams_a_reply_and_a_tool_use(make_bridge, model_server):
    model_server.script = [
        SSE(anthropic_events(["Running ", "it."], [
            ("toolu_01", "bash", ['{"comm', 'and": "echo hi"}'])])),
        SSE(anthropic_events(["Said hi."])),
    ]
    bridge = anthropic_bridge(make_bridge, model_server)
    events = bridge.client.run_turn("say hi with bash")

    by_type = {e["type"]: e["data"] for e in events}
    assert by_type["tool.dispatched"]["input"] == {"command": "echo hi"}
    assert by_type["tool.result"]["output"] == "hi\n"
    assert by_type["turn.finished"]["text"] == "Said hi."

    first, second = model_server.requests
    assert first["path"] == "/v1/messages"
    assert first["headers"]["x-api-key"] == CANARY
    assert first["headers"]["anthropic-version"] == "2023-06-01"
    assert first["body"]["stream"] is True and first["body"]["system"]
    assert second["body"]["messages"][1]["content"][1] == {
        "type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"command": "echo hi"}}
    assert second["body"]["messages"][2]["content"] == [{
        "type": "tool_result", "tool_use_id": "toolu_01", "content": "hi\n", "is_error": False}]


def test_long_replies_stream_coalesced_deltas(make_bridge, model_server):
    words = [f"word{i:03d} " for i in range(200)]
    model_server.script = [SSE(openai_events(words))]
    events = openai_bridge(make_bridge, model_server).client.run_turn("talk a lot")
    deltas = [e["data"]["text"] for e in events if e["type"] == "message.delta"]
    final = next(e["data"]["text"] for e in events if e["type"] == "message.assistant")
    assert deltas and len(deltas) < len(words)  # coalesced, not one event per chunk
    assert final == "".join(words) and final.startswith("".join(deltas))


BAD_ANSWERS = {
    "garbage": lambda: SSE(["this is not json"]),
    "closed_mid_stream": lambda: SSE(openai_events(["Hello ", "wor", "ld"]), cut_after=2),
    "http_500": lambda: Raw(500, json.dumps({"error": f"boom, your key {CANARY}"}).encode()),
    "html": lambda: Raw(200, b"<html>proxy login</html>", "text/html"),
    "timeout": lambda: Hang(3),
}


@pytest.mark.parametrize("answer", sorted(BAD_ANSWERS))
def test_a_broken_model_server_is_a_model_error_and_the_bridge_stays_usable(
        make_bridge, model_server, answer):
    model_server.script = [BAD_ANSWERS[answer](), SSE(openai_events(["Back."]))]
    bridge = openai_bridge(make_bridge, model_server, timeout=1)
    events = bridge.client.run_turn("hello")

    assert types(events)[-2:] == ["model.error", "turn.interrupted"]
    assert events[-1]["data"]["reason"] == "model_error"
    assert events[-2]["data"]["message"]
    assert CANARY not in json.dumps(events)
    if answer == "html":
        assert "instead of an event stream" in events[-2]["data"]["message"]
    if answer == "closed_mid_stream":
        assert events[-1]["data"]["text"] == "Hello "  # the text that survived

    nxt = bridge.client.run_turn("again", after=events[-1]["bseq"])
    assert nxt[-1]["type"] == "turn.finished" and nxt[-1]["data"]["text"] == "Back."


def test_the_api_key_never_leaks(make_bridge, model_server):
    model_server.script = [
        SSE(openai_events([], [("call_env", "bash", ['{"command": "env; echo key=$MY_KEY"}'])])),
        SSE(openai_events(["ok"])),
        Raw(401, json.dumps({"error": {"message": f"bad key {CANARY}"}}).encode()),
    ]
    bridge = openai_bridge(make_bridge, model_server)
    events = bridge.client.run_turn("show me your environment")
    events += bridge.client.run_turn("again", after=events[-1]["bseq"])

    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert "ALINEO_TOOL_CALL_ID=call_env" in result["output"]
    assert "key=\n" in result["output"]  # the model's key is not in the tools' environment
    assert "HTTP 401" in next(e["data"]["message"] for e in events if e["type"] == "model.error")
    bridge.stop()
    assert CANARY not in json.dumps(events)
    assert CANARY not in bridge.session_file.read_text()
    assert CANARY not in bridge.log_text()

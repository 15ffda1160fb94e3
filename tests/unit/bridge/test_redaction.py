"""The bridge writes no bound value (sandboxes/bridge/redact.py): not in its
events, not in its session file — which a turn checkpoint carries into forks
and backups — not in its log; a value streamed across delta chunks is never
written in two pieces."""

from __future__ import annotations

from pathlib import Path

from .fake_models import SSE, openai_events
from .test_providers import CANARY, openai_bridge

TOKEN = "ghp_" + "z" * 36


def _no_piece_of(value: str, text: str, at_least: int = 8) -> bool:
    return not any(value[i:i + at_least] in text for i in range(len(value) - at_least + 1))


def test_a_bound_value_a_tool_printed_is_in_no_file_the_bridge_writes(make_bridge):
    bridge = make_bridge(config={"model": "demo", "redact": [{"name": "github", "env": "GH_TOKEN"}]},
                         env={"GH_TOKEN": TOKEN})
    events = bridge.client.run_turn("run: echo token=$GH_TOKEN")
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert result["output"] == "token=[redacted:github]\n"
    files = [bridge.session_file, Path(bridge.run_dir, "bridge.log")]
    for path in files:
        assert TOKEN not in path.read_text(), path
    assert "[redacted:github]" in bridge.session_file.read_text()


def test_the_models_key_is_redacted_too(make_bridge, model_server):
    model_server.script = [SSE(openai_events([f"I was told {CANARY}."]))]
    bridge = openai_bridge(make_bridge, model_server)
    events = bridge.client.run_turn("hello")
    assert CANARY not in repr(events) and CANARY not in bridge.session_file.read_text()


def test_a_value_streamed_across_delta_chunks_is_never_in_pieces(make_bridge, model_server):
    head = "x" * 395
    chunks = [head + TOKEN[:10], TOKEN[10:25], TOKEN[25:] + " is the token", " " + "y" * 500]
    model_server.script = [SSE(openai_events(chunks))]
    bridge = make_bridge(
        config={"model": "openai:fake-gpt", "redact": [{"name": "github", "env": "GH_TOKEN"}],
                "provider": {"base_url_env": "MY_BASE", "api_key_env": "MY_KEY"}},
        env={"MY_BASE": model_server.url + "/v1", "MY_KEY": CANARY, "GH_TOKEN": TOKEN})
    events = bridge.client.run_turn("stream it")
    deltas = [e["data"]["text"] for e in events if e["type"] == "message.delta"]
    assert len(deltas) >= 2  # the reply was cut into chunks
    assert all(_no_piece_of(TOKEN, d) for d in deltas), deltas
    final = next(e["data"]["text"] for e in events if e["type"] == "message.assistant")
    assert final == head + "[redacted:github] is the token " + "y" * 500
    assert _no_piece_of(TOKEN, bridge.session_file.read_text())

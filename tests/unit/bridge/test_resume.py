"""kill -9 mid-turn, restart on the same home: the turn settles exactly once,
the dangling call is closed, nothing is lost, repeated or re-sent."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .fake_models import SSE, openai_events
from .harness import types


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_kill9_mid_tool_call_then_resume(make_bridge):
    bridge = make_bridge()
    client = bridge.client
    client.ok("prompt", text="say: before the crash\nrun: echo started > started.txt; sleep 60",
              command_id="cmd-1")
    call_id = client.wait_type("tool.dispatched")[-1]["data"]["tool_call_id"]
    _wait_file(Path(bridge.home, "started.txt"))
    tool_pid = bridge.session()["current"]["process"]["pid"]
    before = client.events(0)

    bridge.kill9()
    assert _alive(tool_pid)  # a tool outlives a killed bridge ...
    bridge.start()
    events = client.wait_type("turn.interrupted")
    assert not _alive(tool_pid)  # ... until the restarted bridge kills what it left

    # Nothing acknowledged was dropped: the old events are served unchanged,
    # the new ones continue the numbering.
    assert events[: len(before)] == before
    assert [e["bseq"] for e in events] == list(range(1, len(events) + 1))
    resumed = events[len(before):]
    assert types(resumed) == ["bridge.started", "tool.result", "turn.interrupted"]
    assert resumed[0]["data"]["resumed"] is True
    assert resumed[1]["data"]["tool_call_id"] == call_id and resumed[1]["data"]["interrupted"]
    assert resumed[2]["data"] == {"turn": 1, "text": "[demo] before the crash",
                                  "reason": "bridge_restarted"}

    nxt = client.run_turn("say: after", after=events[-1]["bseq"])
    assert nxt[-1]["type"] == "turn.finished"

    # A second restart settles nothing again.
    bridge.stop()
    bridge.start()
    everything = client.events(0)
    assert types(everything).count("turn.interrupted") == 1
    assert types(everything[-1:]) == ["bridge.started"]
    tool_msgs = [m for m in bridge.session()["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == [call_id]


def test_queued_prompts_survive_a_crash(make_bridge):
    bridge = make_bridge()
    bridge.client.ok("prompt", text="sleep: 60")
    bridge.client.wait_type("tool.dispatched")
    assert bridge.client.ok("prompt", text="say: queued", command_id="q")["queued"] is True
    bridge.kill9()
    bridge.start()
    events = bridge.client.wait_type("turn.finished", turn=2)
    assert events[-1]["data"]["text"] == "[demo] queued"
    assert bridge.client.ok("prompt", text="say: queued", command_id="q")["duplicate"] is True


def test_a_completed_model_call_is_not_resent(make_bridge, model_server):
    """Step checkpoint: the model answered with a tool call, the bridge died
    while the tool ran; the resumed bridge does not ask the model again, and
    the next call carries an explicit interrupted result for the dangling call."""
    model_server.script = [
        SSE(openai_events(["Sleeping."], [("call_1", "bash", ['{"command": "sleep 60"}'])])),
        SSE(openai_events(["Fresh start."])),
    ]
    bridge = make_bridge(config={"model": "openai:fake"},
                         env={"OPENAI_BASE_URL": model_server.url, "OPENAI_API_KEY": "k-test"})
    bridge.client.ok("prompt", text="sleep please")
    bridge.client.wait_type("tool.dispatched")
    bridge.kill9()
    bridge.start()
    events = bridge.client.wait_type("turn.interrupted")
    assert events[-1]["data"]["text"] == "Sleeping."
    assert len(model_server.requests) == 1

    nxt = bridge.client.run_turn("go on", after=events[-1]["bseq"])
    assert nxt[-1]["data"]["text"] == "Fresh start."
    assert len(model_server.requests) == 2
    messages = model_server.requests[1]["body"]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "user"]
    assert messages[3]["tool_call_id"] == "call_1" and "interrupted" in messages[3]["content"]


def test_partial_streamed_text_survives_a_crash(make_bridge, model_server):
    """message.delta is committed as it streams: a crash mid-reply keeps it."""
    from .fake_models import Hang

    class SlowTail(SSE):
        def send(self, handler):
            super().send(handler)
            Hang(60).send(handler)  # the reply never completes

    words = [f"word{i:03d} " for i in range(120)]
    model_server.script = [SlowTail(openai_events(words)[:-2])]
    bridge = make_bridge(config={"model": "openai:fake", "provider": {"timeout": 90}},
                         env={"OPENAI_BASE_URL": model_server.url})
    bridge.client.ok("prompt", text="talk")
    deltas = bridge.client.wait_type("message.delta")
    bridge.kill9()
    bridge.start()
    settled = bridge.client.wait_type("turn.interrupted")[-1]["data"]
    streamed = "".join(e["data"]["text"] for e in deltas if e["type"] == "message.delta")
    assert settled["text"].startswith(streamed) and streamed.startswith("word000")
    assert "".join(words).startswith(settled["text"])


def test_seeding_a_fresh_bridge_with_a_conversation(make_bridge, dirs):
    """The "rebuild" rung: a new sandbox's bridge starts from the transcript's conversation."""
    seed = {"messages": [
        {"role": "user", "text": "run: make"},
        {"role": "assistant", "text": "[demo] Running 1 tool call.",
         "tool_calls": [{"id": "old-1", "name": "bash", "input": {"command": "make"}}]},
    ]}
    seed_file = Path(dirs[0], "seed.json")
    seed_file.write_text(json.dumps(seed))
    bridge = make_bridge(extra=("--seed", str(seed_file)))
    events = bridge.client.events(0)
    assert types(events) == ["bridge.started", "tool.result", "session.seeded"]
    assert events[0]["data"]["session_start_source"] == "resume"
    assert events[1]["data"]["interrupted"] is True
    assert bridge.client.ok("status")["turns"] == 1

    nxt = bridge.client.run_turn("say: rebuilt", after=events[-1]["bseq"])
    assert nxt[0]["data"]["turn"] == 2 and nxt[-1]["data"]["text"] == "[demo] rebuilt"
    assert bridge.client.call("seed", messages=[])["error"]["code"] == "not_fresh"


def test_seed_op_on_a_fresh_bridge(make_bridge):
    client = make_bridge().client
    bad = client.call("seed", messages=[{"role": "robot"}])["error"]
    assert bad["code"] == "bad_request" and "messages[0]" in bad["message"]
    assert client.ok("seed", messages=[{"role": "user", "text": "hi"},
                                       {"role": "assistant", "text": "hello"}])["turns"] == 1


def _wait_file(path: Path) -> None:
    import time
    deadline = time.monotonic() + 20
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_sigterm_settles_the_running_turn_once(make_bridge):
    bridge = make_bridge()
    bridge.client.ok("prompt", text="sleep: 60")
    bridge.client.wait_type("tool.dispatched")
    bridge.proc.terminate()
    assert bridge.proc.wait(timeout=20) == 0
    bridge.start()
    events = bridge.client.events(0)
    assert types(events).count("turn.interrupted") == 1
    settled = next(e["data"] for e in events if e["type"] == "turn.interrupted")
    assert settled["reason"] == "shutdown"
    assert types(events)[-1] == "bridge.started"

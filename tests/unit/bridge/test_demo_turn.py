"""A demo turn end to end: directives → tool calls → results → final answer."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from .harness import SANDBOXES, Bridge, types


def test_write_and_run_gives_the_full_event_sequence(make_bridge):
    bridge = make_bridge()
    events = bridge.client.run_turn("write notes/a.txt: hello\nrun: cat notes/a.txt",
                                    command_id="cmd-1")

    assert types(events) == [
        "bridge.started", "turn.started", "message.user", "message.assistant",
        "tool.dispatched", "tool.dispatched", "tool.result", "tool.result",
        "message.assistant", "turn.finished",
    ]
    assert [e["bseq"] for e in events] == list(range(1, 11))
    assert events[1]["data"] == {"turn": 1, "command_id": "cmd-1"}
    dispatched = [e["data"] for e in events if e["type"] == "tool.dispatched"]
    results = [e["data"] for e in events if e["type"] == "tool.result"]
    assert [d["tool_call_id"] for d in dispatched] == [r["tool_call_id"] for r in results]
    assert [d["name"] for d in dispatched] == ["write", "bash"]
    assert results[1]["output"] == "hello" and results[1]["exit_code"] == 0
    assert Path(bridge.home, "notes/a.txt").read_text() == "hello"
    assert "[demo]" in events[-1]["data"]["text"]


def test_plain_prompt_gets_a_labelled_short_reply(make_bridge):
    events = make_bridge().client.run_turn("hello there")
    assert types(events)[-2:] == ["message.assistant", "turn.finished"]
    assert events[-1]["data"]["text"].startswith("[demo]")


def test_bash_sees_its_tool_call_id(make_bridge):
    events = make_bridge().client.run_turn("run: echo id=$ALINEO_TOOL_CALL_ID")
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert result["output"].strip() == f"id={result['tool_call_id']}"


def test_failing_command_reports_its_exit_code(make_bridge):
    events = make_bridge().client.run_turn("run: echo oops >&2; exit 3")
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert (result["exit_code"], result["is_error"], result["output"], result["stderr"]) == (
        3, True, "", "oops\n")  # stderr apart from stdout
    assert "exited 3" in events[-1]["data"]["text"]


def test_prompts_queue_fifo_and_command_ids_deduplicate(make_bridge):
    client = make_bridge().client
    first = client.ok("prompt", text="sleep: 1", command_id="a")
    second = client.ok("prompt", text="say: second", command_id="b")
    again = client.ok("prompt", text="say: second", command_id="b")
    assert (first["turn"], second["turn"], second["queued"]) == (1, 2, True)
    assert again["turn"] == 2 and again["duplicate"] is True
    events = client.wait_type("turn.finished", turn=2)
    started = [e["data"]["turn"] for e in events if e["type"] == "turn.started"]
    assert started == [1, 2]
    assert client.ok("status")["turns"] == 2


def test_bad_requests_get_error_codes(make_bridge):
    client = make_bridge().client
    assert client.call("nope")["error"]["code"] == "unknown_op"
    assert client.call("prompt", text="")["error"]["code"] == "bad_request"
    assert client.call("steer", text="x")["error"]["code"] == "no_turn"
    assert client.call("events", after=-1)["error"]["code"] == "bad_request"
    assert client.call("reply", request_id="req-x", result=1)["error"]["code"] == "unknown_request"


def test_runs_from_a_copied_directory_as_a_file(dirs, tmp_path):
    """The control plane copies the package anywhere and runs its __main__.py."""
    copy = tmp_path / "somewhere" / "bridge"
    shutil.copytree(SANDBOXES / "bridge", copy, ignore=shutil.ignore_patterns("__pycache__"))
    bridge = Bridge(*dirs)
    bridge.argv = lambda *extra: [sys.executable, "-S", str(copy / "__main__.py"),
                                  "--run-dir", bridge.run_dir, "--home", bridge.home, *extra]
    bridge.start()
    try:
        events = bridge.client.run_turn("say: copied")
        assert events[-1]["data"]["text"] == "[demo] copied"
    finally:
        bridge.stop()


def test_a_second_bridge_on_the_same_home_is_refused(make_bridge):
    bridge = make_bridge()
    second = subprocess.run(bridge.argv(), cwd=SANDBOXES, capture_output=True, timeout=20,
                            env={"PATH": "/usr/bin:/bin", "HOME": bridge.home})
    assert second.returncode == 3
    assert "refusing to run the session twice" in second.stderr.decode()
    assert bridge.client.ok("status")["state"] == "idle"


def test_think_holds_the_model_call_until_an_abort_ends_it(make_bridge):
    """`think: N`: the model call itself is in flight for N s (the fault tests
    place kills there); an abort ends it at once and nothing it planned runs."""
    bridge = make_bridge()
    client = bridge.client
    client.ok("prompt", text="think: 300\nwrite planned.txt: never")
    client.wait_type("turn.started")
    assert client.ok("status")["state"] == "running"
    assert client.ok("abort")["aborted"] is True  # still in the model call after 300 s? no:
    events = client.wait_type("turn.interrupted")  # ended by the abort, not by the clock
    assert "tool.dispatched" not in types(events) and "message.assistant" not in types(events)
    assert not Path(bridge.home, "planned.txt").exists()
    nxt = client.run_turn("think: 0.1\nsay: thought", after=events[-1]["bseq"])
    assert nxt[-1]["type"] == "turn.finished" and nxt[-1]["data"]["text"] == "[demo] thought"


def test_think_directives_add_up_and_are_bounded():
    from sandboxes.bridge import directives

    assert directives.plan("think: 2.5\nthink: 1\nsay: x").think_s == 3.5
    assert directives.plan("think: 99999").think_s == directives.MAX_THINK_S
    plain = directives.plan("think: a while")  # not a number: plain text, no think
    assert plain.think_s == 0 and plain.reply == directives.NO_DIRECTIVE


def test_memory_directives_become_the_memory_tools_calls():
    from sandboxes.bridge import directives

    calls = directives.plan("memory: set plan ship it on friday\nmemory: get plan\nmemory: list").calls
    assert [(c.name, c.input) for c in calls] == [
        ("memory", {"op": "set", "key": "plan", "value": "ship it on friday"}),
        ("memory", {"op": "get", "key": "plan"}),
        ("memory", {"op": "list"}),
    ]
    # A malformed op still reaches the tool, which refuses it as it would a model's.
    assert directives.plan("memory: forget plan").calls[0].input == {"op": "forget"}

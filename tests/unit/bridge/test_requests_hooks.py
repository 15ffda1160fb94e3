"""spawn and memory ask the control plane; spec hooks run and are journaled."""

from __future__ import annotations

import json

from .harness import types


def test_spawn_waits_for_the_control_planes_reply(make_bridge):
    client = make_bridge().client
    client.ok("prompt", text="spawn: write the tests")
    request = client.wait_type("request.spawn")[-1]["data"]
    assert request["prompt"] == "write the tests"
    assert request["request_id"] == f"req-{request['tool_call_id']}"
    assert client.ok("status")["pending_requests"] == [request["request_id"]]

    client.ok("reply", request_id=request["request_id"], result={"agent_id": "child-7"})
    events = client.wait_type("turn.finished")
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert json.loads(result["output"]) == {"agent_id": "child-7"} and result["exit_code"] == 0
    assert client.call("reply", request_id=request["request_id"], result=1)["error"]["code"] == \
        "unknown_request"


def test_spawn_with_a_json_object_asks_for_a_child_spec(make_bridge):
    """The demo can ask what a real model may (tests/security/test_escalation.py)."""
    client = make_bridge().client
    spec = {"credentials": [{"name": "tok", "env": "TOK"}], "network": "host"}
    client.ok("prompt", text="spawn: " + json.dumps({"prompt": "say: hi", "spec": spec,
                                                     "extra": 1}) + "\nspawn: {not json")
    first = client.wait_type("request.spawn")[-1]["data"]
    assert (first["prompt"], first["spec"]) == ("say: hi", spec) and "extra" not in first
    client.ok("reply", request_id=first["request_id"], result={"agent_id": "child-1"})
    second = client.wait_type("request.spawn", prompt="{not json")[-1]["data"]
    assert "spec" not in second  # not a JSON object: the text is the child's prompt


def test_an_error_reply_is_a_tool_error(make_bridge):
    client = make_bridge().client
    client.ok("prompt", text="spawn: too many")
    request = client.wait_type("request.spawn")[-1]["data"]
    client.ok("reply", request_id=request["request_id"],
              error={"code": "limit", "message": "tree full"})
    events = client.wait_type("turn.finished")
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert result["is_error"] and "tree full" in result["output"]


def test_an_unanswered_request_times_out_as_a_tool_error(make_bridge):
    client = make_bridge(config={"model": "demo", "limits": {"request_timeout": 0.5}}).client
    events = client.run_turn("spawn: nobody answers")
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert result["is_error"] and "no reply" in result["output"]
    assert events[-1]["type"] == "turn.finished"


def test_abort_while_waiting_for_a_reply(make_bridge):
    client = make_bridge().client
    client.ok("prompt", text="spawn: slow")
    client.wait_type("request.spawn")
    client.ok("abort")
    events = client.wait_type("turn.interrupted")
    assert [e["data"].get("interrupted") for e in events if e["type"] == "tool.result"] == [True]
    assert client.run_turn("say: fine", after=events[-1]["bseq"])[-1]["type"] == "turn.finished"


def test_hooks_run_and_their_verdicts_are_journaled(make_bridge):
    hooks = {
        "session_start": "echo start=$ALINEO_SESSION_START_SOURCE",
        "pre_tool_use": 'case "$ALINEO_TOOL_INPUT" in *forbidden*) echo no; exit 2;; esac',
        "stop": "echo stop=$ALINEO_TURN",
    }
    client = make_bridge(config={"model": "demo", "hooks": hooks}).client
    events = client.run_turn("run: echo allowed\nrun: echo forbidden")
    verdicts = [(e["data"]["hook"], e["data"]["verdict"])
                for e in events if e["type"] == "hook.verdict"]
    assert verdicts == [("session_start", "ok"), ("pre_tool_use", "allow"),
                        ("pre_tool_use", "deny")]
    assert events[0]["type"] == "bridge.started"
    start = next(e["data"] for e in events if e["type"] == "hook.verdict")
    assert start["output"].strip() == "start=startup" and start["source"] == "startup"
    results = [e["data"] for e in events if e["type"] == "tool.result"]
    assert results[0]["output"] == "allowed\n"
    assert results[1]["is_error"] and "denied by the pre_tool_use hook" in results[1]["output"]
    stop = client.wait_type("hook.verdict", after=events[-1]["bseq"])[-1]["data"]
    assert (stop["hook"], stop["output"].strip()) == ("stop", "stop=1")
    assert "turn.finished" in types(events)

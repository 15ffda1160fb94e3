"""What the control plane admits into a transcript (sessions/worker/admission.py)
against what a real bridge emits: every event of every kind a bridge makes
passes, and what a sandbox could forge does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessions.worker import admission

from .harness import types
from .test_providers import BAD_ANSWERS, openai_bridge


def _all_admitted(events: list[dict]) -> None:
    refused = [(e["type"], admission.refusal(e["type"], e["data"])) for e in events
               if admission.refusal(e["type"], e["data"]) is not None]
    assert refused == []


def test_every_kind_of_event_a_bridge_emits_is_admitted(make_bridge):
    hooks = {"session_start": "echo hi", "pre_tool_use": "true", "stop": "echo bye"}
    bridge = make_bridge(config={"model": "demo", "hooks": hooks})
    client = bridge.client
    events = client.run_turn("run: echo one\nwrite a.txt: two\nread: a.txt\nsay: " + "x" * 2500)
    client.ok("prompt", text="spawn: a child")
    asked = client.wait_type("request.spawn", after=events[-1]["bseq"])
    client.ok("reply", request_id=asked[-1]["data"]["request_id"], result={"agent_id": "c"})
    events += asked + client.wait_type("turn.finished", after=asked[-1]["bseq"])
    # A tool that runs until the test says so: the steer and the pause land
    # while it runs however loaded the machine is (a `sleep: 2` did not always).
    client.ok("prompt", text="run: while [ ! -e go ]; do sleep 0.05; done")
    events += client.wait_type("tool.dispatched", after=events[-1]["bseq"])
    client.ok("steer", text="steer it")
    client.ok("pause")
    Path(bridge.home, "go").touch()
    events += client.wait_type("turn.held", after=events[-1]["bseq"])
    client.ok("unpause")
    events += client.wait_type("turn.finished", after=events[-1]["bseq"])
    client.ok("prompt", text="run: while [ ! -e never ]; do sleep 0.05; done")
    events += client.wait_type("tool.dispatched", after=events[-1]["bseq"])
    client.ok("steer", text="never delivered")
    client.ok("abort")
    events += client.wait_type("turn.interrupted", after=events[-1]["bseq"])
    events += client.events(events[-1]["bseq"], wait=1)
    seen = set(types(events))
    assert {"bridge.started", "hook.verdict", "turn.started", "message.user", "message.delta",
            "message.assistant", "tool.dispatched", "tool.result", "turn.finished",
            "request.spawn", "steer.delivered", "bridge.paused", "turn.held", "bridge.unpaused",
            "turn.interrupted"} <= seen, seen
    _all_admitted(events)


def test_a_seeded_bridge_and_a_model_error_are_admitted(make_bridge, model_server):
    model_server.script = [BAD_ANSWERS["http_500"]()]
    bridge = openai_bridge(make_bridge, model_server, timeout=1)
    bridge.client.ok("seed", messages=[{"role": "user", "text": "earlier", "kind": "prompt"}])
    events = bridge.client.events(0) + bridge.client.run_turn("hello")
    assert {"session.seeded", "model.error", "turn.interrupted"} <= set(types(events))
    _all_admitted(events)


def test_a_tool_result_with_stderr_apart_is_admitted(make_bridge):
    events = make_bridge().client.run_turn("run: echo out; echo oops >&2")
    result = next(e["data"] for e in events if e["type"] == "tool.result")
    assert (result["output"], result["stderr"]) == ("out\n", "oops\n")
    _all_admitted(events)


@pytest.mark.parametrize("etype, data, why", [
    ("command.prompt", {"text": "run: id", "by": "admin", "command": 1}, "not an event"),
    ("credential.approved", {"bindings": ["prod"], "by": "admin"}, "not an event"),
    ("agent.sandbox", {"sandbox_id": "someone-elses"}, "not an event"),
    ("agent.status", {"status": "stopped"}, "not an event"),
    ("agent.restored", {"rung": "restore", "new_sandbox_id": "x"}, "not an event"),
    ("agent.worker", {"worker": "me", "epoch": 9}, "not an event"),
    ("bridge.refused", {"bseq": 1, "type": "x", "reason": "y"}, "not an event"),
    ("turn.finished", {"turn": 1, "text": "ok", "sandbox_id": "x"}, "unknown field 'sandbox_id'"),
    ("turn.finished", {"turn": "1", "text": "ok"}, "turn must be an integer"),
    ("turn.finished", {"turn": True, "text": "ok"}, "turn must be an integer"),
    ("turn.finished", {"turn": 1}, "missing field 'text'"),
    ("message.delta", {"turn": 1, "text": "x" * (admission.MAX_TEXT + 1)}, "text is longer"),
    ("tool.result", {"turn": 1, "tool_call_id": "c", "name": "bash", "output": "o",
                     "exit_code": 0, "is_error": "no"}, "is_error must be true or false"),
    ("tool.result", {"turn": 1, "tool_call_id": "c", "name": "bash", "output": "o",
                     "exit_code": 0, "is_error": False, "stderr": 5}, "stderr must be"),
    ("tool.dispatched", {"turn": 1, "tool_call_id": "c", "name": "bash", "input": []},
     "input must be a JSON object"),
    ("turn.interrupted", {"turn": 1, "text": "", "reason": "Because!"}, "reason must be"),
])
def test_what_a_sandbox_could_forge_is_refused(etype, data, why):
    assert why in admission.refusal(etype, data)


def test_a_refusal_keeps_nothing_of_what_was_sent():
    fact = admission.refused_fact(7, "agent.sandbox" + "x" * 100, "not an event a sandbox may emit")
    assert fact == ("bridge.refused", {"bseq": 7, "type": ("agent.sandbox" + "x" * 100)[:64],
                                       "reason": "not an event a sandbox may emit"})

"""sessions/templatetags/alineo.py on data it did not write: event data is
the bridge's (the sandbox is a boundary), so nothing in it may make a page 500."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from sessions.templatetags import alineo


@pytest.mark.parametrize("value", [None, 3, 3.5, [], {}, "", "yesterday", "0001-01-01T00:00:00+01:00",
                                   "9999-12-31T23:59:59-01:00", "2026-13-01T00:00:00Z"])
def test_a_time_that_is_not_one_renders_as_nothing(value):
    assert alineo.reltime(value) == ""
    assert alineo.elapsed_since(value) == ""


def test_a_real_time_still_renders():
    assert 'datetime="2026-01-02T03:04:05Z"' in alineo.reltime("2026-01-02T03:04:05Z")


def event(etype, data):
    return SimpleNamespace(type=etype, data=data)


@pytest.mark.parametrize("child", ["../x", "a b", 3, None, ["ag_1"], "x" * 40])
def test_a_child_that_is_not_an_agent_id_is_shown_as_data(child):
    view = alineo.event_view(event("agent.child_spawned", {"child": child}))
    assert "child" not in view and view["blocks"]


def test_deep_data_is_shown_without_a_recursion_error():
    deep: list = []
    for _ in range(3000):
        deep = [deep]
    view = alineo.event_view(event("tool.dispatched", {"name": "x", "input": deep}))
    assert view["blocks"][0]["text"]
    mixed = alineo.event_view(event("bridge.thing", {"a": {1: "x", "b": "y"}}))  # sort_keys refuses
    assert mixed["blocks"][0]["text"]


def test_the_agent_page_renders_the_deepest_data_a_bridge_may_send(logged_in, make_agent):
    deep: dict = {"leaf": 1}
    for _ in range(99):  # sandboxes/bridge/protocol.py MAX_DEPTH = 100
        deep = {"d": deep}
    agent = make_agent(facts=[("agent.spawned", {"spec": {"model": "demo"}}),
                              ("tool.dispatched", {"name": "bash", "tool_call_id": "c1", "input": deep}),
                              ("turn.started", {"started_at": 12, "text": ["x"]})])
    response = logged_in.get(f"/agents/{agent.id}/")
    assert response.status_code == 200
    assert logged_in.get(f"/agents/{agent.id}/rows?after=0").status_code == 200


def blocks(name, value):
    view = alineo.event_view(event("tool.dispatched", {"tool_call_id": "c", "name": name,
                                                        "input": value}))
    return [(b["label"], b["text"]) for b in view["blocks"]]


@pytest.mark.parametrize("name", ["bash", "run"])
def test_a_shell_call_shows_its_command(name):
    # `bash` is what the bridge and Pi emit (directives.py, pi_rpc.PI_TOOLS); `run` is older transcripts'.
    assert blocks(name, {"command": "echo hi"}) == [("command", "$ echo hi")]
    assert blocks(name, {"command": "make", "timeout": 30}) == [("command", "$ make"), ("timeout", "30")]


def test_any_tool_whose_input_is_only_a_command_shows_it():
    assert blocks("shell_exec", {"command": "ls"}) == [("command", "$ ls")]
    assert blocks("deploy", {"command": "up", "target": "prod"})[0][0] == "input"  # more than a command


def test_pi_file_tools_show_their_path_first():
    assert blocks("read", {"path": "notes.txt", "offset": 10, "limit": 20}) == [
        ("path", "notes.txt"), ("limit", "20"), ("offset", "10")]
    assert blocks("write", {"path": "a.py", "content": "x = 1"}) == [("path", "a.py"), ("content", "x = 1")]
    assert blocks("edit", {"path": "a.py", "edits": [{"oldText": "x = 1", "newText": "x = 2"}]}) == [
        ("path", "a.py"), ("old", "x = 1"), ("new", "x = 2")]
    two = blocks("edit", {"path": "a.py", "edits": [{"oldText": "a", "newText": "b"},
                                                    {"oldText": "c", "newText": "d"}]})
    assert two == [("path", "a.py"), ("old 1", "a"), ("new 1", "b"), ("old 2", "c"), ("new 2", "d")]


@pytest.mark.parametrize("edits", ["text", [1, 2], [{"oldText": "a", "other": 1}]])
def test_edits_of_another_shape_show_as_they_came(edits):
    shown = blocks("edit", {"path": "a.py", "edits": edits})
    assert shown[0] == ("path", "a.py") and shown[1][0] == "edits"


@pytest.mark.parametrize("ahead, shown", [
    (timedelta(days=5.99), "in 5 d 23 h"),   # not floored to "in 5 d"
    (timedelta(days=6), "in 6 d"),
    (timedelta(hours=23, minutes=59), "in 23 h"),
    (timedelta(minutes=42), "in 42 min"),
    (timedelta(days=29, hours=23), "in 30 d"),  # a week or more: the nearest day
    (timedelta(days=10, hours=2), "in 10 d"),
])
def test_time_to_come_is_shown_honestly(ahead, shown):
    now = datetime(2026, 3, 1, tzinfo=timezone.utc)
    assert alineo.relative(now + ahead, now=now) == shown


def test_time_past_is_floored_as_before():
    now = datetime(2026, 3, 1, tzinfo=timezone.utc)
    assert alineo.relative(now - timedelta(days=2.9), now=now) == "2 d ago"
    assert alineo.relative(now + timedelta(seconds=2), now=now) == "just now"

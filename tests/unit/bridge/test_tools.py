"""The tools in-process: file edits, output caps, timeouts, cancellation."""

from __future__ import annotations

import threading

import pytest

from sandboxes.bridge import tools
from sandboxes.bridge.cancel import CancelToken
from sandboxes.bridge.requests import Requests


@pytest.fixture
def ctx(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "home").mkdir()
    return tools.ToolContext(home=str(tmp_path / "home"), run_dir=str(tmp_path / "run"),
                             env={"PATH": "/usr/bin:/bin"}, requests=Requests(),
                             emit=lambda *a: None, limits=tools.ToolLimits(bash_timeout=20))


def run(ctx, name, cancel=None, **args):
    return tools.run_tool(ctx, {"id": "t-1", "name": name, "input": args}, cancel or CancelToken())


def test_edit_replaces_one_exact_unique_occurrence(ctx):
    run(ctx, "write", path="f.txt", content="a b a")
    assert "not unique (2 matches)" in run(ctx, "edit", path="f.txt", old="a", new="c").output
    assert "not found" in run(ctx, "edit", path="f.txt", old="zzz", new="c").output
    assert run(ctx, "edit", path="f.txt", old="b", new="B").exit_code == 0
    assert run(ctx, "read", path="f.txt").output == "a B a"
    assert run(ctx, "read", path="missing.txt").is_error


def test_long_output_is_truncated_with_a_note(ctx):
    out = run(ctx, "bash", command="head -c 100000 /dev/zero | tr '\\0' x").output
    assert "[output truncated:" in out and len(out) < tools.MAX_OUTPUT + 200


def test_a_command_past_its_timeout_is_killed(ctx):
    outcome = run(ctx, "bash", command="sleep 30", timeout=0.3)
    assert outcome.exit_code == 124 and "timed out" in outcome.output


def test_cancel_kills_the_process_group(ctx):
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel, args=("aborted",)).start()
    outcome = run(ctx, "bash", cancel, command="sleep 30 & sleep 30; wait")
    assert outcome.interrupted and outcome.exit_code == -1


def test_bad_arguments_are_tool_errors(ctx):
    assert "must be a string" in run(ctx, "write", path="x").output
    assert "not valid JSON" in run(ctx, "bash", __invalid_json__="{oops").output
    assert run(ctx, "teleport").is_error


def test_tools_outside_the_spec_are_refused(ctx):
    ctx.enabled = frozenset({"read"})
    outcome = run(ctx, "bash", command="touch nope")
    assert outcome.is_error and "no tool named 'bash'" in outcome.output


def test_memory_asks_the_control_plane_and_returns_its_answer(ctx):
    asked = []

    def emit(type_, data):
        asked.append((type_, data))
        answer = (data["request_id"], {"value": "blue"})
        threading.Timer(0.05, ctx.requests.reply, args=answer).start()

    ctx.emit = emit
    outcome = run(ctx, "memory", op="get", key="colour")
    assert outcome.output == '{"value": "blue"}' and not outcome.is_error
    assert asked == [("request.memory", {"request_id": "req-t-1", "tool_call_id": "t-1",
                                         "op": "get", "key": "colour", "value": None})]
    assert "needs a string 'key'" in run(ctx, "memory", op="set").output

"""stderr apart from stdout in tool results (issue 15, Build 1): the bridge
journals a bash call's stderr as "stderr" beside "output"; the transcript
shows it as its own block; a model still reads both (model_output); older
transcripts, whose output was combined, render as before."""

from __future__ import annotations

import pytest

from sandboxes.bridge import conversation as conv

pytestmark = pytest.mark.django_db


def test_a_model_reads_stdout_then_stderr():
    msg = conv.tool_result({"id": "c1", "name": "bash"}, "out\n", 1, True, stderr="bad\n")
    assert conv.model_output(msg) == "out\n[stderr]\nbad\n"
    assert conv.model_output(conv.tool_result({"id": "c", "name": "bash"}, "out", 0, False)) == "out"
    assert conv.model_output({**msg, "output": "x"}) == "x\n[stderr]\nbad\n"
    call = {"role": "assistant", "text": "", "tool_calls": [{"id": "c1", "name": "bash", "input": {}}]}
    seeded = conv.validate([call, msg])  # a seed (a rebuild) keeps it
    assert seeded[1]["stderr"] == "bad\n"


def result(call_id, **data):
    return ("tool.result", {"turn": 1, "tool_call_id": call_id, "name": "bash", **data})


def test_the_transcript_shows_stderr_apart_and_old_rows_as_before(client, owner, make_agent):
    agent = make_agent(facts=[
        ("agent.spawned", {"spec": {"model": "demo"}}), ("turn.started", {"turn": 1}),
        ("tool.dispatched", {"turn": 1, "tool_call_id": "new", "name": "bash", "input": {"command": "x"}}),
        result("new", output="to stdout\n", stderr="to stderr\n", exit_code=1, is_error=True),
        ("tool.dispatched", {"turn": 1, "tool_call_id": "old", "name": "bash", "input": {"command": "y"}}),
        result("old", output="combined out\ncombined err\n", exit_code=0, is_error=False)])
    client.force_login(owner)
    html = client.get(f"/agents/{agent.id}/").content.decode()
    assert '<pre class="raw" aria-label="output">to stdout\n</pre>' in html
    assert '<pre class="raw stderr" aria-label="stderr">to stderr\n</pre>' in html
    assert '<pre class="raw" aria-label="output">combined out\ncombined err\n</pre>' in html
    assert html.count('class="raw stderr"') == 1

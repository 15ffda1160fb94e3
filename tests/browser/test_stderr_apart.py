"""stderr apart from stdout (issue 15, Build 1), in a browser: a tool call's
result shows its stdout and, marked as such, its stderr; an older result whose
output was combined shows as before."""

import pytest

from tests.browser.conftest import screenshot

pytestmark = pytest.mark.live


def call(cid, command):
    return ("tool.dispatched", {"turn": 1, "tool_call_id": cid, "name": "bash", "input": {"command": command}})


def test_a_tool_result_shows_stderr_apart(server, actor, page):
    agent = server.create_agent(actor, [
        ("agent.spawned", {"spec": {"model": "demo"}}), ("turn.started", {"turn": 1}),
        ("message.user", {"turn": 1, "text": "run: make"}),
        call("c-new", "make"),
        ("tool.result", {"turn": 1, "tool_call_id": "c-new", "name": "bash", "output": "building\n",
                         "stderr": "warning: deprecated\n", "exit_code": 0, "is_error": 0}),
        call("c-old", "make again"),
        ("tool.result", {"turn": 1, "tool_call_id": "c-old", "name": "bash",
                         "output": "building\nwarning: mixed in\n", "exit_code": 0, "is_error": 0}),
        ("turn.finished", {"turn": 1, "text": ""})])
    page.goto(f"{server.url}/agents/{agent}/")
    new = page.locator("li[data-call='c-new'] .tool-slot")
    new.locator("pre.stderr").wait_for()
    assert new.locator("pre[aria-label=output]").inner_text().strip() == "building"
    stderr = new.locator("pre.stderr")
    assert stderr.inner_text().strip() == "warning: deprecated"
    assert stderr.evaluate("p => getComputedStyle(p, '::before').content") == '"stderr"'  # labelled
    new.scroll_into_view_if_needed()
    screenshot(page, "tool-stderr")
    old = page.locator("li[data-call='c-old'] .tool-slot")
    assert "warning: mixed in" in old.locator("pre[aria-label=output]").inner_text()
    assert old.locator("pre.stderr").count() == 0

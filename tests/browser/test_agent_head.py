"""The agent page's header follows the transcript (issue 15, bug 7: "Starting ·
sandbox –" while row 15 showed, "1 step" during 12 tool calls): each batch of
rows the page appends triggers the header's refresh (alineo.js, `alineo:rows`).

The header also polls every 2 s; the test refuses every poll in the page, so
only the rows' trigger can move the header, and waits for what it shows."""

import json

import pytest

pytestmark = pytest.mark.live

# Refuse the header's own poll (any request of #agent-live not triggered by
# alineo:rows), counting them so the test can tell the poll was there to refuse.
NO_POLL = """
window.__polls = 0;
document.addEventListener("htmx:beforeRequest", function (e) {
  var elt = e.detail.elt, cfg = e.detail.requestConfig;
  if (!elt || elt.id !== "agent-live") return;
  var ev = cfg && cfg.triggeringEvent;
  if (!ev || ev.type !== "alineo:rows") { window.__polls += 1; e.preventDefault(); }
}, true);
"""


def append(server, agent_id: str, facts) -> None:
    server.django("from sessions import journal\n"
                  f"journal.append_many({agent_id!r}, [tuple(f) for f in {json.dumps(facts)}])\n")


def test_the_header_follows_the_rows_without_its_poll(server, actor, page):
    page.add_init_script(NO_POLL)
    agent = server.create_agent(actor, [("agent.spawned", {"spec": {"model": "demo"}})])
    page.goto(f"{server.url}/agents/{agent}/")
    page.locator("#transcript[data-state=live]").wait_for()
    page.wait_for_function("() => window.__polls > 0")  # the poll runs, and is refused
    head = page.locator("#agent-live")
    assert "Running" not in head.inner_text()

    calls = [["tool.dispatched", {"turn": 1, "tool_call_id": f"c{i}", "name": "bash",
                                  "input": {"command": "true"}}] for i in range(12)]
    append(server, agent, [["turn.started", {"turn": 1}],
                           ["message.user", {"turn": 1, "text": "run: true"}], *calls])
    page.locator("#row-15").wait_for(state="attached")
    head.locator(".status-running").wait_for()
    head.locator(".progress", has_text="12 tool calls").wait_for()
    assert "15 events" in head.inner_text()

"""The tree is live over SSE (issue 14, point 2): commits by another process
(status, a turn's progress, a new child) show up in the open page, with no
poll and no reload; a node the operator is using waits until they leave it."""

import json

import pytest

pytestmark = pytest.mark.live


def commit(server, code: str):
    """Run journal code in another process (manage.py shell) against the server's DB."""
    return server.django("from sessions import journal\nfrom sessions.models import Agent\n" + code)


def add_child(server, parent: str) -> str:
    return commit(server, (
        f"parent = Agent.objects.get(pk={parent!r})\n"
        "child = Agent.objects.create(workspace=parent.workspace, parent=parent, "
        "created_by=parent.created_by, spec={'model': 'demo'})\n"
        f"journal.append(child.id, 'agent.spawned', {{'parent': {parent!r}}})\n"
        "journal.append(parent.id, 'agent.child_spawned', {'child': child.id})\n"
        "result = child.id\n"))


def append(server, agent: str, etype: str, data: dict) -> None:
    commit(server, f"journal.append({agent!r}, {etype!r}, {json.dumps(data)})\nresult = 1\n")


def test_the_tree_follows_commits_without_polling(server, actor, page):
    agent = server.create_agent(actor, [("agent.spawned", {})])
    polls: list[str] = []
    page.on("request", lambda r: polls.append(r.url) if "/tree" in r.url.split("/api/")[0] else None)
    page.goto(f"{server.url}/")
    page.locator(".ws-tree[data-state=live]").wait_for()
    page.evaluate("window.__drawn_once = true")
    cursor = int(page.locator(".ws-tree").get_attribute("data-cursor"))

    # A turn starts in another process: the node turns to running, with its progress.
    append(server, agent, "turn.started", {"turn": 1})
    page.locator(f"#node-{agent}[data-status=running] .progress").wait_for()
    assert int(page.locator(".ws-tree").get_attribute("data-cursor")) > cursor

    # A child appears under its parent.
    child = add_child(server, agent)
    page.locator(f"#node-{agent} > ul > #node-{child}").wait_for()

    # While the operator types in the node's prompt form, its update waits.
    page.click(f"#prompt-open-{agent}")
    page.fill(f"#prompt-text-{agent}", "half-typed")
    append(server, agent, "turn.finished", {"turn": 1})
    page.wait_for_timeout(1_500)
    assert page.input_value(f"#prompt-text-{agent}") == "half-typed"
    assert page.locator(f"#node-{agent}").get_attribute("data-status") == "running"
    page.click(f"#prompt-open-{agent}")  # closed: the waiting update is drawn
    page.locator(f"#node-{agent}[data-status=idle]").wait_for()

    # Its forms still work: a stop through the streamed-in node's button.
    page.click(f"#stop-open-{child}")  # Stop asks first
    with page.expect_response(lambda r: r.url.endswith("/stop") or "/stop?" in r.url) as answer:
        page.click(f"#stop-{child}")
    assert answer.value.ok, answer.value.status
    assert "note-success" in answer.value.text()

    assert page.evaluate("window.__drawn_once") is True, "the page was reloaded"
    assert polls == [], f"the tree polled: {polls[:3]}"

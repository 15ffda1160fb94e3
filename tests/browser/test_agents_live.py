"""Spawn with the demo model and watch the reply stream in; spawn a child and
see the tree update; steer mid-turn. Rows are keyed by seq.

Every turn, steer and status seen here comes from the server's own worker and
a real sandbox: the test journals nothing itself, so a worker that does not
answer fails it (issue 16, hole 5)."""

import pytest

from .conftest import assert_contiguous, screenshot, seqs

pytestmark = pytest.mark.live

# A bounded wait for the worker to start a turn (a sandbox to make on a busy machine).
WORKER_MS = 60_000


def spawn_in_ui(page, server, prompt: str, parent: str | None = None) -> str:
    page.goto(f"{server.url}/agents/new" + (f"?parent={parent}" if parent else ""))
    page.select_option("#id_example", "demo")
    page.fill("#id_prompt", prompt)
    page.click("#spawn-submit")
    page.wait_for_url("**/agents/ag_*/")
    return page.url.rstrip("/").rsplit("/", 1)[1]


def test_spawn_watch_reply_and_steer(server, actor, page):
    # Bad input first: invalid JSON is explained next to the field.
    page.goto(f"{server.url}/agents/new")
    page.select_option("#id_example", "")
    page.fill("#id_spec", '{"model": "demo",}')
    page.click("#spawn-submit")
    assert "not valid JSON" in page.locator("#id_spec-error").inner_text()

    # The sleep keeps the worker's turn running long enough to steer it.
    agent = spawn_in_ui(page, server, "say: hello from the demo\nsleep: 8")
    page.locator("#transcript[data-state=live]").wait_for()
    page.locator("#rows > li[data-type='command.prompt']").wait_for(state="attached")  # a system event

    page.locator("#rows > li[data-type='turn.started']").first.wait_for(timeout=WORKER_MS)
    page.locator("#agent-live .status-running").wait_for(timeout=30_000)
    page.click(f"#steer-open-{agent}")
    page.click(f"#steer-send-{agent}")  # empty: refused next to the field
    assert "cannot be empty" in page.locator(f"#steer-err-{agent}").inner_text()
    page.fill(f"#steer-text-{agent}", "please also say goodbye")
    page.dblclick(f"#steer-send-{agent}")  # a double click acts once
    page.locator(f"#actions-{agent} .note-success").wait_for()
    steer_rows = page.locator("#rows > li[data-type='command.steer']")
    steer_rows.first.wait_for(state="attached")  # a command echo: a system event
    page.locator("#rows > li[data-type='steer.delivered']").wait_for(timeout=WORKER_MS)
    page.locator("#rows > li[data-type='turn.finished']").wait_for(timeout=90_000)
    assert "hello from the demo" in page.locator("#rows").inner_text()
    assert steer_rows.count() == 1
    assert_contiguous(seqs(page))
    page.locator("#agent-live .status-idle").wait_for()
    screenshot(page, "agent")


def test_child_appears_in_the_tree_live(server, actor, page, new_page):
    root = server.create_agent(actor, [("agent.spawned", {"spec": {"model": "demo"}})])
    page.goto(server.url + "/")
    page.locator(f"#node-{root}").wait_for()

    # Another tab spawns a child through the UI; the first tab's tree grows by itself.
    other = new_page(actor)
    # The sleep keeps the child's (worker-run) turn running long enough to be seen.
    child = spawn_in_ui(other, server, "say: I am the child\nsleep: 6", parent=root)
    page.locator(f"#node-{root} ul #node-{child}").wait_for()
    # Status changes arrive live too, labelled: the worker's turn makes it Running.
    page.locator(f"#node-{child} .status-running", has_text="Running").first.wait_for(
        timeout=WORKER_MS)
    # Pause from the tree: the button answers in place (the badge then follows
    # whatever the transcript says; a running worker may move it on).
    page.click(f"#pause-{root}")
    page.locator(f"#actions-{root} .note-success", has_text="Pause sent").wait_for()
    screenshot(page, "tree")

    # Narrow window: the tree still works.
    narrow = new_page(actor, width=420, height=800)
    narrow.goto(server.url + "/")
    narrow.locator(f"#node-{child}").wait_for()
    assert narrow.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1")

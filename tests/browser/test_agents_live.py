"""Spawn with the demo model and watch the reply stream in; spawn a child and
see the tree update; steer mid-turn. Rows are keyed by seq.

Every turn, steer and status seen here comes from the server's own worker and
a real sandbox: the test journals nothing itself, so a worker that does not
answer fails it (issue 16, hole 5)."""

import httpx
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


def test_the_agent_page_after_its_sandbox_was_lost(server, actor, page):
    """A real restore (its sandbox removed behind the control plane's back): the
    header and the side panel say what it lost, the checkpoints are listed, and
    the next turn runs on the restored home. The README's agent.png."""
    spec = {"model": "demo", "checkpoint": True, "name": "builder"}
    r = httpx.post(f"{server.url}/api/agents", headers=actor.auth, timeout=30, json={
        "spec": spec, "prompt": "write notes.txt: kept by the checkpoint\nrun: ls"})
    assert r.status_code == 201, r.text
    agent = r.json()["id"]
    try:
        page.goto(f"{server.url}/agents/{agent}/")
        checkpoints = page.locator("#side section", has=page.locator("h2", has_text="Checkpoints"))
        checkpoints.locator("tbody tr").first.wait_for(timeout=WORKER_MS)  # turn 1's
        remove_sandbox(server, agent)
        r = httpx.post(f"{server.url}/api/agents/{agent}/prompt", headers=actor.auth, timeout=30,
                       json={"text": "read: notes.txt"})
        assert r.status_code == 202, r.text
        lost = "Restored from the checkpoint of turn 1 — later file changes lost"
        page.locator("#side", has_text=lost).wait_for(timeout=WORKER_MS)
        page.locator("#head-restore", has_text=lost.lower()[:40]).wait_for()
        # Turn 2 reads the file turn 1 wrote: the home came back from the checkpoint.
        read = page.locator("#rows > li[data-type='tool.dispatched'][data-turn='2'] .tool-result")
        read.wait_for(timeout=WORKER_MS)
        assert read.locator("pre[aria-label=output]").inner_text().strip() == "kept by the checkpoint"
        checkpoints.locator("tbody tr").nth(1).wait_for(timeout=WORKER_MS)  # turn 2's too
        page.locator("#agent-live .status-idle").wait_for()
        page.evaluate("window.scrollTo(0, 0)")
        screenshot(page, "agent")
    finally:
        httpx.post(f"{server.url}/api/agents/{agent}/stop", headers=actor.auth, json={}, timeout=30)


def remove_sandbox(server, agent: str) -> None:
    """Remove the agent's sandbox through the server's own backend (docker rm -f,
    or the local backend's remove), behind the control plane's back."""
    server.django(
        "from sandboxes.backends import backend_for\nfrom sessions.models import Agent\n"
        f"a = Agent.objects.get(pk={agent!r})\n"
        "backend_for(a.sandbox_host).remove(a.sandbox_id)\nresult = a.sandbox_id\n")

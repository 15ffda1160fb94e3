"""Every action where the operator looks, on agents the server's own worker
runs in real sandboxes (issue 15, Build 2): fork from a checkpoint in the side
panel, with a name; approve a held credential; Interrupt clicked while a turn
runs settles it as interrupted; Pause says, and does, let the current step
finish first. The test journals nothing itself."""

import time

import httpx
import pytest

pytestmark = pytest.mark.live

# A bounded wait for the worker (a sandbox to make on a busy machine).
WORKER_MS = 90_000
HOLD = {"model": "demo", "credentials": [{"name": "deploy-token", "env": "DEPLOY", "approval": "hold"}]}


def spawn(server, actor, spec: dict, prompt: str) -> str:
    r = httpx.post(f"{server.url}/api/agents", json={"spec": spec, "prompt": prompt},
                   headers=actor.auth, timeout=30)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def spawn_held(server, actor, prompt: str) -> str:
    """An agent whose credential waits for an operator; the actor is one."""
    server.grant(actor)
    server.django(
        "from sessions.models import Workspace\nfrom sessions.credentials import set_secret\n"
        f"set_secret(Workspace.objects.get(name={actor.workspace!r}), 'deploy-token', 'not-shown')\n")
    return spawn(server, actor, HOLD, prompt)


def stop(server, actor, *agents: str) -> None:
    for agent in agents:
        httpx.post(f"{server.url}/api/agents/{agent}/stop", headers=actor.auth, json={}, timeout=30)


def row(page, etype: str):
    return page.locator(f"#rows > li[data-type='{etype}']")


def test_fork_from_a_checkpoint_with_a_name(server, actor, page):
    agent = spawn(server, actor, {"model": "demo", "checkpoint": True, "name": "writer"},
                  "write notes.txt: kept")
    fork = None
    try:
        page.goto(f"{server.url}/agents/{agent}/")
        opener = page.locator("#side [id^=fork-open-checkpoint-]").first
        opener.wait_for(timeout=WORKER_MS)  # the turn's checkpoint, in the side panel
        pk = opener.get_attribute("id").rsplit("-", 1)[1]
        opener.click()
        page.fill(f"#fork-name-checkpoint-{pk}", "from-the-checkpoint")
        page.click(f"#fork-checkpoint-{pk}")
        page.wait_for_url("**/agents/ag_*/")
        fork = page.url.rstrip("/").rsplit("/", 1)[1]
        assert fork != agent
        assert "from-the-checkpoint" in page.locator("h1").inner_text()
        origin = page.locator("#fork-origin").inner_text()
        assert f"Fork of {agent}" in origin and "from the checkpoint of turn 1" in origin
        assert f"Started as a fork of {agent}" in page.locator("#side").inner_text()
        # It starts on the checkpoint's disk: the worker makes its sandbox from it.
        row(page, "agent.forked").wait_for(state="attached", timeout=WORKER_MS)
    finally:
        stop(server, actor, agent, *([fork] if fork else []))


def test_approve_a_held_credential(server, actor, page):
    agent = spawn_held(server, actor, "say: approved and running")
    try:
        page.goto(f"{server.url}/agents/{agent}/")
        page.locator("#approval", has_text="deploy-token").wait_for(timeout=30_000)
        page.fill(f"#approve-reason-{agent}", "release day")
        page.click(f"#approve-{agent}")
        page.locator(".note", has_text="Approved").first.wait_for()
        # Who and why are journaled; the worker starts the sandbox and runs the turn.
        approved = row(page, "credential.approved")
        approved.wait_for(state="attached")
        assert f"deploy-token by {actor.username}: release day" in approved.inner_text()
        row(page, "turn.finished").wait_for(state="attached", timeout=WORKER_MS)
        assert "approved and running" in page.locator("#rows").inner_text()
        assert page.locator("#approval").count() == 0
        assert "not-shown" not in page.content()
    finally:
        stop(server, actor, agent)


def test_a_reason_typed_survives_the_header_redrawn_under_it(server, actor, page):
    """The approval form lives in the polled header: a teammate's prompt
    redraws it while the operator has typed a reason and clicked elsewhere.
    The reason stays, and is the one journaled."""
    agent = spawn_held(server, actor, "say: first")
    try:
        page.goto(f"{server.url}/agents/{agent}/")
        page.locator("#approval", has_text="deploy-token").wait_for(timeout=30_000)
        version = page.locator("#agent-live").get_attribute("data-version")
        page.fill(f"#approve-reason-{agent}", "typed before the redraw")
        page.locator("h1").click()  # no longer typing: the header may be redrawn
        r = httpx.post(f"{server.url}/api/agents/{agent}/prompt", json={"text": "say: second"},
                       headers=actor.auth, timeout=30)
        assert r.status_code == 202, r.text
        page.wait_for_selector(f"#agent-live:not([data-version='{version}'])", timeout=30_000)
        assert page.input_value(f"#approve-reason-{agent}") == "typed before the redraw"
        page.click(f"#approve-{agent}")
        approved = row(page, "credential.approved")
        approved.wait_for(state="attached", timeout=30_000)
        assert "typed before the redraw" in approved.inner_text()
    finally:
        stop(server, actor, agent)


def test_interrupt_clicked_while_a_turn_runs(server, actor, page):
    agent = spawn(server, actor, {"model": "demo"}, "sleep: 120")
    try:
        page.goto(f"{server.url}/agents/{agent}/")
        row(page, "tool.dispatched").wait_for(state="attached", timeout=WORKER_MS)
        page.locator(f"#interrupt-{agent}").wait_for()  # offered: a turn runs
        page.click(f"#interrupt-{agent}")
        page.locator(f"#actions-{agent} .note-success", has_text="Interrupt sent").wait_for()
        settled = row(page, "turn.interrupted")
        settled.wait_for(state="attached", timeout=30_000)
        assert "Turn 1 interrupted" in settled.inner_text()
        assert row(page, "turn.finished").count() == 0
        # Settled: no turn runs, so Interrupt is no longer offered.
        page.locator(f"#interrupt-{agent}").wait_for(state="detached")
        assert "Running" not in page.locator("#agent-live .badge").first.inner_text()
    finally:
        stop(server, actor, agent)


def test_pause_lets_the_current_step_finish_first(server, actor, page):
    # The sleep is the step the pause lands in (clicked as soon as it is dispatched).
    agent = spawn(server, actor, {"model": "demo"}, "sleep: 8\nsay: after the pause")
    try:
        page.goto(f"{server.url}/agents/{agent}/")
        pause = page.locator(f"#pause-{agent}")
        assert "current step finishes first" in pause.get_attribute("title")
        assert "Pause lets the current step finish first" in page.locator(f"#actions-{agent}").inner_text()
        row(page, "tool.dispatched").wait_for(state="attached", timeout=WORKER_MS)
        assert row(page, "tool.result").count() == 0  # the step is still running
        page.click(f"#pause-{agent}")
        page.locator(f"#actions-{agent} .note-success",
                     has_text="The current step finishes first").wait_for()
        # The step finishes, then the agent waits before the next one.
        result = row(page, "tool.result")
        result.wait_for(state="attached", timeout=30_000)
        assert result.locator(".meta").text_content().strip() == "exit 0"  # not cut short
        page.locator("#agent-live .status-paused").wait_for(timeout=30_000)
        assert row(page, "turn.finished").count() == 0
        page.click(f"#resume-{agent}")
        row(page, "turn.finished").wait_for(state="attached", timeout=WORKER_MS)
        assert "after the pause" in page.locator("#rows").inner_text()
    finally:
        stop(server, actor, agent)

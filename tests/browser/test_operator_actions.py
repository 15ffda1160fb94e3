"""Every action where the operator looks (issue 15, bugs 6 and 8, Build 2): an
idle agent offers no Steer or Interrupt, Stop asks first, "fork from here" makes
a named fork whose page says it is a fork and shows what it inherited; status
icons are drawn (inline SVG), not empty boxes."""

import time

import httpx
import pytest

from .conftest import screenshot

pytestmark = pytest.mark.live

TURN = [("agent.spawned", {"spec": {"model": "demo", "name": "builder"}}),
        ("turn.started", {"turn": 1}),
        ("message.user", {"turn": 1, "text": "write the parser"}),
        ("message.assistant", {"turn": 1, "text": "the parser is written"}),
        ("turn.finished", {"turn": 1, "text": "the parser is written"})]


def fork_command_state(server, actor, fork: str) -> str:
    """The fork's own command, once the worker has acted on it (GET /api/commands/{id})."""
    command = server.django("from sessions.models import Command\n"
                            f"result = Command.objects.get(agent_id={fork!r}, verb='fork').pk\n")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = httpx.get(f"{server.url}/api/commands/{command}", headers=actor.auth,
                          timeout=30).json()["state"]
        if state != "pending":
            return state
        time.sleep(0.2)
    return "pending"


def test_fork_from_here_and_stop_with_confirmation(server, actor, page):
    agent = server.create_agent(actor, TURN)
    page.goto(f"{server.url}/agents/{agent}/")
    page.locator("#transcript[data-state=live]").wait_for()
    # Idle: the same buttons as the tree, no Steer or Interrupt.
    assert page.locator(f"#steer-open-{agent}").count() == 0
    assert page.locator(f"#interrupt-{agent}").count() == 0
    icon = page.locator("#agent-live .badge svg")
    assert icon.count() == 1 and icon.bounding_box()["width"] > 0

    page.click("#fork-open-at_event-5")
    page.fill("#fork-name-at_event-5", "try-b")
    screenshot(page, "fork-from-here")
    page.click("#fork-at_event-5")
    page.wait_for_url(f"**/agents/ag_*/")
    fork = page.url.rstrip("/").rsplit("/", 1)[1]
    assert fork != agent
    assert "try-b" in page.locator("h1").inner_text()
    assert "Fork of" in page.locator("#fork-origin").inner_text()
    assert "Started as a fork of" in page.locator("#side").inner_text()
    page.click("#inherited summary")
    inherited = page.locator("#inherited").inner_text()
    assert "write the parser" in inherited and "the parser is written" in inherited
    # Bug 1: the fork's own command ends done, and no "Command failed" row is logged.
    assert fork_command_state(server, actor, fork) == "done"
    page.reload()
    page.locator("#transcript[data-state=live]").wait_for()
    page.check("#show-system")  # command echoes and failures are system events
    assert page.locator("#rows > li[data-type='command.failed']").count() == 0
    assert "Command failed" not in page.locator("#rows").inner_text()

    # Stop asks first: the button is inside a confirmation that says what stays.
    page.goto(f"{server.url}/agents/{agent}/")
    assert page.locator(f"#stop-{agent}").is_hidden()
    page.click(f"#stop-open-{agent}")
    assert "transcript and checkpoints stay" in page.locator(f"#actions-{agent} .confirm-box").inner_text()
    page.click(f"#stop-{agent}")
    page.locator(f"#actions-{agent} .note-success", has_text="Stop sent").wait_for()


@pytest.mark.parametrize("keys", ["Control+Enter", "Meta+Enter"])  # Meta: ⌘ on a Mac
def test_the_composer_under_the_transcript_sends_on_ctrl_or_cmd_enter(server, actor, page, keys):
    agent = server.create_agent(actor, TURN)
    page.goto(f"{server.url}/agents/{agent}/")
    page.locator("#transcript[data-state=live]").wait_for()
    composer = page.locator(f"#composer-prompt-text-{agent}")
    below = page.evaluate("""() => document.getElementById('composer').getBoundingClientRect().top
        >= document.getElementById('transcript').getBoundingClientRect().bottom""")
    assert below, "the composer sits under the transcript"
    composer.fill("say: sent with the keyboard")
    composer.press(keys)
    page.locator(f"#actions-{agent} .note-success", has_text="Prompt sent").wait_for()
    assert composer.input_value() == ""
    page.locator("#rows > li[data-type='command.prompt']").wait_for(state="attached")


def test_dark_mode_follows_the_system(server, actor, new_page):
    page = new_page(actor)
    page.emulate_media(color_scheme="dark")
    page.goto(server.url + "/")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert background == "rgb(20, 24, 29)", background


RECORD_NOTIFICATIONS = """
window.__notes = [];
window.Notification = function (title) { window.__notes.push(title); };
window.Notification.permission = 'granted';
window.Notification.requestPermission = function () { return Promise.resolve('granted'); };
"""


@pytest.mark.parametrize("end, data, title", [
    ("turn.finished", {"turn": 1, "text": ""}, "Turn 1 finished"),
    ("turn.interrupted", {"turn": 1, "text": "so far"}, "Turn 1 was interrupted"),
    ("agent.lost", {"reason": "sandbox_unrecoverable"}, "The agent is lost"),
])
def test_opt_in_notification_when_a_turn_ends(server, actor, page, end, data, title):
    # The browser's notification centre is not observable headless: the page's
    # Notification is recorded instead, after the operator opts in.
    page.add_init_script(RECORD_NOTIFICATIONS)
    agent = server.create_agent(actor, TURN[:3])
    page.goto(f"{server.url}/agents/{agent}/")
    page.locator("#transcript[data-state=live]").wait_for()
    page.click("#notify-toggle")
    page.locator("#notify-toggle", has_text="Notifications on").wait_for()
    seq = server.note(agent, "not an end")
    page.locator(f"#row-{seq}").wait_for(state="attached")
    assert page.evaluate("window.__notes") == []
    server.django("from sessions import journal\n"
                  f"journal.append({agent!r}, {end!r}, {data!r})\n")
    page.wait_for_function("() => window.__notes.length === 1")
    assert page.evaluate("window.__notes[0]") == f"{title} · {agent}"

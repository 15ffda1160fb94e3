"""Bug 4 of the operator's console (issue 15): honest when the server is away.
A command whose request gets no answer says it was not sent (and the old
"sent" note goes); while the server is down both pages say so, commands are
disabled, the running turn's timer stops and statuses are greyed; all of it
clears when the server is back."""

import pytest

pytestmark = pytest.mark.live

RUNNING = [("agent.spawned", {"spec": {"model": "demo"}}), ("turn.started", {"turn": 1}),
           ("message.user", {"turn": 1, "text": "sleep: 60"})]


def test_a_command_that_got_no_answer_says_not_sent(server, actor, page):
    agent = server.create_agent(actor, RUNNING)
    page.goto(f"{server.url}/agents/{agent}/")
    page.locator("#transcript[data-state=live]").wait_for()
    page.click(f"#pause-{agent}")
    page.locator(f"#actions-{agent} .note-success", has_text="Pause sent").wait_for()
    # The next request never reaches the server (as when it is down).
    page.route(f"**/agents/{agent}/resume", lambda route: route.abort("connectionrefused"))
    page.route(f"**/agents/{agent}/pause", lambda route: route.abort("connectionrefused"))
    page.locator(f"#resume-{agent}, #pause-{agent}").first.click()  # whichever the status offers
    page.locator(f"#actions-{agent} .note-error", has_text="Not sent").wait_for()
    assert page.locator(f"#actions-{agent} .note-success").count() == 0



def test_a_command_redrawn_while_in_flight_still_says_not_sent(server, actor, page):
    """The race behind an intermittent failure: the page's 2 s poll redrew the
    buttons out of band while a command was in flight, so the answer (here: no
    answer at all) went to a form no longer in the page, and nothing was said.
    The request is held until the poll has had its chance to redraw."""
    agent = server.create_agent(actor, RUNNING)
    page.goto(f"{server.url}/agents/{agent}/")
    page.locator("#transcript[data-state=live]").wait_for()
    held = []
    page.route(f"**/agents/{agent}/pause", lambda route: held.append(route))
    page.click(f"#pause-{agent}")
    for _ in range(300):  # the request reaches the route (bounded: 15 s)
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the Pause request never left the page"
    seq = server.note(agent, "a fact from elsewhere: the page's poll redraws")
    page.locator("#agent-live", has_text=f"{seq} events").wait_for()  # the poll answered
    held[0].abort("connectionrefused")
    page.locator(f"#actions-{agent} .note-error", has_text="Not sent").wait_for()
    assert page.locator(f"#actions-{agent} .note-success").count() == 0


def test_both_pages_say_the_server_is_away_and_recover(server, actor, page, new_page):
    agent = server.create_agent(actor, RUNNING)
    page.goto(f"{server.url}/agents/{agent}/")
    page.locator("#transcript[data-state=live]").wait_for()
    tree = new_page(actor)
    tree.goto(server.url + "/")
    tree.locator(f"#node-{agent}").wait_for()
    timer = page.locator("#agent-live time[data-elapsed]")
    timer.wait_for()
    server.kill()
    try:
        page.locator("#stream-banner").wait_for(state="visible")
        page.locator("body.server-away").wait_for(state="attached")
        assert page.locator(f"#pause-{agent}").is_disabled()
        assert page.locator(f"#prompt-send-{agent}").is_disabled()
        page.locator("#agent-live time[data-elapsed].stopped").wait_for(state="attached")
        before = timer.inner_text()
        page.evaluate("alineo.refreshTimes(document)")
        assert timer.inner_text() == before, "the timer of a turn we cannot see must not run"
        assert page.locator("#agent-live .badge").evaluate(
            "b => getComputedStyle(b).filter").startswith("grayscale")
        # The tree's stream is down too, and the tree page says so.
        tree.locator("#server-banner").wait_for(state="visible", timeout=20_000)
        assert tree.locator(f"#pause-{agent}").is_disabled()
    finally:
        server.start()
    page.locator("#stream-banner").wait_for(state="hidden", timeout=30_000)
    # The stream is back; the page's own poll, which also failed, clears at its next answer.
    page.locator("body:not(.server-away)").wait_for(state="attached", timeout=30_000)
    assert page.locator(f"#pause-{agent}").is_enabled()
    tree.locator("#server-banner").wait_for(state="hidden", timeout=30_000)
    assert tree.locator(f"#pause-{agent}").is_enabled()

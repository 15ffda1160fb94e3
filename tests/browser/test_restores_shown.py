"""What the operator is told about restores and checkpoints, in a browser
(issue 15, bugs 3 and 7, Build 3): the tree and the agent page say what a
restore lost in plain words, a rebuild's "files lost" stays visible after a
later reattach (the tree, the header and the side panel alike), a reattach
alone is quiet; a checkpoint's expiry follows the workspace's retention."""

import json

import pytest

pytestmark = pytest.mark.live

SPAWNED = ["agent.spawned", {"spec": {"model": "demo"}}]
REBUILD = ["agent.restored", {"rung": "rebuild", "reason": "no_checkpoint"}]
REATTACH = ["agent.restored", {"rung": "reattach", "reason": "control_plane_restart"}]
FILES_LOST = "rebuilt from the conversation only — files lost"


def append(server, agent_id: str, facts) -> None:
    server.django("from sessions import journal\n"
                  f"journal.append_many({agent_id!r}, [tuple(f) for f in {json.dumps(facts)}])\n")


def test_a_rebuild_stays_said_after_a_reattach_and_a_reattach_alone_is_quiet(server, actor, page):
    rebuilt = server.create_agent(actor, [SPAWNED, REBUILD, REATTACH])
    quiet = server.create_agent(actor, [SPAWNED, REATTACH])
    page.goto(server.url + "/")
    node = page.locator(f"#node-{rebuilt} > .node .node-main")
    assert FILES_LOST in node.locator(".rung").inner_text()
    assert "reattach" not in node.inner_text()
    assert page.locator(f"#node-{quiet} > .node .node-main").count() == 1
    assert page.locator(f"#node-{quiet} > .node .node-main .rung").count() == 0
    assert "reattach" not in page.locator(f"#node-{quiet} > .node .node-main").inner_text()

    page.goto(f"{server.url}/agents/{rebuilt}/")
    page.locator("#transcript[data-state=live]").wait_for()
    assert FILES_LOST in page.locator("#head-restore").inner_text()
    side = page.locator("#side").inner_text()
    assert "Rebuilt from the conversation only — files lost" in side and "Reattached — nothing lost" in side
    # Another restart's reattach, live: the header still says what was lost.
    append(server, rebuilt, [REATTACH])
    page.locator("#row-4").wait_for(state="attached")
    page.locator("#agent-live .head-facts", has_text="4 events").wait_for()
    assert FILES_LOST in page.locator("#head-restore").inner_text()

    page.goto(f"{server.url}/agents/{quiet}/")
    page.locator("#transcript[data-state=live]").wait_for()
    assert page.locator("#head-restore").count() == 0
    assert "reattached" not in page.locator("#agent-live").inner_text().lower()


def test_checkpoint_expiry_follows_a_seven_day_retention(server, actor, page):
    # Taken a day ago under 30 days (expires_at +29 d); the workspace now keeps 7:
    # it expires in 6 days less the test's own time, "in 5 d 23 h" — not "in 29 d".
    agent = server.create_agent(actor, [SPAWNED])
    server.django(
        "from datetime import timedelta\nfrom django.utils import timezone\n"
        "from sessions.models import Checkpoint, Workspace\n"
        "now = timezone.now()\n"
        f"cp = Checkpoint.objects.create(agent_id={agent!r}, sandbox_id='sb', turn=4, through_seq=1,"
        " bytes=1000, expires_at=now + timedelta(days=29))\n"
        "Checkpoint.objects.filter(pk=cp.pk).update(created_at=now - timedelta(days=1))\n"
        f"old = Checkpoint.objects.create(agent_id={agent!r}, sandbox_id='sb', turn=2, through_seq=1,"
        " bytes=1000, expires_at=now + timedelta(days=20))\n"
        "Checkpoint.objects.filter(pk=old.pk).update(created_at=now - timedelta(days=10))\n"
        f"Workspace.objects.filter(name={actor.workspace!r}).update(checkpoint_max_age_days=7)\n")
    page.goto(f"{server.url}/agents/{agent}/")
    rows = page.locator("#side section", has=page.locator("h2", has_text="Checkpoints")).locator("tbody tr")
    assert rows.count() == 1  # turn 2 is past the new policy: nothing to count on
    expires = rows.first.locator("td").nth(3)
    assert rows.first.locator("td").first.inner_text() == "4"
    assert expires.inner_text() == "in 5 d 23 h"
    page.evaluate("window.alineo.refreshTimes(document)")  # the page's own clock says the same
    assert expires.inner_text() == "in 5 d 23 h"

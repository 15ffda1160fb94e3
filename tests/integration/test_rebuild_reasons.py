"""Why a rebuild happened comes from the agent's history, not only from the
checkpoint rows left after a sweep: an operator can tell "never
checkpointed" from "its checkpoints aged out" from "someone deleted it".

One world per backend, seven agents that each wrote a file in a first turn.
Their newest checkpoints meet different fates — the admin's "Expire now"
and "Delete now" (through the admin's own pages), a shortened policy, an
expiry nobody swept yet, a file gone, a file damaged — `manage.py
sweep_checkpoints` runs between the expiry and the loss, every sandbox is
removed, and the next prompt says, through the API, which reason the ladder
gave; the agent page says it in plain words.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from tests.integration.worlds import events_of, remove_sandbox

CHECKPOINTED = {"model": "demo", "checkpoint": True}
FIRST = "write notes.txt: first turn"
EXPECTED = {
    "never": "no_checkpoint",
    "expire_now": "checkpoint_expired",
    "shortened_policy": "checkpoint_expired",
    "expired_unswept": "checkpoint_expired",
    "delete_now": "checkpoint_deleted",
    "file_gone": "checkpoint_missing",
    "file_damaged": "checkpoint_unusable",
}


def test_each_rebuild_says_what_became_of_the_newest_checkpoint(world):
    agents = {case: world.spawn({"model": "demo"} if case == "never" else CHECKPOINTED, FIRST)
              for case in EXPECTED}
    checkpoints = {case: _checkpointed(world, agent) for case, agent in agents.items()
                   if case != "never"}
    for case, agent in agents.items():
        world.wait_turns(agent, 1)
    admin = _Admin(world)
    admin.act("expire_now", checkpoints["expire_now"])
    admin.act("delete_now", checkpoints["delete_now"])
    _age(world, checkpoints["shortened_policy"], days=3)
    world.server.django(  # the operator shortens the workspace's policy to 2 days
        "from sessions.models import Workspace\n"
        f"Workspace.objects.filter(name={world.actor.workspace!r})"
        ".update(checkpoint_max_age_days=2)\nresult = 1\n")
    world.server.manage("sweep_checkpoints")
    _expire(world, checkpoints["expired_unswept"])  # after the sweep: still a row, expired
    paths = _paths(world, checkpoints)
    paths["file_gone"].unlink()
    paths["file_damaged"].write_bytes(b"not a zstd archive")

    for agent in agents.values():
        remove_sandbox(world, world.get(f"/api/agents/{agent}")["sandbox_id"])
        world.send(agent, "prompt", "read: notes.txt")
    for case, agent in agents.items():
        events = world.wait_turns(agent, 2)
        restored = events_of(events, "agent.restored")[-1]["data"]
        assert (restored["rung"], restored["reason"]) == ("rebuild", EXPECTED[case]), (case, restored)
        assert restored["cause"] == "sandbox_missing"

    swept = events_of(world.events(agents["expire_now"]), "agent.checkpoint_expired")
    assert [e["data"]["reason"] for e in swept] == ["expired"]
    policy = events_of(world.events(agents["shortened_policy"]), "agent.checkpoint_expired")
    assert [e["data"]["reason"] for e in policy] == ["policy_max_age"]
    deleted = events_of(world.events(agents["delete_now"]), "agent.checkpoint_deleted")
    assert [e["data"]["by"] for e in deleted] == [admin.username]
    cookie = world.server.session_cookie(world.actor)
    page = httpx.get(f"{world.url}/agents/{agents['shortened_policy']}/",
                     cookies={"sessionid": cookie}, timeout=30)
    assert page.status_code == 200 and "its newest checkpoint had expired" in page.text, \
        page.text[:2000]


def _checkpointed(world, agent: str) -> int:
    events = world.wait_for(agent, lambda evs: events_of(evs, "agent.checkpointed"),
                            "a turn checkpoint")
    return events_of(events, "agent.checkpointed")[0]["data"]["checkpoint"]


def _age(world, checkpoint: int, days: int) -> None:
    world.server.django(
        "from datetime import timedelta\nfrom django.utils import timezone\n"
        "from sessions.models import Checkpoint\n"
        f"Checkpoint.objects.filter(pk={checkpoint}).update("
        f"created_at=timezone.now() - timedelta(days={days}))\nresult = 1\n")


def _expire(world, checkpoint: int) -> None:
    world.server.django(
        "from datetime import timedelta\nfrom django.utils import timezone\n"
        "from sessions.models import Checkpoint\n"
        f"Checkpoint.objects.filter(pk={checkpoint}).update("
        "expires_at=timezone.now() - timedelta(seconds=1))\nresult = 1\n")


def _paths(world, checkpoints: dict[str, int]) -> dict:
    found = world.server.django(
        "from sessions.models import Checkpoint\n"
        f"result = dict(Checkpoint.objects.filter(pk__in={sorted(checkpoints.values())})"
        ".values_list('pk', 'path'))\n")
    return {case: Path(found[str(pk)]) for case, pk in checkpoints.items()}


class _Admin:
    """An operator in Django's admin, logged in, choosing an action on the
    checkpoint list as its page offers it."""

    username = "operator"

    def __init__(self, world):
        self.world = world
        world.server.django(
            "from django.contrib.auth import get_user_model\n"
            f"get_user_model().objects.create_superuser({self.username!r}, "
            "password='operator-password-123')\nresult = 1\n")
        self.client = httpx.Client(timeout=30, follow_redirects=True)
        login = f"{world.url}/admin/login/"
        token = _csrf(self.client.get(login).text)
        done = self.client.post(login, data={"username": self.username, "csrfmiddlewaretoken": token,
                                             "password": "operator-password-123", "next": "/admin/"},
                                headers={"Referer": login})
        assert done.status_code == 200 and "Log out" in done.text, done.text[:2000]

    def act(self, action: str, checkpoint: int) -> None:
        listing = f"{self.world.url}/admin/agent_sessions/checkpoint/"
        token = _csrf(self.client.get(listing).text)
        done = self.client.post(listing, data={"action": action, "_selected_action": checkpoint,
                                               "csrfmiddlewaretoken": token, "index": 0},
                                headers={"Referer": listing})
        assert done.status_code == 200 and "messagelist" in done.text, done.text[:2000]


def _csrf(html: str) -> str:
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)

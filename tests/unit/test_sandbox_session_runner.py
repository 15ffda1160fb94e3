"""The worker's runner of sandbox sessions (sessions/worker/sbrunner.py): a scan
starts one task per session with pending commands, which acts on them in id
order off the serving loop and gives the lease back when done."""

import asyncio

import pytest

from sessions.commands import sandbox as commands
from sessions.models import Command, SandboxSession
from sessions.worker import sbrunner

from .test_sandbox_session_ops import backend  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db(transaction=True)


async def drain(runner):
    await runner.scan()
    await asyncio.gather(*runner.tasks.values())


def test_a_scan_acts_on_every_pending_command_in_order(owner, backend):
    sid = commands.create(owner, {"spec": {"image": "default"}}).body["id"]
    first = commands.send(owner, sid, "exec", {"argv": ["sh", "-c", "echo 1 >> f"]}).body
    second = commands.send(owner, sid, "exec", {"argv": ["cat", "f"]}).body
    runner = sbrunner.SessionRunner()
    asyncio.run(drain(runner))
    assert Command.objects.get(pk=first["command"]).state == "done"
    assert Command.objects.get(pk=second["command"]).result["stdout"] == "1\n"
    row = SandboxSession.objects.get(pk=sid)
    assert row.status == "ready" and row.lease_holder  # released: expired now, not cleared
    assert sbrunner.claim(sid)


def test_a_session_held_by_a_live_worker_is_left_alone(owner, backend):
    from datetime import timedelta

    from django.utils import timezone
    sid = commands.create(owner, {"spec": {"image": "default"}}).body["id"]
    SandboxSession.objects.filter(pk=sid).update(
        lease_holder="other", lease_expires=timezone.now() + timedelta(seconds=60))
    runner = sbrunner.SessionRunner()
    asyncio.run(drain(runner))
    assert runner.tasks == {} and SandboxSession.objects.get(pk=sid).status == "starting"

"""The supervisor's and the driver's decisions, one at a time
(sessions/worker/supervisor.py, sessions/worker/driver.py): which agents have
work, how a failed driver backs off, whom the watcher sends up the ladder, and
what an agent with no sandbox does with its pending commands. The drivers
themselves are not run here (tests/integration and tests/faults run them)."""

from __future__ import annotations

import asyncio
import time

import pytest

from sandboxes.backends.base import SandboxStatus
from sessions import commands, leases
from sessions.models import Agent, Command
from sessions.worker import supervisor as sup
from sessions.worker.driver import UNLOADED, AgentDriver

pytestmark = pytest.mark.django_db(transaction=True)


def _failed_task(exc: BaseException) -> asyncio.Future:
    loop = asyncio.new_event_loop()
    try:
        fut = loop.create_future()
        fut.set_exception(exc)
        return fut
    finally:
        loop.close()


def test_a_failed_driver_backs_off_doubling_and_a_clean_end_or_lost_lease_clears_it():
    s = sup.Supervisor()
    delays = []
    for _ in range(8):
        before = time.monotonic()
        s._ended("ag_1", _failed_task(RuntimeError("boom")))
        count, not_before = s.failures["ag_1"]
        delays.append(round(not_before - before))
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60] and count == 8
    s._ended("ag_1", _failed_task(leases.LeaseLost("another worker took it")))
    assert "ag_1" not in s.failures  # not this worker's to retry
    s._ended("ag_2", _failed_task(RuntimeError("boom")))
    done = asyncio.new_event_loop().create_future()
    done.set_result(None)
    s._ended("ag_2", done)
    assert "ag_2" not in s.failures


def test_agents_with_work_are_pending_commands_and_live_sandboxes_not_unloaded_ones(
        workspace, owner):
    def make(**kw):
        return Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"},
                                    **kw)
    live = make(sandbox_id="sb-live", status="running")
    make(sandbox_id="sb-stopped", status="stopped")
    make(sandbox_id="sb-unloaded", status="idle", status_reason=UNLOADED)
    make()  # no sandbox, nothing pending
    waiting = make()
    commands.send(owner, waiting.id, "prompt", {"text": "hello"})
    assert asyncio.run(sup._agents_with_work()) == sorted([live.id, waiting.id])


class _Backend:
    host = ""

    def __init__(self, states):
        self.states = states

    def list(self):
        return [type("H", (), {"id": sid, "status": st}) for sid, st in self.states.items()]


class _Driver:
    def __init__(self):
        self.gone = False

    def sandbox_gone(self):
        self.gone = True


def test_the_watcher_flags_a_driven_agent_and_starts_an_undriven_one(workspace, owner, monkeypatch):
    def make(sid):
        return Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"},
                                    sandbox_id=sid, status="running").id
    running, driven_gone, undriven_gone, undriven_exited = (
        make("sb-a"), make("sb-b"), make("sb-c"), make("sb-d"))
    monkeypatch.setattr(sup, "get_backend", lambda: _Backend(
        {"sb-a": SandboxStatus.RUNNING, "sb-b": SandboxStatus.EXITED,
         "sb-d": SandboxStatus.EXITED}))  # sb-c: missing
    started = []
    monkeypatch.setattr(sup.Supervisor, "_start_driver", lambda self, held: started.append(
        held.agent_id))
    s = sup.Supervisor()
    driver = _Driver()
    s.drivers[driven_gone], s.objects[driven_gone] = object(), driver
    s.failures[undriven_gone] = (3, time.monotonic() + 60)  # backing off: not for a known loss
    asyncio.run(s.watch())
    assert driver.gone
    assert sorted(started) == sorted([undriven_gone, undriven_exited])
    assert running not in started and undriven_gone not in s.failures


def test_an_ended_agent_without_a_sandbox_fails_its_commands_but_a_stop(workspace, owner):
    agent = Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"})
    commands.send(owner, agent.id, "prompt", {"text": "hello"})
    commands.send(owner, agent.id, "stop", {})
    Agent.objects.filter(pk=agent.pk).update(status="stopped")
    d = AgentDriver(agent.id)

    async def run():
        await d._reload()
        return await d._act_without_sandbox()
    assert asyncio.run(run()) is False
    states = dict(Command.objects.filter(agent=agent).values_list("verb", "state"))
    assert states == {"prompt": "failed", "stop": "done"}


def test_a_live_agent_without_a_sandbox_with_a_pending_command_needs_one(workspace, owner):
    agent = Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"})
    d = AgentDriver(agent.id)

    async def run():
        await d._reload()
        return await d._act_without_sandbox()
    assert asyncio.run(run()) is False  # nothing pending: nothing to make a sandbox for
    commands.send(owner, agent.id, "prompt", {"text": "hello"})
    assert asyncio.run(run()) is True

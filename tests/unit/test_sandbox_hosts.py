"""Sandbox hosts: which engine holds a sandbox is recorded (Agent.sandbox_host),
a worker reaches that engine through it, and a sandbox on another machine's
engine is removed there before the agent is restored on this worker's engine."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import pytest

from sandboxes import backends as base
from sandboxes.backends.docker import DockerBackend
from sandboxes.errors import BackendUnavailable, SandboxNotFound
from sessions import journal
from sessions.models import Agent
from sessions.worker import ladder
from sessions.worker.context import LadderError


@pytest.fixture(autouse=True)
def _fresh_backend_caches():
    base.reset()
    yield
    base.reset()


def test_engines_on_this_machine_have_reachable_bridges():
    assert base.bridge_reachable("")
    assert base.bridge_reachable("unix:///var/run/docker.sock")
    assert base.bridge_reachable(f"local:{socket.gethostname()}")
    assert not base.bridge_reachable("local:another-machine")
    assert not base.bridge_reachable("tcp://127.0.0.1:2376")
    assert not base.bridge_reachable("ssh://ops@builder")


def test_backend_for_reaches_the_recorded_engine(settings, monkeypatch):
    settings.ALINEO_SANDBOX = "local"
    own = base.get_backend()
    assert own.host == f"local:{socket.gethostname()}"
    assert base.backend_for("") is own and base.backend_for(own.host) is own
    other = base.backend_for("tcp://127.0.0.1:2399")
    assert isinstance(other, DockerBackend) and other.host == "tcp://127.0.0.1:2399"
    assert base.backend_for("tcp://127.0.0.1:2399") is other  # one client per engine
    with pytest.raises(BackendUnavailable):
        base.backend_for("local:another-machine")


def test_a_docker_worker_reaches_a_local_sandbox_of_this_machine(settings):
    from sandboxes.backends.local import LocalBackend

    settings.ALINEO_SANDBOX = "docker"
    assert isinstance(base.backend_for(f"local:{socket.gethostname()}"), LocalBackend)


def test_docker_host_names_the_engine(settings):
    settings.DOCKER_HOST = "unix:///run/other-docker.sock"
    assert DockerBackend().host == "unix:///run/other-docker.sock"
    settings.DOCKER_HOST = ""
    assert DockerBackend().host == "unix:///var/run/docker.sock"


@pytest.mark.django_db(transaction=True)
def test_the_agent_row_records_the_engine_of_its_sandbox(agent):
    journal.append(agent.id, "agent.sandbox", {"sandbox_id": "c1", "backend": "docker",
                                               "host": "unix:///run/a.sock"})
    assert Agent.objects.values_list("sandbox_id", "sandbox_host").get(pk=agent.id) == (
        "c1", "unix:///run/a.sock")
    # A restore elsewhere records the new engine with the new sandbox.
    journal.append(agent.id, "agent.sandbox", {"sandbox_id": "c2", "host": "tcp://127.0.0.1:1"})
    assert Agent.objects.values_list("sandbox_id", "sandbox_host").get(pk=agent.id) == (
        "c2", "tcp://127.0.0.1:1")


class _Engine:
    def __init__(self, host: str, fail=None):
        self.host, self.fail, self.removed = host, fail, []

    def remove(self, sid):
        if self.fail:
            raise self.fail
        self.removed.append(sid)


def _info(engine):
    return SimpleNamespace(id="ag_x", sandbox_id="c-old", sandbox_host=engine.host,
                           cursor=0, session="")


@pytest.mark.parametrize("fail", [None, SandboxNotFound("already gone")])
def test_a_sandbox_on_another_machine_is_removed_there_before_the_restore_here(
        monkeypatch, settings, fail):
    settings.ALINEO_SANDBOX = "local"
    remote = _Engine("tcp://127.0.0.1:2399", fail)
    seen = []

    async def fresh(info, backend, link, why):
        seen.append((list(remote.removed), backend, why))

    monkeypatch.setattr(ladder, "_fresh", fresh)
    asyncio.run(ladder.recover(_info(remote), remote, link=None))
    assert seen == [([] if fail else ["c-old"], base.get_backend(), "engine_unreachable_from_worker")]


def test_an_engine_that_does_not_answer_is_never_restored_beside(monkeypatch, settings):
    settings.ALINEO_SANDBOX = "local"
    remote = _Engine("tcp://127.0.0.1:2399", BackendUnavailable("no answer"))
    called = []

    async def fresh(info, backend, link, why):
        called.append(why)

    monkeypatch.setattr(ladder, "_fresh", fresh)
    with pytest.raises(LadderError):
        asyncio.run(ladder.recover(_info(remote), remote, link=None))
    assert called == []  # it may still be running there: try again later

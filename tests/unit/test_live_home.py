"""A look at the live home (issue 15, Build 6: "the live home when the sandbox
runs"), its decisions one at a time: when a look is refused (the web process
and the worker share one rule), what the worker stores (the backend's tar
path, capped as a checkpoint; nothing half-written on a failure), that only
the newest is kept and the sweep expires it, that it is never a checkpoint,
and that a driver never wakes a stopped sandbox for a look. The whole path,
on both backends, is tests/integration/test_live_home.py."""

from __future__ import annotations

import asyncio
import io
import tarfile
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from sandboxes import home_files
from sessions import journal, live_home
from sessions.models import Agent, Checkpoint, Command, Event, LiveHome, UNLOADED, Workspace
from sessions.worker import driver as driver_mod
from sessions.worker import looks, operations, store
from sessions.worker.driver import AgentDriver
from tests.unit.test_home_files import make_checkpoint

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("status, reason, sandbox, zdr, code", [
    ("running", "", "sb1", False, None),
    ("idle", "sandbox started", "sb1", False, None),
    ("paused", "pause by olivia", "sb1", False, None),
    ("interrupted", "", "sb1", False, None),
    ("idle", UNLOADED, "sb1", False, "home_snapshot.not_running"),
    ("restoring", "", "sb1", False, "home_snapshot.not_running"),
    ("stopped", "", "sb1", False, "home_snapshot.not_running"),
    ("lost", "", "sb1", False, "home_snapshot.not_running"),
    ("unrecoverable", "", "sb1", False, "home_snapshot.not_running"),
    ("starting", "", "", False, "home_snapshot.no_sandbox"),
    ("idle", "", "", False, "home_snapshot.no_sandbox"),
    ("running", "", "sb1", True, "home_snapshot.zero_data_retention"),
])
def test_when_a_look_is_refused(status, reason, sandbox, zdr, code):
    refused = live_home.refusal(status, reason, sandbox, zdr)
    assert (refused.code if refused else None) == code
    assert refused is None or refused.message.endswith(".")


# --- what the worker stores ------------------------------------------------------------


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class FakeBackend:
    """read_home as the backends give it: an uncompressed tar stream."""

    def __init__(self, members=None, fail_after: int | None = None, big: int = 0):
        self.members = members or {}
        self.fail_after, self.big = fail_after, big

    def read_home(self, sandbox_id):
        data = _tar(self.members)
        for i in range(0, len(data), 512):
            if self.fail_after is not None and i >= self.fail_after:
                raise OSError("the sandbox went away mid-read")
            yield data[i:i + 512]
        for _ in range(self.big):
            yield b"\0" * (1 << 20)


class FakeLink:
    def __init__(self, turns=2):
        async def status(timeout=None):
            return SimpleNamespace(turns=turns)
        self.control = SimpleNamespace(status=status)


@pytest.fixture
def running(workspace, owner):
    agent = Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"},
                                 sandbox_id="sb-live")
    journal.append(agent.id, "agent.spawned", {"spec": {"model": "demo"}})
    Agent.objects.filter(pk=agent.pk).update(status="running")
    return agent


def _look(agent, owner) -> Command:
    """A pending look, as the command path leaves it."""
    cmd = Command.objects.create(workspace_id=agent.workspace_id, user=owner, agent=agent,
                                 verb="home_snapshot", request_hash="x", response_status=202)
    cmd.seq = journal.append(agent.id, "command.home_snapshot", {"command": cmd.pk}).seq
    cmd.save()
    return cmd


def _take(agent, cmd, backend, link=None):
    async def go():
        info = await store.load(agent.id)
        pending = [c for c in await store.pending(agent.id) if c.id == cmd.pk][0]
        await operations.act(pending, info, backend, link or FakeLink())
    asyncio.run(go())


def test_the_worker_stores_the_live_home_and_journals_a_system_fact(running, owner, settings,
                                                                    tmp_path):
    settings.DATA_DIR = str(tmp_path)
    cmd = _look(running, owner)
    _take(running, cmd, FakeBackend({"./notes.txt": b"mid-session\n"}))
    cmd.refresh_from_db()
    row = LiveHome.objects.get(agent=running)
    assert cmd.state == "done" and cmd.result["live_home"] == row.pk and row.turn == 2
    assert row.path.startswith(str(tmp_path / "live-homes" / running.id))
    assert "notes.txt" in home_files.listing(row.path).entries
    fact = Event.objects.filter(agent=running).order_by("-seq").first()
    assert fact.type == "agent.home_snapshot" and fact.data["command"] == cmd.pk
    assert not Checkpoint.objects.exists()  # a look is never a checkpoint
    assert abs((row.expires_at - row.created_at).total_seconds() - live_home.KEEP_S) < 60


@pytest.mark.parametrize("backend, code", [
    (FakeBackend({"./a": b"x" * 5000}, fail_after=1024), "home_snapshot.failed"),
    (FakeBackend({"./a": b"x"}, big=3), "home_snapshot.failed"),  # past the restore cap
])
def test_a_look_that_fails_leaves_nothing_behind(running, owner, settings, tmp_path, backend, code):
    settings.DATA_DIR = str(tmp_path)
    settings.ALINEO_RESTORE_MAX_BYTES = 2 << 20
    cmd = _look(running, owner)
    _take(running, cmd, backend)
    cmd.refresh_from_db()
    assert cmd.state == "failed" and cmd.result["code"] == code
    assert not LiveHome.objects.exists()
    assert not [p for p in (tmp_path / "live-homes").rglob("*") if p.is_file()]
    types = list(Event.objects.filter(agent=running).values_list("type", flat=True))
    assert types[-1] == "agent.home_snapshot_failed" and "command.failed" not in types


def test_zero_data_retention_takes_no_look(running, owner, settings, tmp_path):
    settings.DATA_DIR = str(tmp_path)
    cmd = _look(running, owner)
    Workspace.objects.filter(pk=running.workspace_id).update(zero_data_retention=True)
    _take(running, cmd, FakeBackend({"./a": b"x"}))
    cmd.refresh_from_db()
    assert cmd.result["code"] == "home_snapshot.zero_data_retention"
    assert not LiveHome.objects.exists() and not (tmp_path / "live-homes").exists()


def _row(agent, path, **kw) -> LiveHome:
    return LiveHome.objects.create(agent=agent, sandbox_id="sb-live", path=str(path),
                                   expires_at=timezone.now() + timedelta(hours=1), **kw)


def test_only_the_newest_is_kept_and_the_sweep_expires_it(running, settings, tmp_path):
    settings.DATA_DIR = str(tmp_path)
    folder = tmp_path / "live-homes" / running.id
    folder.mkdir(parents=True)
    old = _row(running, make_checkpoint(folder / "a.tar.zst", {"./a": "1"}))
    new = _row(running, make_checkpoint(folder / "b.tar.zst", {"./b": "2"}))
    assert live_home.keep_only(new) == 1
    old.refresh_from_db()
    assert old.deleted_at and not (folder / "a.tar.zst").exists()
    assert live_home.newest(running.id) == new
    assert live_home.sweep() == 0
    assert live_home.sweep(timezone.now() + timedelta(hours=2)) == 1
    assert not (folder / "b.tar.zst").exists() and live_home.newest(running.id) is None


def test_newest_skips_an_expired_or_missing_file_and_zdr_sweeps_all(running, settings, tmp_path):
    settings.DATA_DIR = str(tmp_path)
    folder = tmp_path / "live-homes" / running.id
    folder.mkdir(parents=True)
    row = _row(running, folder / "gone.tar.zst")
    assert live_home.newest(running.id) is None  # its file is not there
    make_checkpoint(folder / "gone.tar.zst", {"./a": "1"})
    assert live_home.newest(running.id) == row
    LiveHome.objects.filter(pk=row.pk).update(expires_at=timezone.now())
    assert live_home.newest(running.id) is None
    fresh = _row(running, make_checkpoint(folder / "c.tar.zst", {"./c": "1"}))
    Workspace.objects.filter(pk=running.workspace_id).update(zero_data_retention=True)
    assert live_home.sweep() == 2
    fresh.refresh_from_db()
    assert fresh.deleted_at and not (folder / "c.tar.zst").exists()


def test_the_sweep_never_deletes_outside_live_homes(running, settings, tmp_path):
    settings.DATA_DIR = str(tmp_path / "data")
    elsewhere = make_checkpoint(tmp_path / "precious.tar.zst", {"./a": "1"})
    _row(running, elsewhere, )
    LiveHome.objects.update(expires_at=timezone.now())
    assert live_home.sweep() == 1 and elsewhere.exists()


# --- a driver never wakes a stopped sandbox for a look --------------------------------------


def _unloaded(workspace, owner) -> Agent:
    agent = Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"},
                                 sandbox_id="sb-stopped")
    journal.append(agent.id, "agent.spawned", {"spec": {"model": "demo"}})
    Agent.objects.filter(pk=agent.pk).update(status="idle", status_reason=UNLOADED)
    return agent


def _reach(agent, monkeypatch) -> tuple[bool, list[str]]:
    woke: list[str] = []

    async def recover(self, boot=False):
        woke.append("ladder")

    async def slot(agent_id):
        woke.append("slot")
        return True
    monkeypatch.setattr(AgentDriver, "_recover", recover)
    monkeypatch.setattr(driver_mod, "_slot", slot)
    d = AgentDriver(agent.id)
    return asyncio.run(d._reach_a_bridge()), woke


def test_a_look_at_an_unloaded_agent_is_refused_without_waking_it(workspace, owner, monkeypatch):
    agent = _unloaded(workspace, owner)
    cmd = _look(agent, owner)
    reached, woke = _reach(agent, monkeypatch)
    assert reached is False and woke == []
    cmd.refresh_from_db()
    assert cmd.state == "failed" and cmd.result["code"] == "home_snapshot.not_running"
    assert Event.objects.filter(agent=agent).order_by("-seq").first().type == \
        "agent.home_snapshot_failed"
    assert Agent.objects.get(pk=agent.pk).sandbox_slot is False


def test_a_prompt_beside_the_look_still_wakes_it_but_the_look_is_refused(workspace, owner,
                                                                          monkeypatch):
    from sessions import commands
    agent = _unloaded(workspace, owner)
    cmd = _look(agent, owner)
    commands.send(owner, agent.id, "prompt", {"text": "say: hi"})
    reached, woke = _reach(agent, monkeypatch)
    assert reached is True and woke == ["slot", "ladder"]
    cmd.refresh_from_db()
    assert cmd.state == "failed"


def test_a_look_at_a_running_agent_waits_for_its_bridge(running, owner, monkeypatch):
    cmd = _look(running, owner)
    assert asyncio.run(looks.refuse_unless_running(asyncio.run(store.load(running.id)),
                                                   asyncio.run(store.pending(running.id)))) is False
    cmd.refresh_from_db()
    assert cmd.state == "pending"

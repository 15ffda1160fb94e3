"""The worker's sandbox session operations (sessions/worker/sbops.py) on a real
host-directory backend (unisolated: fast, no Docker): create, exec, checkpoint,
loss, resume with replay, divergence, an exec interrupted by a crash, remove."""

from pathlib import Path

import pytest

from sandboxes.backends.unisolated import UnisolatedBackend
from sessions import leases, sbjournal
from sessions.commands import sandbox as commands
from sessions.models import Command, SandboxSession, SandboxSessionEvent
from sessions.worker import sbops, sbrunner

pytestmark = pytest.mark.django_db


@pytest.fixture
def backend(tmp_path, monkeypatch):
    be = UnisolatedBackend(root=tmp_path / "sb")
    monkeypatch.setattr(sbops, "get_backend", lambda: be)
    yield be
    for handle in be.list():
        be.remove(handle.id)


@pytest.fixture
def session(owner, backend):
    sid = commands.create(owner, {"spec": {"image": "default"}}).body["id"]
    assert sbrunner.claim(sid)
    run_all(sid)
    return sid


def run_all(session_id):
    while (cmd := sbrunner.next_pending(session_id)) is not None:
        sbops.act(session_id, cmd, leases.holder())


def send(owner, session_id, verb, body=None):
    cmd = commands.send(owner, session_id, verb, body or {}).body["command"]
    run_all(session_id)
    return Command.objects.get(pk=cmd)


def sh(owner, session_id, script, **kw):
    return send(owner, session_id, "exec", {"argv": ["sh", "-c", script], **kw})


def home(backend, session_id):
    return Path(backend.host_home(SandboxSession.objects.get(pk=session_id).sandbox_id))


def types(session_id):
    return list(SandboxSessionEvent.objects.filter(session_id=session_id).order_by("seq")
                .values_list("type", flat=True))


def test_create_makes_a_running_sandbox(session, backend):
    row = SandboxSession.objects.get(pk=session)
    assert row.status == "ready" and row.sandbox_id
    assert backend.status(row.sandbox_id).value == "running"
    assert types(session) == ["session.created", "session.sandbox", "session.ready"]


def test_exec_returns_output_exit_code_and_duration(owner, session, backend):
    cmd = sh(owner, session, "echo out; echo err >&2; exit 3")
    assert cmd.state == "done"
    r = cmd.result
    assert (r["exit_code"], r["stdout"], r["stderr"]) == (3, "out\n", "err\n")
    assert r["duration_ms"] >= 0 and r["truncated"] == {"stdout": 0, "stderr": 0}
    assert types(session)[-5:] == ["command.exec", "exec.started", "exec.output", "exec.output",
                                   "exec.finished"]


def test_output_is_journaled_while_the_exec_runs(owner, session):
    cmd = sh(owner, session, "echo first; sleep 1.2; echo second; echo oops >&2")
    rows = list(SandboxSessionEvent.objects.filter(session_id=session, type="exec.output")
                .order_by("seq"))
    assert [(r.data["stream"], r.data["text"]) for r in rows][:1] == [("stdout", "first\n")]
    assert "".join(r.data["text"] for r in rows if r.data["stream"] == "stdout") == (
        "first\nsecond\n")
    assert {r.data["command"] for r in rows} == {cmd.pk}
    assert cmd.result["stdout"] == "first\nsecond\n"


def test_exec_in_a_cwd(owner, session, backend):
    (home(backend, session) / "sub").mkdir()
    assert sh(owner, session, "pwd", cwd="sub").result["stdout"].strip().endswith("/sub")
    assert sh(owner, session, "pwd", cwd="nowhere").result["exit_code"] == 127


def test_output_is_bounded_and_nul_free(owner, session):
    r = sh(owner, session, "head -c 70000 /dev/zero").result
    assert len(r["stdout"]) == sbops.OUTPUT_MAX and "\x00" not in r["stdout"]
    assert r["truncated"]["stdout"] == 70000 - sbops.OUTPUT_MAX
    streamed = SandboxSessionEvent.objects.filter(session_id=session, type="exec.output")
    assert sum(len(e.data["text"]) for e in streamed) == sbops.OUTPUT_MAX
    assert all("\x00" not in e.data["text"] for e in streamed)


def test_a_timed_out_exec_fails_and_is_not_replayed(owner, session):
    cmd = sh(owner, session, "sleep 5", timeout=1)
    assert (cmd.state, cmd.result["code"]) == ("failed", "exec.timeout")
    assert [n["reason"] for n in sbjournal.plan_of(session).not_replayed] == ["exec.timed_out"]


def test_loss_checkpoint_resume_replays_in_order(owner, session, backend):
    sh(owner, session, "echo one > a")
    assert send(owner, session, "checkpoint", {"name": "deps"}).state == "done"
    sh(owner, session, "echo two >> a; echo x > b")
    sh(owner, session, "test -f b")
    old = SandboxSession.objects.get(pk=session).sandbox_id
    backend.remove(old)  # the sandbox is lost
    lost = sh(owner, session, "true")
    assert (lost.state, lost.result["code"]) == ("failed", "sandbox.lost")
    assert SandboxSession.objects.get(pk=session).status == "lost"
    resumed = send(owner, session, "resume")
    assert resumed.state == "done", resumed.result
    r = resumed.result
    assert r["snapshot"] == "deps" and r["old_sandbox_id"] == old and r["sandbox_id"] != old
    assert [x["exit_code"] for x in r["replayed"]] == [0, 0]
    assert (home(backend, session) / "a").read_text() == "one\ntwo\n"
    assert (home(backend, session) / "b").exists()
    assert SandboxSession.objects.get(pk=session).status == "ready"
    # A second resume replays the same two execs again from the snapshot.
    again = send(owner, session, "resume")
    assert len(again.result["replayed"]) == 2
    assert (home(backend, session) / "a").read_text() == "one\ntwo\n"


def test_resume_without_a_snapshot_starts_from_the_image(owner, session, backend):
    sh(owner, session, "echo 1 > f")
    r = send(owner, session, "resume").result
    assert r["snapshot"] is None and len(r["replayed"]) == 1
    assert (home(backend, session) / "f").read_text() == "1\n"


def test_a_diverging_replay_stops_and_says_which(owner, session, backend):
    sh(owner, session, "echo 1 > f")
    send(owner, session, "checkpoint", {"name": "s1"})
    sh(owner, session, "echo later > h")
    (home(backend, session) / "marker").write_text("")  # not made by a recorded exec
    assert sh(owner, session, "test ! -e marker").result["exit_code"] == 1
    sh(owner, session, "echo after > i")
    cmd = send(owner, session, "resume")
    assert (cmd.state, cmd.result["code"]) == ("failed", "replay.diverged")
    d = cmd.result["diverged"]
    assert (d["index"], d["recorded_exit_code"], d["exit_code"], d["dropped"]) == (1, 1, 0, 1)
    assert "exec 2" in cmd.result["message"]
    assert (home(backend, session) / "h").exists() and not (home(backend, session) / "i").exists()
    assert types(session)[-1] == "session.replay_diverged"
    plan = sbjournal.plan_of(session)
    assert [e["exit_code"] for e in plan.execs] == [0, 0]  # what the sandbox now holds
    assert SandboxSession.objects.get(pk=session).status == "ready"


def test_an_exec_started_but_not_recorded_is_reported_not_rerun(owner, session, backend):
    cmd_id = commands.send(owner, session, "exec", {"argv": ["sh", "-c", "echo x >> once"]}
                           ).body["command"]
    # The control plane died after journaling exec.started (the exec may have run).
    sbjournal.append(session, "exec.started", {"argv": ["sh", "-c", "echo x >> once"],
                                               "cwd": None, "command": cmd_id})
    run_all(session)
    cmd = Command.objects.get(pk=cmd_id)
    assert (cmd.state, cmd.result["code"]) == ("failed", "exec.interrupted")
    assert not (home(backend, session) / "once").exists()
    r = send(owner, session, "resume").result
    assert r["replayed"] == [] and [n["command"] for n in r["not_replayed"]] == [cmd_id]


def test_remove_ends_the_session_and_frees_its_slot(owner, session, backend):
    send(owner, session, "checkpoint", {"name": "s"})
    ref = sbjournal.snapshots(session)[0]["ref"]
    assert send(owner, session, "remove").state == "done"
    row = SandboxSession.objects.get(pk=session)
    assert (row.status, row.sandbox_id, row.sandbox_slot) == ("removed", "", False)
    assert backend.list() == [] and not backend.image_exists(ref)


def test_a_worker_without_the_lease_cannot_journal(owner, session):
    commands.send(owner, session, "exec", {"argv": ["true"]})
    SandboxSession.objects.filter(pk=session).update(lease_holder="elsewhere:1:1")
    with pytest.raises(sbjournal.LeaseLost):
        sbops.act(session, sbrunner.next_pending(session), leases.holder())


def test_claim_refuses_a_live_holder(owner, session):
    from datetime import timedelta

    from django.utils import timezone
    SandboxSession.objects.filter(pk=session).update(
        lease_holder="another-worker", lease_expires=timezone.now() + timedelta(seconds=60))
    assert not sbrunner.claim(session)
    SandboxSession.objects.filter(pk=session).update(lease_expires=timezone.now())
    assert sbrunner.claim(session)


def test_a_sandbox_left_behind_by_a_crash_is_removed_at_resume(owner, session, backend):
    orphan = backend.create(session, "default", labels={sbops.LABEL_SESSION: session})
    current = SandboxSession.objects.get(pk=session).sandbox_id
    new = send(owner, session, "resume").result["sandbox_id"]
    assert {h.id for h in backend.list()} == {new}
    assert orphan != new != current

"""What the worker does for a sandbox session's commands (blocking: the runner,
sessions/worker/sbrunner.py, calls :func:`act` in a thread of its own, never
in the API process). Each command ends with ONE transaction: its last fact,
the session row's projection and the Command row's state and result.

Honest replay (docs/API.md "Replay"): an exec is journaled as
``exec.started`` before it runs and ``exec.finished`` (argv, cwd, exit code,
bounded output) after; only ``exec.finished`` facts are replayed. A command
found with ``exec.started`` and no outcome (the control plane died mid-exec)
is not run again: ``exec.interrupted``, command failed ``exec.interrupted``,
and every later resume reports it under ``not_replayed``. A replayed exec whose
exit code differs stops the replay (``session.replay_diverged``: which exec,
both exit codes) and fails the resume with ``replay.diverged``.

Nothing from the sandbox is trusted: output is decoded with replacement,
NUL-free, and cut to ``OUTPUT_MAX`` bytes a stream (the end is kept).
"""

from __future__ import annotations

import codecs
import logging
import time
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from sandboxes import config
from sandboxes.backends import get_backend
from sandboxes.backends.base import SandboxStatus
from sandboxes.errors import ExecTimeout, SandboxError, SandboxNotFound, SandboxNotRunning
from sandboxes.setup import ensure_setup_image
from sessions import sbjournal
from sessions.models import (
    Command,
    CommandState,
    SandboxSession,
    SandboxSessionEvent,
    SandboxSessionStatus,
)

log = logging.getLogger(__name__)

OUTPUT_MAX = 64 * 1024
CHUNK_BYTES = 8 * 1024
CHUNK_S = 0.5
LABEL_SESSION = "alineo.sandbox_session"
#: A cwd is entered by a shell that then execs argv, so argv is never a shell string.
CWD_SHIM = 'cd -- "$1" || exit 127; shift; exec "$@"'
S = SandboxSessionStatus


@dataclass
class Ending:
    """How a command ends: its state and result, its last fact, the row's changes."""

    state: str
    result: dict
    fact: str
    data: dict
    changes: dict = field(default_factory=dict)


def failed(code: str, message: str, fact: str = "command.failed", **data) -> Ending:
    return Ending(CommandState.FAILED, {"code": code, "message": message, **data}, fact,
                  {"code": code, "message": message, **data})


def act(session_id: str, command_id: int, holder: str) -> None:
    """Act on one pending command of the session and settle it."""
    cmd = Command.objects.get(pk=command_id)
    session = SandboxSession.objects.get(pk=session_id)
    verb = cmd.verb.removeprefix("sb_")
    if session.status == S.REMOVED and verb != "remove":
        ending = failed("sandbox.removed", f"Sandbox session {session_id} was removed.")
    else:
        ending = _attempt(verb, session, cmd, holder)
    settle(session_id, cmd.pk, holder, ending)


def _attempt(verb: str, session: SandboxSession, cmd: Command, holder: str) -> Ending:
    try:
        return VERBS[verb](session, cmd, _args_of(session.pk, cmd), holder)
    except SandboxError as exc:
        if not exc.permanent:
            raise  # the engine is away: the runner retries the command later
        ending = failed("sandbox.error", str(exc)[:2000])
        if verb in ("create", "resume"):
            ending.changes = {"status": S.FAILED, "status_reason": str(exc)[:500]}
        return ending


def settle(session_id: str, command_id: int, holder: str, ending: Ending) -> None:
    with transaction.atomic():
        data = {**ending.data, "command": command_id}
        sbjournal.append(session_id, ending.fact, data, holder=holder, **ending.changes)
        Command.objects.filter(pk=command_id).update(state=ending.state, result=ending.result,
                                                     acted_at=timezone.now())


def _args_of(session_id: str, cmd: Command) -> dict:
    fact = (SandboxSessionEvent.objects.filter(session_id=session_id, seq=cmd.seq)
            .values_list("data", flat=True).first())
    return fact or {}


# --- create / resume: a new sandbox ------------------------------------------------------------


def _new_sandbox(session: SandboxSession, image: str | None, cmd: Command, holder: str) -> str:
    """A sandbox for the session, after removing any it left behind (a crash
    between create and its journaled ``session.sandbox``): found by label."""
    backend = get_backend()
    for orphan in backend.list(labels={LABEL_SESSION: session.pk}):
        _remove_quietly(orphan.id)
    spec = session.spec
    if image is None:
        image = ensure_setup_image(backend, spec, labels=config.extra_labels())
    sid = backend.create(session.pk, image, network=spec.get("network") or "none",
                         limits=spec.get("limits") or None,
                         labels={**config.extra_labels(), LABEL_SESSION: session.pk})
    # Journaled before it starts: a crash now leaves a sandbox a later resume removes.
    sbjournal.append(session.pk, "session.sandbox", {
        "sandbox_id": sid, "backend": backend.name, "host": backend.host, "image": image,
        "command": cmd.pk}, holder=holder, sandbox_id=sid, sandbox_host=backend.host)
    backend.start(sid)
    return sid


def do_create(session, cmd, args, holder) -> Ending:
    if session.sandbox_id:  # a crash after session.sandbox: that sandbox is the one
        _remove_quietly(session.sandbox_id)
    sid = _new_sandbox(session, None, cmd, holder)
    return Ending(CommandState.DONE, {"sandbox_id": sid}, "session.ready", {"sandbox_id": sid},
                  {"status": S.READY, "status_reason": ""})


def _remove_quietly(sandbox_id: str) -> None:
    try:
        get_backend().remove(sandbox_id)
    except SandboxError as exc:
        log.warning("sandbox %s: could not remove: %s", sandbox_id, exc)


def do_resume(session, cmd, args, holder) -> Ending:
    """A new sandbox from the newest snapshot (or the image), then the recorded
    execs after it, in order; the old sandbox is removed first."""
    plan = sbjournal.plan_of(session.pk)
    old = session.sandbox_id
    if old:
        _remove_quietly(old)
    snapshot = plan.snapshot
    sbjournal.append(session.pk, "session.resuming", {
        "snapshot": snapshot and snapshot["name"], "old_sandbox_id": old or None,
        "replay": len(plan.execs), "not_replayed": plan.not_replayed, "command": cmd.pk},
        holder=holder, sandbox_id="", status_reason="resuming")
    sid = _new_sandbox(session, snapshot["ref"] if snapshot else None, cmd, holder)
    base = {"sandbox_id": sid, "old_sandbox_id": old or None,
            "snapshot": snapshot and snapshot["name"], "not_replayed": plan.not_replayed}
    replayed = []
    for index, rec in enumerate(plan.execs):
        code = _replay_one(sid, rec)
        replayed.append({"of_seq": rec["seq"], "argv": rec["argv"], "exit_code": code,
                         "recorded_exit_code": rec["exit_code"]})
        if code != rec["exit_code"]:
            return _diverged(base, replayed, index, rec, code, len(plan.execs) - index - 1)
        sbjournal.append(session.pk, "exec.replayed", {**replayed[-1], "cwd": rec["cwd"],
                                                       "command": cmd.pk}, holder=holder)
    result = {**base, "replayed": replayed}
    return Ending(CommandState.DONE, result, "session.resumed",
                  {"sandbox_id": sid, "replayed": len(replayed),
                   "not_replayed": plan.not_replayed}, {"status": S.READY, "status_reason": ""})


def _replay_one(sid: str, rec: dict) -> int | None:
    try:
        return get_backend().exec(sid, wrapped(rec["argv"], rec["cwd"]),
                                  timeout=rec.get("timeout") or 600).exit_code
    except ExecTimeout:
        return None


def _diverged(base: dict, replayed: list, index: int, rec: dict, code, dropped: int) -> Ending:
    what = {"of_seq": rec["seq"], "index": index, "argv": rec["argv"],
            "recorded_exit_code": rec["exit_code"], "exit_code": code, "dropped": dropped}
    message = (f"replay diverged at exec {index + 1} (seq {rec['seq']}, {rec['argv'][:3]}): "
               f"it exited {code}, recorded {rec['exit_code']}; {dropped} later exec(s) "
               "not replayed")
    result = {**base, "replayed": replayed, "code": "replay.diverged", "message": message,
              "diverged": what}
    return Ending(CommandState.FAILED, result, "session.replay_diverged", what,
                  {"status": S.READY, "status_reason": message[:500]})


# --- exec ------------------------------------------------------------------------------------


def wrapped(argv: list[str], cwd: str | None) -> list[str]:
    return argv if not cwd else ["sh", "-c", CWD_SHIM, "sh", cwd, *argv]


def text_of(raw: bytes) -> tuple[str, int]:
    """Sandbox output as storable text (its last OUTPUT_MAX bytes) and how many bytes were cut."""
    cut = max(0, len(raw) - OUTPUT_MAX)
    return raw[cut:].decode("utf-8", "replace").replace("\x00", "\ufffd"), cut


def _lost(session, reason: str) -> Ending:
    return failed("sandbox.lost", f"The sandbox of {session.pk} is {reason}: resume the session "
                  "(POST /api/sandboxes/{id}/resume).", fact="session.lost",
                  sandbox_id=session.sandbox_id or None, reason=reason)


def _not_ready(session) -> Ending | None:
    if session.status == S.LOST:
        return _lost(session, "lost")
    if session.status != S.READY or not session.sandbox_id:
        return failed("sandbox.not_ready", f"Sandbox session {session.pk} is {session.status}.")
    state = get_backend().status(session.sandbox_id)
    if state is SandboxStatus.UNKNOWN:
        raise SandboxError("the engine does not answer", permanent=False)
    if state is not SandboxStatus.RUNNING:
        ending = _lost(session, str(state))
        ending.changes = {"status": S.LOST, "status_reason": f"sandbox {state}"}
        return ending
    return None


def do_exec(session, cmd, args, holder) -> Ending:
    argv, cwd, timeout = args["argv"], args.get("cwd"), args.get("timeout") or 60
    rec = {"argv": argv, "cwd": cwd, "timeout": timeout}
    started = SandboxSessionEvent.objects.filter(session_id=session.pk, type="exec.started",
                                                 data__command=cmd.pk).exists()
    if started:
        return failed("exec.interrupted", "The control plane stopped while this exec ran; its "
                      "outcome was not recorded, so it is not replayed.", "exec.interrupted", **rec)
    refused = _not_ready(session)
    if refused is not None:
        return refused
    sbjournal.append(session.pk, "exec.started", {**rec, "command": cmd.pk}, holder=holder)
    t0 = time.monotonic()
    chunks = Chunks(session.pk, cmd.pk, holder)
    try:
        res = get_backend().exec(session.sandbox_id, wrapped(argv, cwd), timeout=timeout,
                                 on_output=chunks.add)
    except ExecTimeout:
        return failed("exec.timeout", f"The exec ran past its timeout of {timeout} s; it is not "
                      "replayed.", "exec.timed_out", **rec)
    except (SandboxNotFound, SandboxNotRunning):
        ending = _lost(session, "gone")
        ending.changes = {"status": S.LOST, "status_reason": "sandbox gone"}
        return ending
    chunks.flush()
    stdout, out_cut = text_of(res.stdout)
    stderr, err_cut = text_of(res.stderr)
    ms = int((time.monotonic() - t0) * 1000)
    outcome = {**rec, "exit_code": res.exit_code, "duration_ms": ms,
               "stdout": stdout, "stderr": stderr,
               "truncated": {"stdout": out_cut, "stderr": err_cut}}
    return Ending(CommandState.DONE, outcome, "exec.finished", outcome)


class Chunks:
    """Output journaled while an exec runs (``exec.output {command, stream,
    text}``), coalesced: output arriving CHUNK_S after the last fact goes out at
    once, a burst within CHUNK_S waits for CHUNK_BYTES or its next output (or
    the end). The first OUTPUT_MAX bytes a stream; exec.finished keeps the last."""

    def __init__(self, session_id: str, command_id: int, holder: str):
        self.session_id, self.command_id, self.holder = session_id, command_id, holder
        self.decoders = {s: codecs.getincrementaldecoder("utf-8")("replace")
                         for s in ("stdout", "stderr")}
        self.pending = {"stdout": "", "stderr": ""}
        self.taken = {"stdout": 0, "stderr": 0}
        self.last = time.monotonic() - CHUNK_S  # the first output goes out at once

    def add(self, stream: str, chunk: bytes) -> None:
        room = OUTPUT_MAX - self.taken[stream]
        if room <= 0:
            return
        self.taken[stream] += min(room, len(chunk))
        self.pending[stream] += self.decoders[stream].decode(chunk[:room])
        size = sum(len(t) for t in self.pending.values())
        if size >= CHUNK_BYTES or time.monotonic() - self.last >= CHUNK_S:
            self.flush()

    def flush(self) -> None:
        self.last = time.monotonic()
        for stream, text in self.pending.items():
            if text:
                sbjournal.append(self.session_id, "exec.output", {
                    "command": self.command_id, "stream": stream,
                    "text": text.replace("\x00", "\ufffd")}, holder=self.holder)
        self.pending = {"stdout": "", "stderr": ""}


# --- checkpoint / remove --------------------------------------------------------------------


def do_checkpoint(session, cmd, args, holder) -> Ending:
    refused = _not_ready(session)
    if refused is not None:
        return refused
    backend = get_backend()
    name = args["name"]
    t0 = time.monotonic()
    tag = backend.snapshot_ref("session", f"{session.pk}-{name}")
    ref = backend.commit(session.sandbox_id, tag, labels={**config.extra_labels(),
                                                          LABEL_SESSION: session.pk})
    data = {"name": name, "ref": ref, "ms": int((time.monotonic() - t0) * 1000)}
    return Ending(CommandState.DONE, {"name": name, "ms": data["ms"]}, "snapshot.taken", data)


def do_remove(session, cmd, args, holder) -> Ending:
    backend = get_backend()
    if session.sandbox_id:
        backend.remove(session.sandbox_id)
    for snap in sbjournal.snapshots(session.pk):
        try:
            backend.remove_image(snap["ref"])
        except SandboxError as exc:
            log.warning("session %s: could not remove snapshot %s: %s", session.pk, snap["ref"],
                        exc)
    return Ending(CommandState.DONE, {"removed": True}, "session.removed", {},
                  {"status": S.REMOVED, "status_reason": "", "sandbox_id": "",
                   "sandbox_slot": False})


VERBS = {"create": do_create, "exec": do_exec, "checkpoint": do_checkpoint,
         "resume": do_resume, "remove": do_remove}

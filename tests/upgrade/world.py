"""What the upgrade test (tests/upgrade/test_upgrade_in_place.py) needs around
it: Docker and the base image of both codes, the API as a client sees it,
reading transcripts from the SQLite file, and removing sandboxes by hand."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from tests.live import PYTHON, ROOT, LiveServer

RUN_ID = uuid.uuid4().hex[:10]
LABEL = f"alineo.test={RUN_ID}"
WAIT = 90.0  # an upper bound for anything awaited; never an assertion on speed
SLEEP_S = 20  # the mid-turn step: long enough to outlast the switch of servers


# --- what the docker case needs --------------------------------------------------------------


def cannot_run(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {reason}: CI must run the upgrade test on docker "
                    "(.ci/docker-up starts an engine)", pytrace=False)
    pytest.skip(f"!!! UPGRADE IN PLACE NOT TESTED ON DOCKER: {reason} !!!")


def require_docker(previous_main: Path) -> None:
    """An engine that answers, and the base image of BOTH codes (the same tag
    today; if the redesign changes its inputs, each code builds its own)."""
    import docker

    try:
        client = docker.from_env()
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001
        cannot_run(f"no Docker engine answers ({exc}); as root, run .ci/docker-up")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    for root in (previous_main, ROOT):
        scratch = Path(env.get("ALINEO_DATA_DIR") or "/tmp") / f"image-{uuid.uuid4().hex[:6]}"
        try:
            built = subprocess.run([PYTHON, "manage.py", "build_base_image"], cwd=root,
                                   env={**env, "ALINEO_DATA_DIR": str(scratch)},
                                   capture_output=True, text=True, timeout=900)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if built.returncode != 0:
            cannot_run(f"the base image of {root} cannot be built: {built.stderr[-2000:]}")


# --- the API, as a client sees it ------------------------------------------------------------


class Api:
    """The JSON API of whichever server is up (`server` is swapped at the upgrade)."""

    def __init__(self, server: LiveServer, actor):
        self.server, self.actor = server, actor
        self.http = httpx.Client(timeout=30)

    def post(self, path: str, body: dict, status: int) -> dict:
        headers = {**self.actor.auth, "Idempotency-Key": uuid.uuid4().hex}
        r = self.http.post(f"{self.server.url}{path}", json=body, headers=headers)
        assert r.status_code == status, f"POST {path} → {r.status_code} {r.text}"
        return r.json()

    def get(self, path: str) -> dict:
        r = self.http.get(f"{self.server.url}{path}", headers=self.actor.auth)
        assert r.status_code == 200, f"GET {path} → {r.status_code} {r.text}"
        return r.json()

    def spawn(self, spec: dict, prompt: str) -> str:
        return self.post("/api/agents", {"spec": spec, "prompt": prompt}, 201)["id"]

    def prompt(self, agent: str, text: str) -> None:
        self.post(f"/api/agents/{agent}/prompt", {"text": text}, 202)

    def events(self, agent: str) -> list[dict]:
        out, after = [], 0
        while True:
            page = self.get(f"/api/agents/{agent}/events?after={after}&limit=500")
            out.extend(page["events"])
            if not page.get("has_more"):
                return out
            after = page["next_after"]

    def wait_for(self, agent: str, predicate, what: str, timeout: float = WAIT) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            events = self.events(agent)
            if predicate(events):
                return events
            if time.monotonic() > deadline:
                tail = [f"{e['seq']}:{e['type']}" for e in events[-30:]]
                raise AssertionError(f"timed out ({timeout:g} s) waiting for {what} of {agent}; "
                                     f"transcript tail: {tail}\nserver log:\n"
                                     f"{self.server.log()[-4000:]}")
            time.sleep(0.2)

    def close(self) -> None:
        self.http.close()


def of(events: list[dict], etype: str) -> list[dict]:
    return [e for e in events if e["type"] == etype]


def after(events: list[dict], seq: int) -> list[dict]:
    return [e for e in events if e["seq"] > seq]


def rungs(events: list[dict]) -> list[tuple[str, str]]:
    """(rung, reason) of every ladder fact; agent.lost counts as rung `lost`."""
    return [(e["data"].get("rung", "lost") if e["type"] == "agent.restored" else "lost",
             e["data"].get("reason", "")) for e in events
            if e["type"] in ("agent.restored", "agent.lost")]


def idle_after_checkpoint(checkpoint: bool):
    """A turn finished, none running, and (with checkpoints) that turn's checkpoint taken."""
    def done(events):
        finished = of(events, "turn.finished")
        if not finished or len(of(events, "turn.started")) != len(finished):
            return False
        turn = finished[-1]["data"]["turn"]
        return not checkpoint or any(e["data"].get("turn") == turn
                                     for e in of(events, "agent.checkpointed"))
    return done


def running_sleep(events: list[dict]) -> bool:
    """The `sleep:` step was dispatched and has no result yet."""
    calls = {e["data"]["tool_call_id"] for e in of(events, "tool.dispatched")
             if f"sleep {SLEEP_S}" in json.dumps(e["data"].get("input"))}
    return bool(calls - {e["data"]["tool_call_id"] for e in of(events, "tool.result")})


def settled(turn: int):
    def ends(events):
        return [e for e in events if e["type"] in ("turn.finished", "turn.interrupted")
                and e["data"].get("turn") == turn]
    return ends


def answered_after(seq: int):
    """A turn started after `seq` has finished."""
    def done(events):
        started = {e["data"]["turn"] for e in after(events, seq) if e["type"] == "turn.started"}
        return any(e["data"]["turn"] in started for e in of(after(events, seq), "turn.finished"))
    return done


# --- the data dir, read directly -------------------------------------------------------------


def event_rows(data_dir: Path) -> dict[tuple[str, int], tuple[str, str, str]]:
    """Every transcript row in the SQLite file: (agent, seq) → (type, data, ts) as stored."""
    conn = sqlite3.connect(f"file:{data_dir / 'alineo.sqlite3'}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute(
            "SELECT agent_id, seq, type, data, ts FROM agent_sessions_event").fetchall()
    finally:
        conn.close()
    return {(a, int(s)): (t, d, str(ts)) for a, s, t, d, ts in rows}


def as_api(row: tuple[str, str, str], seq: int) -> dict:
    """A stored row as the API shows an event (BRIEF §5.2: ts in ISO 8601 UTC, µs, Z)."""
    etype, data, ts = row
    when = datetime.fromisoformat(ts)  # Django keeps naive UTC in SQLite
    if when.tzinfo is not None:
        when = when.astimezone(timezone.utc)
    return {"seq": seq, "type": etype, "ts": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "data": json.loads(data)}


def remove_sandbox(kind: str, data_dir: Path, sandbox_id: str) -> None:
    """`docker rm -f`; local: what the local backend's remove does (the dir is
    renamed away first, so the sandbox is missing before its bridge dies; then
    its process group is killed and the dir deleted)."""
    if kind == "docker":
        import docker

        client = docker.from_env()
        try:
            client.api.remove_container(sandbox_id, force=True, v=True)
        finally:
            client.close()
        return
    path = data_dir / "sandboxes" / sandbox_id
    pid = _sandbox_pid(path)
    trash = path.with_name(f".rm-{sandbox_id}-{uuid.uuid4().hex[:6]}")
    os.rename(path, trash)
    if pid is not None:
        _killpg(pid)
    shutil.rmtree(trash, ignore_errors=True)


def _sandbox_pid(path: Path) -> int | None:
    """The local sandbox's process-group leader, if it is still the process
    our server started (its recorded start time matches the kernel's)."""
    try:
        info = json.loads((path / "pid").read_text())
        stat = Path(f"/proc/{int(info['pid'])}/stat").read_text()
    except (OSError, ValueError, KeyError):
        return None
    starttime = int(stat[stat.rindex(")") + 2:].split()[19])
    if info.get("starttime") not in (None, starttime):
        return None  # the pid was reused by a process that is not ours
    return int(info["pid"])


def _killpg(pid: int) -> None:
    """The previous code's sandbox: a process group led by pid. Today's: pid is
    the init of a bubblewrap PID namespace, and everything in it dies with it."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def cleanup_sandboxes(kind: str, data_dir: Path) -> None:
    """Remove every sandbox our servers made: containers by this run's label,
    local process groups by the pid files under this data dir."""
    if kind == "docker":
        import docker

        try:
            client = docker.from_env()
            try:
                for c in client.api.containers(all=True, filters={"label": LABEL}):
                    client.api.remove_container(c["Id"], force=True, v=True)
            finally:
                client.close()
        except Exception:  # noqa: BLE001 - the engine is gone: nothing of ours runs there
            pass
        return
    root = data_dir / "sandboxes"
    for path in (root.iterdir() if root.is_dir() else ()):
        pid = _sandbox_pid(path)
        if pid is not None:
            _killpg(pid)


# --- the test --------------------------------------------------------------------------------

"""The live "world" the integration suites share: a real server (manage.py
serve) on one sandbox backend, an actor with a token, and helpers that drive
agents through the JSON API only. The `world` fixture (tests/integration/
conftest.py) runs each module that asks for it on BOTH backends.

Docker needs an engine: under CI a missing engine FAILS, elsewhere the docker
half is skipped loudly. Every sandbox a server creates is labelled
alineo.test=<run id> and removed at the end, containers and local process
groups alike.
"""

from __future__ import annotations

import os
import time
import uuid

import httpx
import pytest

from sandboxes.backends import docker_engine_answers
from tests.bseqs import bseq_trouble
from tests.live import LiveServer

RUN_ID = uuid.uuid4().hex[:10]
LABEL = f"alineo.test={RUN_ID}"
WAIT = 90.0  # an upper bound for anything awaited; never an assertion on speed
DEMO = {"model": "demo"}


def _no_docker(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {reason}: CI must exercise the docker backend "
                    "(.ci/docker-up starts an engine)", pytrace=False)
    pytest.skip(f"!!! DOCKER BACKEND NOT TESTED: {reason}. As root, run .ci/docker-up "
                "to install and start an engine !!!")


def ensure_docker():
    if not docker_engine_answers():
        _no_docker("no Docker engine answers")
    from sandboxes import images

    try:
        images.ensure_base_image()
    except Exception as exc:  # noqa: BLE001
        _no_docker(f"the base image cannot be built ({exc})")


def cleanup_sandboxes(server: LiveServer, kind: str) -> None:
    if kind == "docker":
        if not docker_engine_answers():
            return
        import docker

        client = docker.from_env()
        try:
            for c in client.api.containers(all=True, filters={"label": LABEL}):
                client.api.remove_container(c["Id"], force=True, v=True)
            remove_tree_volumes_under(client, [str(server.data_dir)])
        finally:
            client.close()
    else:
        from sandboxes.backends.local import LocalBackend

        backend = LocalBackend(root=server.data_dir / "sandboxes")
        for handle in backend.list():
            backend.remove(handle.id)


def remove_tree_volumes_under(client, roots: list[str]) -> None:
    """The volumes of homes laid over trees (sandboxes/backends/docker_trees.py)
    whose layers lie under ``roots``: a container removed with ``v=True``
    leaves its named volume to the server's sweep, which stopped with it."""
    for v in client.api.volumes(filters={"label": "alineo.managed=1"})["Volumes"] or []:
        upper = (v.get("Options") or {}).get("o", "").partition("upperdir=")[2].split(",")[0]
        if upper and any(upper.startswith(r.rstrip("/") + "/") for r in roots):
            try:
                client.api.remove_volume(v["Name"], force=True)
            except Exception:  # noqa: BLE001 - still in use: its container goes first
                pass


def start_server(kind: str, env: dict[str, str] | None = None) -> LiveServer:
    if kind == "docker":
        ensure_docker()
    return LiveServer(env={"ALINEO_SANDBOX": kind, "ALINEO_SANDBOX_LABELS": LABEL, **(env or {})})


class World:
    def __init__(self, server: LiveServer, actor, kind: str):
        self.server, self.actor, self.kind = server, actor, kind

    @property
    def url(self) -> str:
        return self.server.url

    def post(self, path: str, body: dict) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, headers=self.actor.auth, timeout=30)

    def get(self, path: str) -> dict:
        r = httpx.get(f"{self.url}{path}", headers=self.actor.auth, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def spawn(self, spec: dict, prompt: str | None = None) -> str:
        body = {"spec": spec, **({"prompt": prompt} if prompt is not None else {})}
        r = self.post("/api/agents", body)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def send(self, agent_id: str, verb: str, text: str | None = None) -> dict:
        r = self.post(f"/api/agents/{agent_id}/{verb}", {"text": text} if text is not None else {})
        assert r.status_code == 202, r.text
        return r.json()

    def events(self, agent_id: str) -> list[dict]:
        out, after = [], 0
        while True:
            page = self.get(f"/api/agents/{agent_id}/events?after={after}&limit=500")["events"]
            out.extend(page)
            if len(page) < 500:
                return out
            after = page[-1]["seq"]

    def wait_for(self, agent_id: str, predicate, what: str, timeout: float = WAIT) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            events = self.events(agent_id)
            if predicate(events):
                return events
            if time.monotonic() > deadline:
                types = [e["type"] for e in events]
                raise AssertionError(f"timed out waiting for {what}; transcript: {types}\n"
                                     f"server log:\n{self.server.log()[-4000:]}")
            time.sleep(0.2)

    def wait_turns(self, agent_id: str, n: int, timeout: float = WAIT) -> list[dict]:
        return self.wait_for(agent_id, lambda evs: count_of(evs, "turn.finished") >= n,
                             f"{n} finished turn(s)", timeout)


def db_value(w: World, sql: str, params: list):
    """One value read straight from the server's SQLite file (read-only), or None."""
    import sqlite3

    conn = sqlite3.connect(f"file:{w.server.data_dir / 'alineo.sqlite3'}?mode=ro", uri=True,
                           timeout=30)
    try:
        row = conn.execute(sql, params).fetchone()
    finally:
        conn.close()
    return row[0] if row else None


def command_state(w: World, command: int) -> str | None:
    return db_value(w, "SELECT state FROM agent_sessions_command WHERE id = ?", [command])


def wait_looked_at(w: World, agent_id: str, times: int = 2, timeout: float = WAIT) -> None:
    """Until the worker has taken up `agent_id` again `times` times from now
    (its lease re-claimed: a supervisor scan, which also runs the watcher, or
    a wake-up) — the event a negative proof waits for instead of a sleep."""
    sql = "SELECT expires_at FROM agent_sessions_agentlease WHERE agent_id = ?"
    seen, last = 0, db_value(w, sql, [agent_id])
    deadline = time.monotonic() + timeout
    while seen < times:
        assert time.monotonic() < deadline, f"the worker did not look at {agent_id} again"
        time.sleep(0.1)
        now = db_value(w, sql, [agent_id])
        if now != last:
            seen, last = seen + 1, now


def remove_sandbox(w: World, sid: str) -> None:
    """`docker rm -f`, or the local backend's remove (kills its process group)."""
    if w.kind == "docker":
        import docker

        client = docker.from_env()
        try:
            client.api.remove_container(sid, force=True, v=True)
        finally:
            client.close()
    else:
        from sandboxes.backends.local import LocalBackend

        LocalBackend(root=w.server.data_dir / "sandboxes").remove(sid)


def exec_behind(w: World, sid: str, argv: list[str]) -> str:
    """Run ``argv`` in sandbox ``sid`` through its backend, behind the control
    plane's back (nothing journaled, nothing a resume would replay); its stdout."""
    if w.kind == "docker":
        import docker

        client = docker.from_env()
        try:
            code, out = client.containers.get(sid).exec_run(argv)
        finally:
            client.close()
        assert code == 0, f"{argv} in {sid[:12]}: exit {code}: {out!r}"
        return out.decode()
    from sandboxes.backends.local import LocalBackend

    out = LocalBackend(root=w.server.data_dir / "sandboxes").exec(sid, argv, timeout=30)
    assert out.ok, f"{argv} in {sid}: {out}"
    return out.text


def count_of(events, etype: str) -> int:
    return sum(1 for e in events if e["type"] == etype)


def events_of(events, etype: str) -> list[dict]:
    return [e for e in events if e["type"] == etype]


def assert_sound(events: list[dict]) -> None:
    """seq 1, 2, 3 … with no gap and no repeat; each bridge event (bseq) once,
    in order, with no gap (tests/bseqs.py); nothing our own bridge sent refused
    (sessions/worker/admission.py)."""
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    refused = [e for e in events if e["type"] in ("bridge.refused", "bridge.event_refused")]
    assert not refused, f"the bridge's own events were refused: {refused}"
    trouble = bseq_trouble(events)
    assert not trouble, trouble



"""What every fault scenario shares: a real server (tests.live.LiveServer) on
one backend, an actor, and a client that talks to it only through the JSON API.

Every POST carries an Idempotency-Key and is retried with the same key until
it is answered (the server may be dead or booting: that is the point), so a
command is acknowledged exactly when a 2xx comes back; those acknowledgements
are recorded for the invariant checker (tests.faults.invariants).

Skip rules (the pattern of tests/integration/test_worker.py): a scenario that
needs Docker, root or a loop device FAILS under CI=true and is skipped loudly
elsewhere. Every sandbox a scenario's server makes is labelled
``alineo.test=<run id>`` and removed at the end (containers and local process
groups alike).
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.live import LiveServer

RUN_ID = uuid.uuid4().hex[:10]
LABEL = f"alineo.test={RUN_ID}"
WAIT = 90.0  # an upper bound for anything awaited; never an assertion on speed
DEMO = {"model": "demo"}


# --- skip rules ------------------------------------------------------------------------------


def cannot_run(reason: str):
    """A prerequisite is missing: FAIL under CI, skip loudly elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {reason}: CI must run the fault-injection suite in full "
                    "(as root, with .ci/docker-up's engine)", pytrace=False)
    pytest.skip(f"!!! FAULT SCENARIO NOT TESTED: {reason} !!!")


def ensure_docker() -> None:
    from sandboxes.backends import docker_engine_answers

    if not docker_engine_answers():
        cannot_run("no Docker engine answers (as root, run .ci/docker-up)")
    from sandboxes import images

    try:
        images.ensure_base_image()
    except Exception as exc:  # noqa: BLE001
        cannot_run(f"the sandbox base image cannot be built ({exc})")


def ensure_root() -> None:
    if os.geteuid() != 0:
        cannot_run("this scenario needs root (loop mounts, a second dockerd)")


# --- the world: one server, one actor -----------------------------------------------------------


@dataclass
class Ack:
    """A command the server acknowledged (2xx): it must be acted on exactly once."""
    agent: str
    verb: str
    command: int
    key: str
    text: str | None = None


@dataclass
class World:
    server: LiveServer
    kind: str
    actor: object = None
    acks: list[Ack] = field(default_factory=list)
    _client: httpx.Client | None = None

    @property
    def http(self) -> httpx.Client:
        """One keep-alive client (a fresh connection per request costs ~80 ms here)."""
        if self._client is None:
            self._client = httpx.Client(timeout=30)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def url(self) -> str:
        return self.server.url

    # --- requests that survive a dead or booting server -----------------------------------
    def post(self, path: str, body: dict, *, key: str | None = None, timeout: float = WAIT,
             accept=(200, 201, 202)) -> httpx.Response:
        """POST with an Idempotency-Key, retried with the same key until the
        server answers something other than 503 (or `timeout` runs out)."""
        key = key or uuid.uuid4().hex
        headers = {**self.actor.auth, "Idempotency-Key": key}
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = self.http.post(f"{self.url}{path}", json=body, headers=headers)
                if r.status_code != 503:
                    r.key = key  # type: ignore[attr-defined]
                    if accept and r.status_code not in accept:
                        raise AssertionError(f"POST {path} → {r.status_code} {r.text}")
                    return r
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"POST {path} was never answered within {timeout} s\n"
                                     f"{self.server.log()[-3000:]}")
            time.sleep(0.2)

    def get(self, path: str, timeout: float = WAIT) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = self.http.get(f"{self.url}{path}", headers=self.actor.auth)
                if r.status_code == 200:
                    return r.json()
                if r.status_code != 503:
                    raise AssertionError(f"GET {path} → {r.status_code} {r.text}")
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"GET {path} was never answered within {timeout} s")
            time.sleep(0.2)

    def spawn(self, spec: dict, prompt: str | None = None, *, key: str | None = None) -> str:
        body = {"spec": spec, **({"prompt": prompt} if prompt is not None else {})}
        r = self.post("/api/agents", body, key=key, accept=(201,))
        data = r.json()
        self.acks.append(Ack(data["id"], "spawn", int(data["command"]), r.key))
        if prompt is not None:
            # The first prompt is its own command (the next id); find it in the transcript.
            for e in self.events(data["id"]):
                if e["type"] == "command.prompt":
                    self.acks.append(Ack(data["id"], "prompt", int(e["data"]["command"]), r.key,
                                         prompt))
                    break
        return data["id"]

    def send(self, agent: str, verb: str, text: str | None = None, *, key: str | None = None,
             timeout: float = WAIT) -> Ack:
        r = self.post(f"/api/agents/{agent}/{verb}", {"text": text} if text is not None else {},
                      key=key, accept=(202,), timeout=timeout)
        ack = Ack(agent, verb, int(r.json()["command"]), r.key, text)
        self.acks.append(ack)
        return ack

    def events(self, agent: str) -> list[dict]:
        out, after = [], 0
        while True:
            page = self.get(f"/api/agents/{agent}/events?after={after}&limit=1000")
            out.extend(page["events"])
            if not page.get("has_more"):
                return out
            after = page["next_after"]

    def agent(self, agent: str) -> dict:
        return self.get(f"/api/agents/{agent}")

    def agents(self) -> list[dict]:
        out, after = [], ""
        while True:
            page = self.get("/api/agents?limit=1000" + (f"&after={after}" if after else ""))
            out.extend(page["agents"])
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
                types = [f"{e['seq']}:{e['type']}" for e in events[-40:]]
                raise AssertionError(f"timed out waiting for {what}; transcript tail: {types}\n"
                                     f"server log:\n{self.server.log()[-4000:]}")
            time.sleep(0.2)

    # --- the server's database, read-only, from this process ------------------------------
    def _rows(self, sql: str, params: list) -> list[tuple]:
        """Rows read straight from the server's database (read-only): its SQLite
        file, or its PostgreSQL database (a server started with DATABASE_URL)."""
        url = self.server.extra_env.get("DATABASE_URL")
        if url:
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                return conn.execute(sql.replace("?", "%s"), params).fetchall()
        db = self.server.data_dir / "alineo.sqlite3"
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute(sql, params).fetchall()
        finally:
            conn.close()

    def command_states(self, ids: list[int]) -> dict[int, str]:
        """Command rows' states."""
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self._rows(f"SELECT id, state FROM agent_sessions_command WHERE id IN ({marks})",
                          list(ids))
        return {int(i): s for i, s in rows}

    def pending_commands(self, agent: str) -> list[int]:
        rows = self._rows("SELECT id FROM agent_sessions_command WHERE agent_id = ? AND "
                          "state = 'pending' ORDER BY id", [agent])
        return [int(r[0]) for r in rows]

    def rungs_of(self, agents: list[str]) -> list[str]:
        return [e["data"].get("rung", "?") for a in agents for e in self.events(a)
                if e["type"] == "agent.restored"]


def make_server(kind: str, env: dict | None = None, data_dir: Path | None = None) -> LiveServer:
    if kind == "docker":
        ensure_docker()
    server = LiveServer(env={"ALINEO_SANDBOX": kind, "ALINEO_SANDBOX_LABELS": LABEL, **(env or {})},
                        data_dir=data_dir)
    # Where tests.faults.placed holds an agent's commands undelivered (a file per agent).
    server.extra_env.setdefault("ALINEO_TEST_HOLD_DIR", str(server.data_dir / "hold"))
    return server


def cleanup_sandboxes(server: LiveServer, kind: str, docker_host: str | None = None) -> None:
    """Remove every sandbox this run's servers labelled (by label, never by name)."""
    if kind == "docker":
        import docker

        try:
            client = docker.DockerClient(base_url=docker_host) if docker_host else docker.from_env()
            try:
                for c in client.api.containers(all=True, filters={"label": LABEL}):
                    client.api.remove_container(c["Id"], force=True, v=True)
            finally:
                client.close()
        except Exception:  # noqa: BLE001 - the engine is gone: nothing of ours runs there
            pass
    else:
        from sandboxes.backends.local import LocalBackend

        root = server.data_dir / "sandboxes"
        if root.is_dir():
            backend = LocalBackend(root=root)
            for handle in backend.list():
                backend.remove(handle.id)


def count(events, etype: str) -> int:
    return sum(1 for e in events if e["type"] == etype)


def of(events, etype: str) -> list[dict]:
    return [e for e in events if e["type"] == etype]


def sandbox_pid_local(server: LiveServer, sandbox_id: str) -> int:
    import json

    info = json.loads((server.data_dir / "sandboxes" / sandbox_id / "pid").read_text())
    return int(info.get("command") or info["pid"])  # bubblewrap: the bridge, not the init


# --- the summary table (tests/faults/conftest.py prints it) --------------------------------------


@dataclass
class Row:
    scenario: str
    iterations: int = 0
    rungs: Counter = field(default_factory=lambda: Counter())
    violations: list = field(default_factory=list)
    seconds: float = 0.0
    outcome: str = "?"
    seed: object = None
    placements: Counter = field(default_factory=lambda: Counter())  # where the kills landed

    def add_rungs(self, rungs) -> None:
        self.rungs.update(rungs)


REPORT: list[Row] = []


def excerpt(world, agent: str, around: int | None = None, width: int = 8) -> str:
    """A few transcript lines (around seq `around`, else the tail) for a bug report."""
    import json

    events = world.events(agent)
    if around is None:
        chosen = events[-2 * width:]
    else:
        chosen = [e for e in events if abs(e["seq"] - around) <= width]
    return "\n".join(f"  {agent} {e['seq']:>5} {e['type']:<22} {json.dumps(e['data'])[:220]}"
                     for e in chosen)


# --- faults ----------------------------------------------------------------------------------------

_FIND_BRIDGE = (
    "import os\n"
    "for p in os.listdir('/proc'):\n"
    "    if p.isdigit() and int(p) != os.getpid():\n"
    "        try:\n"
    "            argv = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
    "        except OSError:\n"
    "            continue\n"
    "        if os.path.basename(argv[0]).startswith(b'python') and b'-m' in argv \\\n"
    "                and b'bridge' in argv:\n"
    "            print(p)\n"
)


def docker_client(docker_host: str | None = None):
    import docker

    return docker.DockerClient(base_url=docker_host) if docker_host else docker.from_env()


def kill_bridge(world: World, agent: str, docker_host: str | None = None) -> int:
    """SIGKILL the bridge process inside the agent's live sandbox; its pid.
    local: the sandbox's recorded pid (the bridge is the sandbox's command);
    docker: found through /proc inside the container (the image has no ps),
    then `kill -9` there (under docker-init the container may exit with it)."""
    import signal

    sid = world.agent(agent)["sandbox_id"]
    assert sid, f"{agent} has no sandbox"
    if world.kind == "local":
        pid = sandbox_pid_local(world.server, sid)
        os.kill(pid, signal.SIGKILL)
        return pid
    client = docker_client(docker_host)
    try:
        c = client.containers.get(sid)
        code, out = c.exec_run(["python3", "-c", _FIND_BRIDGE])
        pids = [int(x) for x in out.decode().split()]
        assert code == 0 and len(pids) == 1, f"bridge pid in {sid[:12]}: {code} {out!r}"
        code, out = c.exec_run(["sh", "-c", f"kill -9 {pids[0]}"])  # the shell's own kill
        if code != 0:  # under docker-init the container may go down with its bridge, and
            # take the exec's shell along before it could say it succeeded; the
            # engine may still say "running" for a moment after.
            assert _bridge_gone(c, pids[0]), f"kill -9 {pids[0]} in {sid[:12]}: {code} {out!r}"
        return pids[0]
    finally:
        client.close()


def _bridge_gone(container, pid: int, limit_s: float = 20.0) -> bool:
    """The container stopped, or ``pid`` is no longer in it (a bounded poll)."""
    import docker

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            container.reload()
            if container.status != "running":
                return True
            code, _ = container.exec_run(["test", "-d", f"/proc/{pid}"])
            if code == 1:
                return True
        except docker.errors.APIError:  # stopping or gone under us: it is down
            return True
        time.sleep(0.2)
    return False


def remove_sandbox(world: World, agent: str) -> str:
    """`docker rm -f` of the agent's container (local: the backend's remove,
    which kills its process group and deletes its directory); the old id."""
    sid = world.agent(agent)["sandbox_id"]
    assert sid, f"{agent} has no sandbox"
    if world.kind == "local":
        from sandboxes.backends.local import LocalBackend

        LocalBackend(root=world.server.data_dir / "sandboxes").remove(sid)
    else:
        client = docker_client()
        try:
            client.api.remove_container(sid, force=True, v=True)
        finally:
            client.close()
    return sid


def wait_running_step(world: World, agent: str, marker: str, timeout: float = WAIT) -> list[dict]:
    """Wait until a bash call whose command holds `marker` was dispatched and has no result yet."""
    def running(events):
        ids = {e["data"]["tool_call_id"] for e in events if e["type"] == "tool.dispatched"
               and marker in str(e["data"].get("input"))}
        done = {e["data"]["tool_call_id"] for e in events if e["type"] == "tool.result"}
        return bool(ids - done)
    return world.wait_for(agent, running, f"a running step with {marker!r}", timeout)


def mid_turn_repeats(default: int) -> int:
    """How many repetitions a scenario runs (fault_cases: mid-turn faults after
    its idle one; tests.faults.placed: rounds):
    `default` (what `make test`'s budget allows), or ALINEO_FAULT_REPEATS for a
    longer soak)."""
    return max(1, int(os.environ.get("ALINEO_FAULT_REPEATS") or default))


def restored_count(events) -> int:
    return sum(1 for e in events if e["type"] in ("agent.restored", "agent.lost"))


def fault_cases(world: World, agent: str, fault, row: Row, *, label: str,
                checkpoint: bool = False, mid_turn_repeats: int = 1) -> list[str]:
    """Run `fault(world, agent)` on an idle agent, then mid-turn (a `sleep:` step
    running), each followed by: a new agent.restored (or agent.lost) fact, and
    every invariant. Returns the rungs taken; violations go to `row`."""
    from tests.faults import invariants

    rungs = []
    cases = ["idle"] + ["mid-turn"] * mid_turn_repeats
    for i, case in enumerate(cases, 1):
        before = restored_count(world.events(agent))
        if case == "mid-turn":
            marker = f"{3 + i}.{i}"  # a unique sleep length to find this step
            world.send(agent, "prompt", f"write m{i}.txt: mid-{label}-{i}\nsleep: {marker}\n"
                                         f"run: echo after-{i}")
            wait_running_step(world, agent, f"sleep {marker}")
            # A second prompt, queued in the bridge behind the running turn
            # (acknowledged and handed over: its Command row is done).
            world.send(agent, "prompt", f"write q{i}.txt: queued-{label}-{i}")
            deadline = time.monotonic() + WAIT
            while world.pending_commands(agent) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.3)
        if checkpoint and case == "idle":
            world.wait_for(agent, lambda evs: any(e["type"] == "agent.checkpointed" for e in evs),
                           "a turn checkpoint")
        fault(world, agent)
        events = world.wait_for(agent, lambda evs: restored_count(evs) > before,
                                f"the ladder after {label} ({case})")
        new = [e for e in events if e["type"] in ("agent.restored", "agent.lost")][before:]
        rungs += [e["data"].get("rung", "lost") for e in new]
        violations = invariants.check(world)
        row.iterations += 1
        if violations:
            row.violations += [f"{label} {case}: {v}" for v in violations]
            print(f"[faults] {label} {case}: {len(violations)} violation(s):")
            for v in violations:
                print("   ", v)
            print(excerpt(world, agent, around=new[-1]["seq"] if new else None, width=14))
    row.add_rungs(Counter(rungs))
    return rungs

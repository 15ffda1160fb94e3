"""docs/DEPLOYMENT.md's scale-out block, run as written: its environment (with
this run's database and Redis), its migrate, its two web processes and its two
workers. A prompt sent through one web process streams from the other; a
worker stopped with SIGTERM hands its agent to the other worker at once."""

from __future__ import annotations

import http.client
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sessions.models import AgentLease, Event
from tests.engines import database_env
from tests.live import answers, free_port, stop_process

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "DEPLOYMENT.md"


def scale_out_block() -> tuple[list[str], list[list[str]]]:
    """(exported variable names, commands) of the doc's scale-out block."""
    text = DOC.read_text()
    block = text.split("<!-- scale-out:begin -->", 1)[1].split("<!-- scale-out:end -->", 1)[0]
    names, commands = [], []
    for line in block.splitlines():
        line = line.strip()
        if line.startswith("export "):
            names.append(line[len("export "):].split("=", 1)[0])
        elif line and not line.startswith(("#", "```")):
            commands.append(shlex.split(line))
    return names, commands


def _request(port: int, method: str, path: str, token: str, body=None) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=json.dumps(body) if body is not None else None,
                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        assert resp.status < 300, (resp.status, data)
        return json.loads(data or b"{}")
    finally:
        conn.close()


def _stream_until(port: int, agent_id: str, token: str, after: int, stop_type: str,
                  timeout: float = 90) -> list[dict]:
    """SSE events from `after` until (and with) the first `stop_type`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("GET", f"/api/agents/{agent_id}/stream?after={after}",
                 headers={"Authorization": f"Bearer {token}", "Accept": "text/event-stream"})
    resp = conn.getresponse()
    assert resp.status == 200
    events, current = [], {}
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            line = resp.fp.readline().decode().rstrip("\n")
            if line.startswith("id:"):
                current["seq"] = int(line[3:].strip())
            elif line.startswith("event:"):
                current["type"] = line[6:].strip()
            elif line.startswith("data:"):
                current["data"] = json.loads(line[5:].strip())["data"]  # {seq, type, ts, data}
            elif line == "" and "type" in current:
                events.append(current)
                if current["type"] == stop_type:
                    return events
                current = {}
        pytest.fail(f"no {stop_type} within {timeout} s: {[e['type'] for e in events]}")
    finally:
        conn.close()


def test_the_documented_variables_are_the_ones_a_deployment_needs():
    names, commands = scale_out_block()
    assert names == ["DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALINEO_DATA_DIR"]
    verbs = [c[1:3] for c in commands]
    assert verbs == [["manage.py", "migrate"], ["manage.py", "serve"], ["manage.py", "serve"],
                     ["manage.py", "runworker"], ["manage.py", "runworker"]]


def test_the_documented_shape_runs(tmp_path, owner, owner_token):
    names, commands = scale_out_block()
    env = database_env()
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.update({"SECRET_KEY": "test-" + "k" * 40, "ALINEO_DATA_DIR": str(tmp_path),
                "PYTHONUNBUFFERED": "1", "ALINEO_SANDBOX": "local", "ALINEO_LEASE_S": "6"})
    assert all(env.get(n) for n in names)
    procs: list[tuple[list[str], subprocess.Popen]] = []
    web_ports, workers = [], []
    try:
        for argv in commands:
            argv = [sys.executable if a == ".venv/bin/python" else a for a in argv]
            if "migrate" in argv:
                subprocess.run(argv, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
                continue
            if "--port" in argv:
                port = free_port()
                argv[argv.index("--port") + 1] = str(port)
                web_ports.append(port)
            log = open(tmp_path / f"proc{len(procs)}.log", "ab")
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            procs.append((argv, proc))
            if "runworker" in argv:
                workers.append(proc)
        _wait_ready(web_ports, procs, tmp_path)
        one, two = web_ports
        agent = _request(one, "POST", "/api/agents", owner_token,
                         {"spec": {"model": "demo"}, "prompt": "say: hello through web one"})
        events = _stream_until(two, agent["id"], owner_token, 0, "turn.finished")
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # gapless, in order
        assert events[-1]["data"]["text"] == "[demo] hello through web one"

        # SIGTERM the worker that drives it: its lease is released, the other takes over.
        first = AgentLease.objects.get(pk=agent["id"]).holder
        pid = int(first.rsplit(":", 2)[1])
        stopping = next(p for p in workers if p.pid == pid)
        stopping.send_signal(signal.SIGTERM)
        assert stopping.wait(30) == 0
        head = events[-1]["seq"]
        _request(two, "POST", f"/api/agents/{agent['id']}/prompt", owner_token,
                 {"text": "say: and again through web two"})
        more = _stream_until(one, agent["id"], owner_token, head, "turn.finished")
        assert more[0]["seq"] == head + 1
        assert more[-1]["data"]["text"] == "[demo] and again through web two"
        changes = [d for d in Event.objects.filter(agent_id=agent["id"], type="agent.worker")
                   .order_by("seq").values_list("data", flat=True)]
        assert [c["previous"] for c in changes] == [None, first]
        assert changes[-1]["worker"] != first and changes[-1]["epoch"] == 2
    finally:
        for _argv, proc in procs:
            stop_process(proc, 20)


def _wait_ready(ports, procs, tmp_path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not all(answers(p) for p in ports) or not all(
            re.search("listening on", (tmp_path / f"proc{i}.log").read_text())
            for i, (argv, _p) in enumerate(procs) if "runworker" in argv):
        dead = [argv for argv, p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            logs = "\n".join((tmp_path / f"proc{i}.log").read_text()[-2000:] for i in range(len(procs)))
            pytest.fail(f"the documented processes did not start (dead: {dead}):\n{logs}")
        time.sleep(0.2)

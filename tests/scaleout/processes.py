"""Processes of the scale-out shape for tests: a named `manage.py runworker`
on the test database and REDIS_URL, and a small JSON API client."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.engines import database_env
from tests.live import read_log, stop_process

ROOT = Path(__file__).resolve().parents[2]
LEASE_S = 6  # the shortest the system check allows is 5


class WorkerProcess:
    """`manage.py runworker` on the test database and REDIS_URL, stopped by its PID."""

    def __init__(self, name: str, data_dir: Path, env: dict[str, str] | None = None):
        self.name = name
        self.log_path = data_dir / f"worker-{name}.log"
        self.env = database_env()
        for key in ("DJANGO_SETTINGS_MODULE", "DOCKER_HOST"):
            self.env.pop(key, None)
        self.env.update({"ALINEO_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1",
                         "ALINEO_WORKER_ID": name, "ALINEO_LEASE_S": str(LEASE_S)})
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None

    def start(self) -> "WorkerProcess":
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "manage.py", "runworker"], cwd=ROOT,
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + 60
        while "listening on" not in self.log():
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {self.name} did not start:\n{self.log()}")
            time.sleep(0.1)
        return self

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL: no lease is released, no shutdown code runs
        self.proc.wait(10)

    def stop(self) -> None:
        stop_process(self.proc, 20)

    def log(self) -> str:
        return read_log(self.log_path)


class Api:
    def __init__(self, url: str, token: str):
        self.url, self.token = url, token

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")

    def events(self, agent_id: str) -> list[dict]:
        out, after = [], 0
        while True:
            page = self.call("GET", f"/api/agents/{agent_id}/events?after={after}&limit=500")["events"]
            if not page:
                return out
            out += page
            after = page[-1]["seq"]

"""The scale-out shape: PostgreSQL (DATABASE_URL) and Redis (REDIS_URL), several
processes on one database and one channel layer.

These tests need both services. Without them they are skipped with a loud
reason — and under CI=true they FAIL instead, so CI can never pass without
running them. `make test` brings the services up as root (.ci/services-up) and
runs them in its PostgreSQL pass only (ALINEO_TEST_PASS=postgresql; its SQLite
pass leaves tests/scaleout out); by hand:

    eval "$(sudo bash .ci/services-up)"     # DATABASE_URL=… REDIS_URL=…
    DATABASE_URL=… REDIS_URL=… .venv/bin/python -m pytest tests/scaleout

`web_server` starts `manage.py serve --role web` processes (HTTP + SSE +
wake-ups, no worker) on the test database and the same Redis.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engines import database_env
from tests.live import answers, free_port, read_log, stop_process

ROOT = Path(__file__).resolve().parents[2]


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


def _missing() -> list[str]:
    from django.db import connection

    gone = []
    if connection.vendor != "postgresql":
        gone.append("DATABASE_URL=postgres://… (this run is on %s)" % connection.vendor)
    if not os.environ.get("REDIS_URL", "").startswith(("redis://", "rediss://", "unix://")):
        gone.append("REDIS_URL=redis://…")
    return gone


def _redis_answers() -> str | None:
    """None when Redis answers PING, else why not."""
    import redis

    try:
        client = redis.Redis.from_url(os.environ["REDIS_URL"], socket_timeout=3, socket_connect_timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - reported
        return f"REDIS_URL does not answer: {exc}"
    return None


@pytest.fixture(autouse=True)
def _scaleout_services():
    gone = _missing()
    if gone:
        test_pass = os.environ.get("ALINEO_TEST_PASS", "")
        why = (f"SCALE-OUT TESTS NOT RUN: they need {' and '.join(gone)} "
               "(as root: `bash .ci/services-up` prints both)")
        if _ci() or test_pass == "postgresql":
            pytest.fail(f"{'CI=true' if _ci() else 'the PostgreSQL pass'}: {why}", pytrace=False)
        pytest.skip(why)
    down = _redis_answers()
    if down:  # configured but not answering: never a skip
        pytest.fail(down, pytrace=False)


class WebProcess:
    """`manage.py serve --role web` on 127.0.0.1, the test database and REDIS_URL.
    Stopped by its PID (SIGTERM, then SIGKILL)."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None):
        self.port = free_port()
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = data_dir / f"web-{self.port}.log"
        self.env = database_env()
        self.env.pop("DJANGO_SETTINGS_MODULE", None)
        self.env.update({"ALINEO_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"})
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> "WebProcess":
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "serve", "--role", "web", "--host", "127.0.0.1",
                 "--port", str(self.port)],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"web process exited with {self.proc.returncode}:\n{self.log()}")
            if answers(self.port):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"web process did not answer within {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, timeout)

    def log(self) -> str:
        return read_log(self.log_path)


@pytest.fixture
def web_server(tmp_path):
    """Factory: web_server(env=None) → a started WebProcess; all stopped at the end."""
    started: list[WebProcess] = []

    def make(env: dict[str, str] | None = None) -> WebProcess:
        # One data dir for all, as on one machine: the same secret key (browser
        # sessions and CSRF tokens valid on every web process), one checkpoint store.
        proc = WebProcess(tmp_path / "data", env)
        started.append(proc)
        return proc.start()

    yield make
    for proc in started:
        proc.stop()

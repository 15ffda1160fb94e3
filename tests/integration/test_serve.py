"""`manage.py serve`, the embedded default, as `make run` starts it: a real
process on a free loopback port with its own data dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]
ADMIN_PASSWORD = "serve-test-password-1"
START_TIMEOUT_S = 30
# A stop waits for the worker's threads to finish what they are doing (a
# journal commit, an engine call): with the other suites' servers, sandboxes
# and browsers on the same 2 cores that took over 10 s twice (SIGINT, on
# 2026-12-02). The bound is for a server that would not stop at all.
STOP_TIMEOUT_S = 30


def manage_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PORT", "DATABASE_URL", "REDIS_URL")}
    env.update(
        ALINEO_DATA_DIR=str(data_dir),
        ALINEO_ADMIN_PASSWORD=ADMIN_PASSWORD,
        ALINEO_LOG_LEVEL="DEBUG",  # the worker logs what it receives at debug
        PYTHONUNBUFFERED="1",
    )
    return env


def manage(data_dir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT, env=manage_env(data_dir), capture_output=True, text=True, timeout=120, check=check,
    )


class Served:
    """A running `manage.py serve --port 0`; its output goes to files we can poll."""

    def __init__(self, data_dir: Path, name: str):
        self.out_path, self.err_path = data_dir / f"{name}.out", data_dir / f"{name}.err"
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "serve", "--host", "127.0.0.1", "--port", "0"],
                cwd=ROOT, env=manage_env(data_dir), stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            )
        self.url = self._wait_for_url()

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in self.out_path.read_text().splitlines():
                if "serving on http://" in line:
                    return line.split("serving on ", 1)[1].split()[0]
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        pytest.fail(f"serve did not start:\n{self.out_path.read_text()}\n{self.err_path.read_text()}")

    def log(self) -> str:
        return self.err_path.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STOP_TIMEOUT_S)


def http(method: str, url: str, body: dict | None = None, headers: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("serve-data")
    manage(path, "migrate", "--noinput")
    manage(path, "ensure_admin")
    return path


@pytest.fixture(scope="module")
def server(data_dir):
    served = Served(data_dir, "shared")
    yield served
    served.stop()


def test_serves_the_admin_login_page(server):
    status, body = http("GET", server.url + "admin/login/")
    assert status == 200
    assert b"csrfmiddlewaretoken" in body


def test_serves_static_files(server):
    status, body = http("GET", server.url + "static/admin/css/base.css")
    assert status == 200
    assert len(body) > 1000


def test_an_unknown_static_file_is_a_404(server):
    status, _ = http("GET", server.url + "static/no/such/file.css")
    assert status == 404


def test_issue_token_cli_prints_a_token_and_fails_for_unknown_users(data_dir):
    done = manage(data_dir, "issue_token", "admin")
    assert done.stdout.strip().startswith("aln_") and len(done.stdout.strip().splitlines()) == 1
    failed = manage(data_dir, "issue_token", "nobody", check=False)
    assert failed.returncode != 0
    assert "nobody" in failed.stderr and failed.stdout == ""


def test_the_worker_on_the_same_loop_receives_commands(server, data_dir):
    """A spawn is journaled, then announced on the worker channel; the embedded
    worker logs `command.pending received` at debug. Only one process can see
    the in-memory layer's message, so this proves both share the loop."""
    token = manage(data_dir, "issue_token", "admin").stdout.strip()
    status, body = http(
        "POST", server.url + "api/agents", {"spec": {"model": "demo"}}, {"Authorization": f"Bearer {token}"}
    )
    assert status == 201, body
    deadline = time.monotonic() + 10
    while "command.pending received" not in server.log():
        assert time.monotonic() < deadline, "the worker never logged the command:\n" + server.log()[-3000:]
        time.sleep(0.1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_it_cleanly_and_quickly(data_dir, signum):
    served = Served(data_dir, f"stop-{signum.name}")
    try:
        assert http("GET", served.url + "admin/login/")[0] == 200
        started = time.monotonic()
        served.proc.send_signal(signum)
        try:
            returncode = served.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{signum.name} did not stop serve within {STOP_TIMEOUT_S} s; its output:\n"
                        f"{served.out_path.read_text()}\n{served.log()[-4000:]}")
        assert time.monotonic() - started < STOP_TIMEOUT_S
        assert returncode == 0, served.log()[-3000:]
        assert "Alineo stopped." in served.out_path.read_text()
    finally:
        served.stop()


def test_a_busy_port_fails_with_a_non_zero_exit(server, data_dir):
    port = server.url.rstrip("/").rsplit(":", 1)[1]
    done = subprocess.run(
        [sys.executable, "manage.py", "serve", "--port", port],
        cwd=ROOT, env=manage_env(data_dir), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0
    assert "cannot listen" in done.stderr


READ_BACK = "database durability (read back): vendor=sqlite journal_mode=wal synchronous=FULL"
_PRAGMAS = ("from django.db import connection\n"
            "c = connection.cursor()\n"
            "print('@@', [c.execute(f'PRAGMA {p}').fetchone()[0] "
            "for p in ('journal_mode', 'synchronous', 'busy_timeout')])")


def test_every_process_kind_reads_back_durable_sqlite_settings(server, data_dir):
    """synchronous=FULL and WAL, read back from the connections themselves
    (sessions/durability.py), not from the settings that ask for them: a kill -9
    cannot show a lost fsync, so this is what catches FULL turned into NORMAL/OFF.
    `serve` (web + worker) and `runworker` log what their connection says; a
    management command's connection is read here directly."""
    assert READ_BACK in server.log(), server.log()[-2000:]
    with open(data_dir / "runworker.log", "w") as out:
        worker = subprocess.Popen([sys.executable, "manage.py", "runworker"], cwd=ROOT,
                                  env=manage_env(data_dir), stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while "listening on" not in (data_dir / "runworker.log").read_text():
            assert worker.poll() is None and time.monotonic() < deadline, (
                (data_dir / "runworker.log").read_text())
            time.sleep(0.1)
        assert READ_BACK in (data_dir / "runworker.log").read_text()
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=STOP_TIMEOUT_S)
    shell = manage(data_dir, "shell", "--no-startup", "-c", _PRAGMAS).stdout
    assert "@@ ['wal', 2, 20000]" in shell, shell

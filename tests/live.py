"""A real Alineo server in a subprocess, for tests that need one.

    with LiveServer() as live:                   # fresh data dir, migrated, serving
        actor = live.create_actor("olivia")       # user + workspace + API token
        agent = live.create_agent(actor)
        live.note(agent, "hello")                 # a commit from another process
        live.restart()                            # same port, same data dir

    LiveServer(root=other_tree)                   # another checkout's code (tests/upgrade)

The server is `manage.py serve` (daphne and the worker on one loop) when that
command exists, else plain daphne. It listens on 127.0.0.1 only and is stopped
by its PID. Data dirs are made under $ALINEO_DATA_DIR (the test run's private
dir) and removed afterwards.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tests.warm_shell import WarmShell

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
# Settings that would point the server away from its own data dir.
_STRIPPED_ENV = ("ALINEO_DB_PATH", "DATABASE_URL", "REDIS_URL", "PORT")

_template_lock = threading.Lock()
_shells: list = []  # every warm shell started here, ended at exit
_template_db: Path | None = None


@dataclass(frozen=True)
class Actor:
    username: str
    workspace: str
    token: str
    user_id: int

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


#: Every data dir a LiveServer of this test process used: the sandboxes its
#: worker made are removed at the session's end (tests/integration/conftest.py),
#: also where the data dirs are not under ALINEO_DATA_DIR (a run outside make test).
DATA_DIRS: list[Path] = []


def parent_dir() -> Path:
    parent = Path(os.environ.get("ALINEO_DATA_DIR") or tempfile.gettempdir()) / "live"
    parent.mkdir(parents=True, exist_ok=True)
    return parent


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGTERM a process we started (by its PID), SIGKILL if it does not go."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def server_command(port: int, root: Path = ROOT) -> list[str]:
    if (root / "sessions" / "management" / "commands" / "serve.py").exists():
        return [PYTHON, "manage.py", "serve", "--host", "127.0.0.1", "--port", str(port)]
    return [PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "alineo_site.asgi:application"]


class LiveServer:
    """One server process over one data dir. `env` adds or overrides settings
    (e.g. ALINEO_SSE_HEARTBEAT_S); the data dir is always its own. `root` is
    the code it runs (default: this checkout), with this test run's python."""

    def __init__(self, env: dict[str, str] | None = None, data_dir: str | Path | None = None,
                 keep: bool = False, startup_timeout: float = 60.0,
                 root: str | Path | None = None):
        self.root = Path(root) if root else ROOT
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="srv-", dir=parent_dir()))
        self.keep = keep or data_dir is not None
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir / "server.log"
        DATA_DIRS.append(self.data_dir)
        self._migrated = False
        self._shell: WarmShell | None = None

    # --- lifecycle ------------------------------------------------------------------

    def __enter__(self) -> "LiveServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        self.close_shell()
        if not self.keep and exc[0] is None:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _STRIPPED_ENV}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        env.update({"ALINEO_DATA_DIR": str(self.data_dir), "PYTHONUNBUFFERED": "1"})
        env.update(self.extra_env)
        return env

    def start(self) -> None:
        if not self._migrated:
            self._migrate()
        assert self.proc is None or self.proc.poll() is not None, "already running"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                server_command(self.port, self.root), cwd=self.root, env=self.env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self._wait_ready()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID, SIGKILL if it does not go."""
        proc, self.proc = self.proc, None
        stop_process(proc, timeout)

    def kill(self) -> None:
        """SIGKILL by PID: a crash, no shutdown code runs."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def restart(self, *, hard: bool = False) -> None:
        """Stop (or kill, when hard) and start again on the same port and data dir."""
        self.kill() if hard else self.stop()
        self.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _migrate(self) -> None:
        """Copy a database migrated once per test session, else migrate here."""
        if self.root != ROOT:  # the template is this checkout's schema
            self.migrate()
            return
        db = self.data_dir / "alineo.sqlite3"
        template = _migrated_template(self.env)
        shutil.copyfile(template, db)
        self._migrated = True

    def migrate(self) -> None:
        """`manage.py migrate` of this server's code on its data dir as it is
        (an upgrade in place); start() then keeps the database."""
        self.manage("migrate", "--noinput", timeout=300)
        self._migrated = True

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            if answers(self.port):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server did not answer within {self.startup_timeout} s:\n{self.log()}")

    # --- the server's database, from another process -----------------------------------

    def manage(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [PYTHON, "manage.py", *args], cwd=self.root, env=self.env,
            capture_output=True, text=True, timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def django(self, code: str):
        """Run `code` in a Django shell on this server's DB (a warm one: tests/
        warm_shell.py); it must assign `result` (JSON-able), which is returned."""
        return self.shell().run(code)

    def shell(self) -> WarmShell:
        """This server's warm shell (tests/warm_shell.py), started again when
        its code or settings changed or it is gone."""
        env = self.env
        shell = self._shell
        if shell is None or not shell.alive() or shell.key != (str(self.root), tuple(sorted(env.items()))):
            if shell is not None:
                shell.close()
            self._shell = shell = WarmShell(PYTHON, self.root, env)
            _shells.append(shell)
        return shell

    def close_shell(self) -> None:
        if self._shell is not None:
            self._shell.close()
            self._shell = None

    def create_actor(self, username: str, workspace: str | None = None) -> Actor:
        """A user in a workspace (made if missing) with an API token."""
        data = self.django(
            "from django.contrib.auth import get_user_model\n"
            "from sessions.models import ApiToken, Workspace\n"
            f"ws, _ = Workspace.objects.get_or_create(name={workspace or username + '-ws'!r})\n"
            f"user = get_user_model().objects.create_user({username!r}, password={username + '-password-123'!r})\n"
            "ws.members.add(user)\n"
            "result = {'workspace': ws.name, 'token': ApiToken.issue(user)[1], 'user_id': user.pk}\n"
        )
        return Actor(username, data["workspace"], data["token"], data["user_id"])

    def grant(self, actor: Actor, codename: str = "approve_credentials") -> None:
        """Grant the actor an agent_sessions permission, as an admin does in
        the admin (approve_credentials: approving held credentials)."""
        self.django(
            "from django.contrib.auth import get_user_model\n"
            "from django.contrib.auth.models import Permission\n"
            f"perm = Permission.objects.get(codename={codename!r}, "
            "content_type__app_label='agent_sessions')\n"
            f"get_user_model().objects.get(pk={actor.user_id}).user_permissions.add(perm)\n"
        )

    def set_quotas(self, actor: Actor, **quotas: int) -> None:
        """Set the actor's workspace quotas (Workspace.max_agents, max_sandboxes,
        max_streams_per_user …), as an admin does in the admin."""
        self.django(
            "from sessions.models import Workspace\n"
            f"Workspace.objects.filter(name={actor.workspace!r}).update(**{quotas!r})\n"
        )

    def create_agent(self, actor: Actor, events: list[tuple[str, dict]] | None = None) -> str:
        """An agent in the actor's workspace, with these facts already journaled."""
        return self.django(
            "from django.contrib.auth import get_user_model\n"
            "from sessions import journal\n"
            "from sessions.models import Agent, Workspace\n"
            f"user = get_user_model().objects.get(pk={actor.user_id})\n"
            f"ws = Workspace.objects.get(name={actor.workspace!r})\n"
            "agent = Agent.objects.create(workspace=ws, created_by=user, spec={'model': 'demo'})\n"
            f"facts = {json.dumps(events or [])}\n"
            "if facts:\n"
            "    journal.append_many(agent.id, [(t, d) for t, d in facts])\n"
            "result = agent.id\n"
        )

    def session_cookie(self, actor: Actor) -> str:
        """A logged-in browser session for the actor (the value of the sessionid cookie)."""
        return self.django(
            "from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model\n"
            "from django.contrib.sessions.backends.db import SessionStore\n"
            f"user = get_user_model().objects.get(pk={actor.user_id})\n"
            "s = SessionStore()\n"
            "s[SESSION_KEY] = str(user.pk)\n"
            "s[BACKEND_SESSION_KEY] = 'django.contrib.auth.backends.ModelBackend'\n"
            "s[HASH_SESSION_KEY] = user.get_session_auth_hash()\n"
            "s.create()\n"
            "result = s.session_key\n"
        )

    def note(self, agent_id: str, text: str) -> int:
        """`manage.py note`: a commit by another process. Returns its seq."""
        out = self.django(
            "import io\nfrom django.core.management import call_command\n"
            f"buf = io.StringIO()\ncall_command('note', {agent_id!r}, {text!r}, stdout=buf)\n"
            "result = buf.getvalue()\n")
        return int(out.strip().splitlines()[-1])


@atexit.register
def _close_shells() -> None:
    for shell in _shells:
        shell.close()


def answers(port: int) -> bool:
    """Any HTTP answer counts: the server is up."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/static/__live_probe__")
        conn.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _migrated_template(env: dict[str, str]) -> Path:
    """Migrate once per test session into a template data dir; servers start from copies."""
    global _template_db
    with _template_lock:
        if _template_db is None or not _template_db.exists():
            template_dir = Path(tempfile.mkdtemp(prefix="template-", dir=parent_dir()))
            run_env = dict(env, ALINEO_DATA_DIR=str(template_dir))
            result = subprocess.run(
                [PYTHON, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=run_env,
                capture_output=True, text=True, timeout=300,
            )
            if result.returncode != 0:
                raise RuntimeError(f"migrate failed:\n{result.stdout}\n{result.stderr}")
            _checkpoint_wal(template_dir / "alineo.sqlite3")
            atexit.register(shutil.rmtree, template_dir, True)
            _template_db = template_dir / "alineo.sqlite3"
        return _template_db


def _checkpoint_wal(db: Path) -> None:
    """Fold the WAL into the main file so a plain copy of it is complete."""
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


# --- reading a stream -------------------------------------------------------------------

@dataclass
class SSEEvent:
    id: str | None
    event: str
    data: str

    def json(self):
        return json.loads(self.data)


class SSEStream:
    """A blocking SSE reader over httpx. next_event() waits at most `timeout`
    seconds overall, so a test that expects an event fails instead of hanging."""

    def __init__(self, url: str, headers: dict[str, str] | None = None, timeout: float = 10.0):
        import httpx

        self.timeout = timeout
        self.client = httpx.Client(timeout=httpx.Timeout(timeout))
        request = self.client.build_request("GET", url, headers=headers or {})
        self.response = self.client.send(request, stream=True)
        self.status = self.response.status_code
        self.headers = self.response.headers
        self.comments: list[str] = []
        self.retry: int | None = None
        self._lines = None

    def __enter__(self) -> "SSEStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.response.close()
        self.client.close()

    def body(self) -> bytes:
        """The whole body of a non-stream (error) response."""
        return self.response.read()

    def next_event(self, timeout: float | None = None) -> SSEEvent:
        deadline = time.monotonic() + (timeout or self.timeout)
        if self._lines is None:
            self._lines = self.response.iter_lines()
        fields: dict[str, list[str]] = {}
        for line in self._lines:
            if line == "":
                if "data" in fields:
                    return SSEEvent(_last(fields, "id"), _last(fields, "event") or "message",
                                    "\n".join(fields["data"]))
                fields = {}
            elif line.startswith(":"):
                self.comments.append(line[1:].strip())
            else:
                name, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if name == "retry" and value.isdigit():
                    self.retry = int(value)
                else:
                    fields.setdefault(name, []).append(value)
            if time.monotonic() > deadline:
                break
        raise TimeoutError(f"no event within {timeout or self.timeout} s")

    def events(self, count: int, timeout: float | None = None) -> list[SSEEvent]:
        return [self.next_event(timeout) for _ in range(count)]

    def wait_comment(self, text: str, timeout: float | None = None) -> None:
        """Read until a comment line `: text` arrives (events read meanwhile are kept)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        if self._lines is None:
            self._lines = self.response.iter_lines()
        for line in self._lines:
            if line.startswith(":") and line[1:].strip() == text:
                self.comments.append(text)
                return
            if time.monotonic() > deadline:
                break
        raise TimeoutError(f"no ': {text}' within {timeout or self.timeout} s")


def _last(fields: dict[str, list[str]], name: str) -> str | None:
    values = fields.get(name)
    return values[-1] if values else None

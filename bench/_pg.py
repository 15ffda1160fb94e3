"""PostgreSQL for the benches: a server to run against, and a scratch database
per bench that is dropped afterwards.

Where the server comes from, in this order:
1. `ALINEO_BENCH_DATABASE_URL`, else `DATABASE_URL`: that server. The benches
   never write to the database the URL names: they CREATE a scratch database
   next to it (`alineo_bench_<hex>`) and DROP it at the end. A role that may
   not create databases gets the PG rows skipped, with that reason.
2. PostgreSQL's binaries (/usr/lib/postgresql/*/bin/initdb): a throwaway
   cluster in a temp dir, listening on 127.0.0.1 on a free port (and a unix
   socket in that dir), password auth, stopped and removed at the end.
   `initdb` refuses root, so as root the cluster runs as an unprivileged user:
   `ALINEO_BENCH_PG_USER` if set, else the first of pgtmp, postgres, nobody
   that exists.
3. Neither: the PG rows are printed as skipped, with the reason.

`bench/run` starts one server for the whole run and hands its URL to each
bench as ALINEO_BENCH_DATABASE_URL; a bench run on its own starts its own.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit


class NoPostgres(Exception):
    """Why there is no PostgreSQL to bench against (printed as the skip reason)."""


def configured_url() -> str | None:
    for name in ("ALINEO_BENCH_DATABASE_URL", "DATABASE_URL"):
        url = os.environ.get(name, "").strip()
        if url and url.split(":", 1)[0] in ("postgres", "postgresql", "pgsql", "postgis"):
            return url
    return None


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: [int(x) if x.isdigit() else 0 for x in Path(p).parts[-3].split(".")])
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _run_as() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    wanted = os.environ.get("ALINEO_BENCH_PG_USER")
    for name in ([wanted] if wanted else ["pgtmp", "postgres", "nobody"]):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise NoPostgres("running as root and no unprivileged user (pgtmp, postgres, nobody) to run initdb as; "
                     "set ALINEO_BENCH_PG_USER")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server():
    """Yields (admin URL, description). Raises NoPostgres when there is none."""
    if os.environ.get("ALINEO_BENCH_NO_PG"):  # bench/run already found none: say why, once per bench
        raise NoPostgres(os.environ["ALINEO_BENCH_NO_PG"])
    url = configured_url()
    if url:
        yield url, os.environ.get("ALINEO_BENCH_PG_HOW") or (
            "from " + ("ALINEO_BENCH_DATABASE_URL" if os.environ.get("ALINEO_BENCH_DATABASE_URL") else "DATABASE_URL"))
        return
    bindir = _bindir()
    if bindir is None:
        raise NoPostgres("no PostgreSQL: neither ALINEO_BENCH_DATABASE_URL/DATABASE_URL is set nor initdb installed")
    with _throwaway_cluster(bindir, _run_as()) as found:
        yield found


@contextlib.contextmanager
def _throwaway_cluster(bindir: Path, user: pwd.struct_passwd | None):
    """Yields (admin URL, description) of a cluster that is stopped and removed at the end."""
    cluster = _Cluster(bindir, user)
    try:
        cluster.init()
        port = cluster.start()
        how = f"a throwaway cluster on 127.0.0.1:{port}{' run as ' + user.pw_name if user else ''}"
        yield f"postgresql://postgres:{quote(cluster.password)}@127.0.0.1:{port}/postgres", how
    finally:
        cluster.stop()


class _Cluster:
    """A PostgreSQL cluster in a temp dir, its files owned by (and its tools run
    as) `user` when there is one."""

    def __init__(self, bindir: Path, user: pwd.struct_passwd | None):
        self.bindir, self.user = bindir, user
        self.base = Path(tempfile.mkdtemp(prefix="alineo-bench-pg-", dir="/tmp" if Path("/tmp").is_dir() else None))
        self.as_user: dict = {}
        if user is not None:
            self.as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        self._own(self.base)
        self.password = secrets.token_hex(16)
        self.pwfile = self.base / "pw"
        self.pwfile.write_text(self.password + "\n")
        self._own(self.pwfile)
        self.data, self.log, self.sock = self.base / "data", self.base / "log", self.base / "sock"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        self.env.update(LC_ALL="C.UTF-8", LANG="C.UTF-8", HOME=str(self.base))
        self.started = False

    def _own(self, path: Path) -> None:
        if self.user is not None:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)

    def _run(self, tool: str, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bindir / tool), *args], capture_output=True, text=True, env=self.env,
                              cwd=self.base, timeout=timeout, check=False, **self.as_user)

    def init(self) -> None:
        self.sock.mkdir()
        self._own(self.sock)
        r = self._run("initdb", ["-D", str(self.data), "-U", "postgres", "-E", "UTF8", "--auth=scram-sha-256",
                                 f"--pwfile={self.pwfile}", "--no-sync"], timeout=120)
        if r.returncode != 0:
            raise NoPostgres(f"initdb failed: {(r.stderr or r.stdout).strip()[-300:]}")

    def start(self) -> int:
        """Start on a free port (three tries: another process may take the port first). Returns it."""
        for _ in range(3):
            port = _free_port()
            with open(self.data / "postgresql.conf", "a") as fh:
                fh.write(f"\n# alineo bench\nlisten_addresses = '127.0.0.1'\nport = {port}\n"
                         f"unix_socket_directories = '{self.sock}'\nmax_connections = 200\n")
            r = self._run("pg_ctl", ["-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start"],
                          timeout=90)
            if r.returncode == 0:
                self.started = True
                return port
        tail = self.log.read_text()[-500:] if self.log.exists() else r.stderr
        raise NoPostgres(f"pg_ctl start failed: {tail.strip()}")

    def stop(self) -> None:
        if self.started:
            self._run("pg_ctl", ["-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop"], timeout=90)
        shutil.rmtree(self.base, ignore_errors=True)


def _with_db(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


@contextlib.contextmanager
def scratch_database(admin_url: str):
    """A fresh database on the server, dropped at the end. Yields its URL."""
    import psycopg

    name = f"alineo_bench_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        why = " ".join(str(exc).split())[:200]
        raise NoPostgres(f"cannot create a scratch database on that server: {why}") from exc
    try:
        yield _with_db(admin_url, name)
    finally:
        for _ in range(5):
            try:
                with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                break
            except psycopg.Error:
                time.sleep(1)


def version(url: str) -> str:
    import psycopg

    with psycopg.connect(url, connect_timeout=10) as conn:
        full = conn.execute("SHOW server_version").fetchone()[0]
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
    return f"PostgreSQL {full.split()[0]} (fsync={fsync}, synchronous_commit={sync})"


def main_sqlite_then_pg(doc: str, script: Path, measure, skipped_row: str, timeout: float) -> int:
    """A bench's main() that measures on SQLite here, then on PostgreSQL in a
    child process (settings read DATABASE_URL at import): ``measure(args,
    url_or_None)`` gives the rows; a missing PostgreSQL gives one skipped row."""
    from bench import _common as C

    args = C.parser(doc.splitlines()[0]).parse_args()
    if args.pg_child:
        C.emit(measure(args, args.pg_child), args)
        return 0
    rows = measure(args, None)
    pg_rows, why = run_child(script, ["--quick"] if args.quick else [], timeout=timeout)
    rows += pg_rows or [C.row(skipped_row, "skipped", "-", None, "-", "info", note=why)]
    C.emit(rows, args)
    return 0


def run_child(script: Path, args: list[str], timeout: float) -> tuple[list[dict] | None, str]:
    """Run `script --pg-child URL …` against a scratch database on a server
    (bench/run's, or one started here). Returns (rows, reason-if-none)."""
    import json

    from bench import _common as C

    try:
        with contextlib.ExitStack() as stack:
            admin, how = stack.enter_context(server())
            url = stack.enter_context(scratch_database(admin))
            out = Path(tempfile.mkstemp(prefix="alineo-bench-pg-rows-", suffix=".json")[1])
            stack.callback(out.unlink, missing_ok=True)
            env = dict(os.environ)
            env.pop("DATABASE_URL", None)
            env.pop("ALINEO_DATA_DIR", None)  # this process's own data dir, gone by now
            if C.PARENT_DATA_DIR:
                env["ALINEO_DATA_DIR"] = C.PARENT_DATA_DIR
            proc = subprocess.run([C.PY, str(script), "--pg-child", url, "--json", str(out), *args],
                                  cwd=C.REPO, env=env, capture_output=True, text=True, timeout=timeout,
                                  check=False)
            if proc.returncode != 0 or not out.exists() or not out.read_text().strip():
                return None, f"the PostgreSQL run failed (exit {proc.returncode}): {proc.stderr.strip()[-600:]}"
            rows = json.loads(out.read_text())
            ver = version(url)
            if rows:  # the server, once per bench
                rows[0]["note"] = (rows[0].get("note", "") + f"; {ver}, {how}").lstrip("; ")
            return rows, ""
    except NoPostgres as exc:
        return None, str(exc)
    except subprocess.TimeoutExpired:
        return None, f"the PostgreSQL run timed out after {timeout:.0f} s"

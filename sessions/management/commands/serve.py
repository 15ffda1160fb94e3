"""`manage.py serve`: the embedded default — daphne and the worker in ONE process.

Both run on daphne's event loop, so the in-memory channel layer reaches the
worker and wake-ups reach streams without Redis. Static files are served here
too (daphne does not), through staticfiles' ASGI handler: no extra dependency.

`--role web` serves HTTP, SSE and wake-ups only — no channels worker, no
supervisor — for the scale-out shape: several web processes on one
DATABASE_URL and REDIS_URL, and the agents driven by separate worker
processes (`manage.py runworker`). The default, `--role all`, is
the embedded server above.
"""

from __future__ import annotations

# daphne.server installs the asyncio Twisted reactor on import: it must come
# before anything imports twisted.internet.reactor, or the wrong reactor wins.
import daphne.server  # isort:skip  # noqa: F401

import asyncio
import logging

from channels.layers import get_channel_layer
from channels.routing import get_default_application
from channels.worker import Worker
from daphne.endpoints import build_endpoint_description_strings
from django.conf import settings
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.management.base import BaseCommand, CommandError
from twisted.internet import reactor  # daphne.server installed the asyncio reactor above

from daphne.server import twisted_loop

from sandboxes import config
from sessions import durability, wakeups
from sessions.worker import supervisor

log = logging.getLogger(__name__)


def default_port() -> int:
    return settings.PORT


class Command(BaseCommand):
    help = "Serve Alineo (HTTP, SSE and the worker) in one process on one event loop."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="Address to bind (default 127.0.0.1).")
        parser.add_argument(
            "--port", type=int, default=None, help="Port to bind (default $PORT or 8000; 0 picks a free one)."
        )
        parser.add_argument(
            "--role", choices=ROLES, default="all",
            help="all (default): HTTP, SSE and the worker in one process; "
                 "web: HTTP, SSE and wake-ups only, no worker (agents are driven elsewhere).",
        )

    def handle(self, *args, **options):
        host, port = options["host"], options["port"]
        port = default_port() if port is None else port
        if not 0 <= port <= 65535:
            raise CommandError(f"--port {port} is not a TCP port.")
        self.check_migrations()  # warns, like runserver, when `migrate` was not run
        log.info("database durability (read back): %s", durability.check_default())
        private_data_dir()
        run(host, port, self.stdout, role=options["role"])


ROLES = ("all", "web")


def private_data_dir() -> list[str]:
    """The data dir holds credential values and the bridges' sockets: private,
    also when an older release left it readable (sandboxes/config.py). A
    warning only when other users could read it; files `migrate` made with the
    usual umask inside a private dir (every first `make run`) are only noted."""
    data = config.data_dir()
    exposed = data.exposed()
    changed = data.tighten()
    if changed and exposed:
        log.warning("the data dir was readable by other users: made %d path(s) private "
                    "(0700/0600), e.g. %s", len(changed), changed[0])
    elif changed:
        log.info("made %d file(s) in the (private) data dir 0600, e.g. %s", len(changed), changed[0])
    return changed


def run(host: str, port: int, stdout, role: str = "all") -> None:
    """Run daphne's Server with the wake-up machinery on its loop, and the
    worker too unless role is "web"."""
    if role not in ROLES:
        raise CommandError(f"--role {role!r}: choose one of {', '.join(ROLES)}.")
    application = get_default_application()
    tasks: list[asyncio.Task | None] = []
    # Twisted may fire "when running" callbacks before the asyncio loop itself
    # runs; call_soon defers ours until it does, so they see a running loop.
    reactor.callWhenRunning(twisted_loop.call_soon, _start_background, twisted_loop, application, tasks, role)
    # Cancel our tasks before daphne's own shutdown, so nothing logs a
    # "Task was destroyed but it is pending" on SIGTERM.
    reactor.addSystemEventTrigger("before", "shutdown", _cancel, tasks)
    server = _Server(
        application=_with_static(application),
        endpoints=build_endpoint_description_strings(host=_endpoint_host(host), port=port),
        signal_handlers=True,  # SIGTERM/SIGINT stop the reactor cleanly
        on_listening=lambda h, p: _announce(stdout, h, p, role),
    )
    server.run()
    if server.listen_failed:
        raise CommandError(f"cannot listen on {host}:{port}: {server.listen_failed}")
    if None in tasks:
        raise CommandError("the worker did not start (see the log above).")
    stdout.write("Alineo stopped.\n")
    stdout.flush()


class _Server(daphne.server.Server):
    """daphne's Server that tells us once it really listens (and on which port,
    which matters with --port 0)."""

    def __init__(self, *args, on_listening, **kwargs):
        super().__init__(*args, **kwargs)
        self._on_listening = on_listening

    listen_failed = ""

    def listen_error(self, failure):
        # daphne only logs this and stops; remember it so the command exits non-zero.
        self.listen_failed = failure.getErrorMessage()
        super().listen_error(failure)

    def listen_success(self, port):
        super().listen_success(port)
        host = port.getHost()
        self._on_listening(host.host, host.port)


def _endpoint_host(host: str) -> str:
    # daphne's endpoint strings need IPv6 colons escaped and no brackets.
    host = host.strip("[]")
    return host.replace(":", r"\:") if ":" in host else host


def _announce(stdout, host: str, port: int, role: str = "all") -> None:
    shown = f"[{host}]" if ":" in host else host
    what = " (web role: no worker in this process)" if role == "web" else ""
    stdout.write(f"Alineo is serving on http://{shown}:{port}/{what} (Ctrl-C or SIGTERM stops it)\n")
    stdout.flush()


def _with_static(application):
    """Serve STATIC_URL from the finders (app dirs + STATICFILES_DIRS), no collectstatic."""
    return ASGIStaticFilesHandler(application)


def _start_background(loop: asyncio.AbstractEventLoop, application, tasks: list, role: str = "all") -> None:
    """On the running loop: bind wake-ups to it, start the worker (unless the
    role is web) and the watcher. If that fails, stop: serving without a
    worker would leave commands pending."""
    try:
        if role == "web":
            _start_wakeups(loop, tasks)
            log.info("web role: no worker or supervisor in this process")
        else:
            _start_worker_and_watcher(loop, application, tasks)
    except Exception:
        log.exception("could not start the worker; stopping")
        tasks.append(None)  # tells run() that start-up failed
        reactor.stop()


def _start_worker_and_watcher(loop: asyncio.AbstractEventLoop, application, tasks: list) -> None:
    wakeups.bind_loop(loop)
    worker = Worker(
        application=application,
        channels=[settings.ALINEO_WORKER_CHANNEL],
        channel_layer=get_channel_layer(),
    )
    tasks.append(_supervised(loop, worker.arun(), "worker"))
    log.info("worker listening on channel %s", settings.ALINEO_WORKER_CHANNEL)
    # The supervisor drives agents: reattaches to running sandboxes at boot and
    # acts on pending commands (sessions/worker/supervisor.py).
    tasks.append(supervisor.start(loop))
    _start_wakeups(loop, tasks)


def _start_wakeups(loop: asyncio.AbstractEventLoop, tasks: list) -> None:
    wakeups.bind_loop(loop)
    # The data_version watcher wakes streams when another process commits
    # (embedded SQLite default only; on Redis, wake-ups cross processes).
    started = wakeups.start_data_version_watcher(loop)
    if started is not None:
        tasks.append(started)


def _supervised(loop, coro, name: str) -> asyncio.Task:
    task = loop.create_task(coro, name=name)
    task.add_done_callback(_report_death)
    return task


def _report_death(task: asyncio.Task) -> None:
    # A dead worker would silently leave commands pending: say so loudly.
    if not task.cancelled() and task.exception() is not None:
        log.error("the %s stopped", task.get_name(), exc_info=task.exception())


def _cancel(tasks: list) -> None:
    for task in tasks:
        if task is not None:
            task.cancel()

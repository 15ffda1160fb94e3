"""`manage.py runworker`: a worker process of the scale-out shape.

It drives agents (sessions.worker.supervisor, starting at boot: agents whose
leases are free or expired are taken over through the ladder) and listens on
``settings.ALINEO_WORKER_CHANNEL`` for wake-ups — no HTTP. Run several of them
beside web processes (`manage.py serve --role web`), all with the same
``DATABASE_URL`` and ``REDIS_URL``; each agent is driven by exactly one
worker at a time through its lease (sessions/leases.py). See docs/DEPLOYMENT.md.

This replaces channels' own `runworker` (it comes first in INSTALLED_APPS):
with no channel named it listens on Alineo's; other channels may be named
and are served as channels' command would.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from channels.layers import get_channel_layer
from channels.routing import get_default_application
from channels.worker import Worker
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from sandboxes import config
from sessions import durability, leases, wakeups
from sessions.worker import supervisor

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run an Alineo worker: drive agents (leased) and listen for commands; no HTTP."

    def add_arguments(self, parser):
        parser.add_argument("channels", nargs="*",
                            help=f"Channels to listen on (default {settings.ALINEO_WORKER_CHANNEL}).")

    def handle(self, *args, **options):
        layer = get_channel_layer()
        if layer is None:
            raise CommandError("No CHANNEL_LAYERS configured.")
        channels = options["channels"] or [settings.ALINEO_WORKER_CHANNEL]
        self.check_migrations()
        log.info("database durability (read back): %s", durability.check_default())
        config.data_dir().tighten()  # private, like `serve` makes it
        self.stdout.write(f"Alineo worker {leases.holder()} listening on {', '.join(channels)} "
                          "(SIGTERM or Ctrl-C stops it)\n")
        self.stdout.flush()
        asyncio.run(_serve(layer, channels))
        self.stdout.write("Alineo worker stopped.\n")


async def _serve(layer, channels: list[str]) -> None:
    loop = asyncio.get_running_loop()
    wakeups.bind_loop(loop)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    listener = loop.create_task(Worker(application=get_default_application(), channels=channels,
                                       channel_layer=layer).arun(), name="worker")
    driving = supervisor.start(loop)
    stopper = loop.create_task(stop.wait())
    done, _ = await asyncio.wait({listener, driving, stopper}, return_when=asyncio.FIRST_COMPLETED)
    for task in (listener, driving, stopper):
        task.cancel()
    # Cancelling the supervisor stops its drivers and releases their leases.
    await asyncio.gather(listener, driving, stopper, return_exceptions=True)
    for task in done - {stopper}:
        if not task.cancelled() and task.exception() is not None:
            raise CommandError(f"the {task.get_name()} stopped: {task.exception()}")

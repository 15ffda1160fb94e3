"""The channels consumer that wakes the worker when a command is journaled.

Commands are journaled first (sessions/commands/) and only then announced on
settings.ALINEO_WORKER_CHANNEL as {"type": "command.pending", ...}. The
announcement carries no authority: the Command row is the truth, so a lost or
repeated message can delay work but never duplicate it. The consumer only
kicks this process's supervisor, which scans pending commands.
"""

from __future__ import annotations

import logging

from channels.consumer import AsyncConsumer

from . import supervisor

log = logging.getLogger(__name__)


class WorkerConsumer(AsyncConsumer):
    async def command_pending(self, message: dict) -> None:
        log.debug("command.pending received: %s", message)
        supervisor.kick()

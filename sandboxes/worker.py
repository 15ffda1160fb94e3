"""The worker: the channels consumer that acts on journaled commands.

Commands are journaled first (sessions.commands) and only then announced on
settings.ALINEO_WORKER_CHANNEL as {"type": "command.pending", ...}. The
announcement carries no authority: the Command row is the truth, so a lost or
repeated message can delay work but never duplicate it.

The consumer only wakes this process's supervisor (sandboxes.supervisor),
which scans pending commands and runs one driver per agent
(sandboxes.driver). In `manage.py serve` the supervisor is started at boot;
in `manage.py runworker alineo-worker` the first message starts it.
"""

from __future__ import annotations

import logging

from channels.consumer import AsyncConsumer

from sandboxes import supervisor

log = logging.getLogger(__name__)


class WorkerConsumer(AsyncConsumer):
    async def command_pending(self, message: dict) -> None:
        log.debug("command.pending received: %s", message)
        supervisor.kick()

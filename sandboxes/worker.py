"""The worker: the channels consumer that acts on journaled commands.

Commands are journaled first (sessions.commands) and only then announced on
settings.ALINEO_WORKER_CHANNEL as {"type": "command.pending", ...}. The
announcement carries no authority: the Command row is the truth, so a lost or
repeated message can delay work but never duplicate it.

For now this is a placeholder that only logs what it hears; the sandbox work
(backends, bridge, restore ladder) fills it in. It runs in `manage.py serve`
(embedded, same event loop as daphne) or in `manage.py runworker alineo-worker`.
"""

from __future__ import annotations

import logging

from channels.consumer import AsyncConsumer

log = logging.getLogger(__name__)


class WorkerConsumer(AsyncConsumer):
    async def command_pending(self, message: dict) -> None:
        # Nothing acts on commands yet: they stay pending in the database,
        # where the sandbox work's boot sweep will find them.
        log.debug("command.pending received: %s", message)

"""A driver's link to the bridge of its agent's sandbox: two connections to
the bridge's socket in the run dir (sandboxes/launch.py), one that long-polls
``events`` for the relay and one for every other op, and the bridge's
``status`` as it answered when connected."""

from __future__ import annotations

import logging

from sandboxes import launch
from sandboxes.bridge.protocol import Status
from sandboxes.bridge_client import BridgeClient, BridgeUnavailable

log = logging.getLogger(__name__)


class BridgeLink:
    def __init__(self, agent_id: str):
        self.agent_id = agent_id
        self.control: BridgeClient | None = None
        self.events: BridgeClient | None = None
        self.status: Status | None = None

    async def connect(self, retry_for: float) -> bool:
        """Connect both clients and check that the bridge answers ``status``
        (within ``retry_for`` s); False when it does not."""
        await self.disconnect()
        sock = str(launch.socket_path(self.agent_id))
        try:
            self.control = await BridgeClient.connect(sock, retry_for=retry_for)
            self.events = await BridgeClient.connect(sock, retry_for=retry_for)
            self.status = await self.control.status(timeout=max(retry_for, 5))
        except BridgeUnavailable as exc:
            log.info("agent %s: the bridge does not answer: %s", self.agent_id, exc)
            await self.disconnect()
            return False
        return True

    async def disconnect(self) -> None:
        for client in (self.control, self.events):
            if client is not None:
                await client.close()
        self.control = self.events = None

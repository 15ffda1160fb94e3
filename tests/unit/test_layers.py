"""alineo_site.layers: the embedded default's channel layer delivers like
channels' own, but scans for expired entries at most once a second."""

from __future__ import annotations

import asyncio

from alineo_site import layers


def test_group_messages_arrive_and_the_expiry_scan_runs_once_a_second(monkeypatch):
    scans = []
    monkeypatch.setattr(layers._ChannelsInMemoryLayer, "_clean_expired", lambda self: scans.append(1))
    clock = [1000.0]
    monkeypatch.setattr(layers.time, "monotonic", lambda: clock[0])
    layer = layers.InMemoryChannelLayer()

    async def exchange():
        names = [await layer.new_channel() for _ in range(50)]
        for name in names:
            await layer.group_add("agent.x", name)
        await layer.group_send("agent.x", {"type": "wake"})
        return [await layer.receive(name) for name in names]

    assert asyncio.run(exchange()) == [{"type": "wake"}] * 50
    assert len(scans) == 1  # 51 calls within the same second: one scan
    clock[0] += 1.5
    asyncio.run(layer.group_send("agent.x", {"type": "wake"}))
    assert len(scans) == 2


def test_expired_messages_are_still_dropped(monkeypatch):
    layer = layers.InMemoryChannelLayer(expiry=1)

    async def stale_then_fresh():
        name = await layer.new_channel()
        await layer.send(name, {"type": "old"})
        layer.channels[name]._queue[0] = (0, {"type": "old"})  # expired long ago
        layer._next_clean = 0.0
        layer._clean_expired()
        return name in layer.channels

    assert asyncio.run(stale_then_fresh()) is False

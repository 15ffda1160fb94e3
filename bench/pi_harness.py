#!/usr/bin/env python
"""The Pi harness against the built-in one, behind the same bridge and gateway
(the demo model, a unix socket, no sandbox): the first turn of a fresh session
(the bridge started on a new home, as from a warm setup snapshot with the
harness installed: time from the bridge's start to the first model output
event of a `say:` prompt), and the per-turn time of later `say:` turns, p50,
as ratios Pi / built-in measured in the same run.

Pi is installed (once per machine) before anything is timed; the bench
reports, not gates (target "info").
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _common as C  # noqa: E402

TURNS = 20
FIRST = ("message.delta", "message.assistant")


def _client(sock: str):
    from tests.unit.bridge.harness import BridgeClient  # the tests' synchronous client

    return BridgeClient(sock)


def _bridge(root: Path, harness: dict | None) -> subprocess.Popen:
    run, home = root / "run", root / "home"
    config = {"model": "demo", "gateway": {"port": 0}, **({"harness": harness} if harness else {})}
    (run / "config.json").write_text(json.dumps(config))
    return subprocess.Popen([sys.executable, "-S", "-m", "bridge", "--run-dir", str(run),
                             "--home", str(home)], cwd=ROOT / "sandboxes",
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
                                 "LANG": "C.UTF-8"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _events_until(client, after: int, types: tuple[str, ...], turn: int) -> int:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for e in client.events(after, wait=5):
            after = e["bseq"]
            if e["type"] in types and e["data"].get("turn") == turn:
                return after
    raise RuntimeError(f"no {types} for turn {turn}")


def measure(harness: dict | None, n: int) -> tuple[float, list[float]]:
    """(seconds from the bridge's start to turn 1's first model output, per-turn seconds)."""
    from sessions.gateway.demo import DemoUpstream
    from sessions.gateway.server import GatewayServer, Route

    root = Path(tempfile.mkdtemp(prefix="bpi-", dir="/tmp"))
    (root / "run").mkdir()
    (root / "home").mkdir()
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = GatewayServer(Route("bench", DemoUpstream()), root / "run" / "gateway.sock",
                           max_body=1 << 24)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    t0 = C.now()
    proc = _bridge(root, harness)
    try:
        client = _client(str(root / "run" / "bridge.sock"))
        while True:
            try:
                client.call("status", timeout=2)
                break
            except OSError:
                time.sleep(0.01)
        turn = client.ok("prompt", text="say: first")["turn"]
        cursor = _events_until(client, 0, FIRST, turn)
        first = C.now() - t0
        cursor = _events_until(client, cursor, ("turn.finished",), turn)
        per_turn = []
        for i in range(n):
            t = C.now()
            turn = client.ok("prompt", text=f"say: turn {i}")["turn"]
            cursor = _events_until(client, cursor, ("turn.finished",), turn)
            per_turn.append(C.now() - t)
        return first, per_turn
    finally:
        try:
            _client(str(root / "run" / "bridge.sock")).call("shutdown", timeout=5)
            proc.wait(20)
        except Exception:  # noqa: BLE001
            proc.kill()
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    args = C.parser(__doc__.splitlines()[0]).parse_args()
    n = 5 if args.quick else TURNS
    data = C.make_data_dir("pi", sockets=True)
    try:
        C.setup_django(data)
        from sandboxes.harnesses import ensure_pi

        t = C.now()
        install = ensure_pi()
        found_s = C.now() - t
        pi = install.bridge_config(str(install.host_dir))
        b_first, b_turns = measure(None, n)
        p_first, p_turns = measure(pi, n)
        b50, p50 = C.pct(b_turns, 50), C.pct(p_turns, 50)
        rows = [
            C.row("pi first turn: bridge start → first model output", p_first * 1e3,
                  b_first * 1e3, p_first / b_first, "info", "info", "ms",
                  note="baseline: the built-in harness, same bridge and gateway"),
            C.row("pi per-turn (say:) p50", p50 * 1e3, b50 * 1e3, p50 / b50, "info", "info", "ms",
                  note=f"{n} turns each; p99 {C.pct(p_turns, 99) * 1e3:.0f} ms vs "
                       f"{C.pct(b_turns, 99) * 1e3:.0f} ms; the installed tree was found in "
                       f"{found_s * 1e3:.1f} ms (built now: {install.built})"),
        ]
    finally:
        C.cleanup(data)
    C.emit(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

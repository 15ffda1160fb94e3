#!/usr/bin/env python
"""Model gateway overhead per call: an in-sandbox client's chat completion
through the bridge's forwarder (127.0.0.1) and the gateway's unix socket, to
the demo upstream, against the same demo model served directly by a plain
HTTP server on 127.0.0.1 — measured in the same run, p50 and p99.

Rows: the gateway without journaling (the wire: forwarder, HTTP parse, the
neutral call, the answer), and the gateway as the worker runs it (each call a
`model.call` fact, group-committed at synchronous=FULL, and a look for a
completed call to replay). The client is http.client on one kept-alive
connection, non-streaming, one short prompt with a tool call to answer.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _common as C  # noqa: E402

N = 400
BODY = {"model": "demo", "messages": [{"role": "user", "content": "run: ls -la"}],
        "tools": [{"type": "function", "function": {
            "name": "bash", "description": "run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]}


def timed_calls(port: int, n: int, vary: bool) -> list[float]:
    """Per-call seconds; ``vary`` makes every request a new call (no replay)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    for i in range(n):
        body = dict(BODY, messages=[{"role": "user", "content": f"run: ls -la {i if vary else ''}"}])
        raw = json.dumps(body)
        t = C.now()
        conn.request("POST", "/v1/chat/completions", body=raw,
                     headers={"content-type": "application/json"})
        answer = conn.getresponse().read()
        out.append(C.now() - t)
        assert b"tool_calls" in answer, answer[:200]
    conn.close()
    return out


def direct_server() -> ThreadingHTTPServer:
    from sessions.gateway import demo, openai_wire

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            super().setup()  # answers are two writes (head, body): no Nagle wait between
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            reply = demo.answer(openai_wire.parse(body))
            raw = json.dumps(openai_wire.completion(reply, "demo", "x")).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def through_gateway(sock: Path, journal, n: int) -> list[float]:
    from sandboxes.bridge.forward import Forwarder
    from sessions.gateway.demo import DemoUpstream
    from sessions.gateway.server import GatewayServer, Route

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = GatewayServer(Route("bench", DemoUpstream(), journal, {}), sock, max_body=1 << 25)
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    forwarder = Forwarder(str(sock)).start()
    try:
        return timed_calls(forwarder.port, n, vary=True)
    finally:
        forwarder.close()
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)


def rows_for(name: str, times: list[float], base: list[float]) -> list[dict]:
    p50, p99 = C.pct(times, 50) * 1e3, C.pct(times, 99) * 1e3
    b50, b99 = C.pct(base, 50) * 1e3, C.pct(base, 99) * 1e3
    return [C.row(f"gateway call p50: {name}", p50, b50, p50 / b50, "info", "info", "ms",
                  note=f"p99 {p99:.2f} ms vs direct {b99:.2f} ms ({p99 / b99:.2f}x)")]


def main() -> int:
    args = C.parser(__doc__.splitlines()[0]).parse_args()
    n = 60 if args.quick else N
    data = C.make_data_dir("gateway", sockets=True)
    try:
        C.setup_django(data)
        from sessions.gateway.journaled import CallJournal

        [agent_id] = C.make_agents(1, "bench-gateway")
        direct = direct_server()
        try:
            timed_calls(direct.server_address[1], 20, vary=True)  # warm up
            base = timed_calls(direct.server_address[1], n, vary=True)
        finally:
            direct.shutdown()
        plain = through_gateway(data / "g1.sock", None, n)
        journaled = through_gateway(data / "g2.sock", CallJournal(agent_id), n)
        rows = rows_for("wire only", plain, base) + rows_for("journaled (model.call)",
                                                             journaled, base)
        rows[-1]["note"] += f"; {n} calls each, baseline: the demo over plain HTTP on 127.0.0.1"
    finally:
        C.cleanup(data)
    C.emit(rows, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

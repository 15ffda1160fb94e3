"""A fake model server on 127.0.0.1 speaking the OpenAI chat-completions and
Anthropic Messages streaming wire formats, scripted one response per request.

The bridge's real provider code talks to it over HTTP: nothing is mocked.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


# --- OpenAI chat completions -------------------------------------------------------
def openai_chunk(delta: dict, finish: str | None = None) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def openai_events(text_chunks=(), tool_calls=()) -> list[str]:
    """SSE data payloads: text deltas, then tool calls whose arguments arrive in pieces."""
    out = [json.dumps(openai_chunk({"role": "assistant", "content": ""}))]
    out += [json.dumps(openai_chunk({"content": t})) for t in text_chunks]
    for i, (call_id, name, arg_pieces) in enumerate(tool_calls):
        out.append(json.dumps(openai_chunk({"tool_calls": [
            {"index": i, "id": call_id, "type": "function",
             "function": {"name": name, "arguments": ""}}]})))
        out += [json.dumps(openai_chunk({"tool_calls": [
                    {"index": i, "function": {"arguments": p}}]}))
                for p in arg_pieces]
    out.append(json.dumps(openai_chunk({}, "tool_calls" if tool_calls else "stop")))
    out.append("[DONE]")
    return out


def openai_completion(text_chunks=(), tool_calls=()) -> "Raw":
    """The same answer as openai_events, as one (non-streaming) completion:
    what the model gateway, which calls upstreams without streaming, reads."""
    message = {"role": "assistant", "content": "".join(text_chunks) or None}
    if tool_calls:
        message["tool_calls"] = [{"id": call_id, "type": "function",
                                  "function": {"name": name, "arguments": "".join(pieces)}}
                                 for call_id, name, pieces in tool_calls]
    return Raw(200, json.dumps({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "fake",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5}}).encode())


# --- Anthropic messages ---------------------------------------------------------------
def anthropic_events(text_chunks=(), tool_uses=()) -> list[tuple[str, str]]:
    ev = [("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "fake",
        "stop_reason": None, "usage": {"input_tokens": 1, "output_tokens": 1}}})]
    index = 0
    if text_chunks:
        ev.append(("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}}))
        ev.append(("ping", {"type": "ping"}))
        ev += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": t}})
               for t in text_chunks]
        ev.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
        index = 1
    for i, (tool_id, name, json_pieces) in enumerate(tool_uses, start=index):
        ev.append(("content_block_start", {
            "type": "content_block_start", "index": i,
            "content_block": {"type": "tool_use", "id": tool_id, "name": name, "input": {}}}))
        ev += [("content_block_delta", {"type": "content_block_delta", "index": i,
                                        "delta": {"type": "input_json_delta", "partial_json": p}})
               for p in json_pieces]
        ev.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    ev.append(("message_delta", {"type": "message_delta", "delta": {
        "stop_reason": "tool_use" if tool_uses else "end_turn"}, "usage": {"output_tokens": 5}}))
    ev.append(("message_stop", {"type": "message_stop"}))
    return [(name, json.dumps(data)) for name, data in ev]


# --- scripted responses -------------------------------------------------------------------
class SSE:
    """Stream these events; ``cut_after`` closes the connection after that many."""

    def __init__(self, events, cut_after: int | None = None):
        self.events = [e if isinstance(e, tuple) else (None, e) for e in events]
        self.cut_after = cut_after

    def send(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.end_headers()
        for i, (name, data) in enumerate(self.events):
            if self.cut_after is not None and i >= self.cut_after:
                return  # HTTP/1.0 without a length: returning closes mid-stream
            frame = (f"event: {name}\n" if name else "") + f"data: {data}\n\n"
            handler.wfile.write(frame.encode())
            handler.wfile.flush()


class Raw:
    def __init__(self, status: int, body: bytes, content_type: str = "application/json"):
        self.status, self.body, self.content_type = status, body, content_type

    def send(self, handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(self.status)
        handler.send_header("content-type", self.content_type)
        handler.send_header("content-length", str(len(self.body)))
        handler.end_headers()
        handler.wfile.write(self.body)


class Hang:
    """Accept the request and say nothing for a while (a model server timing out)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def send(self, handler: BaseHTTPRequestHandler) -> None:
        time.sleep(self.seconds)


class Gate:
    """Hold the answer until ``open`` is called (a model still thinking), then
    send ``then``; an answer to a connection that died meanwhile goes nowhere."""

    def __init__(self, then: "Raw"):
        self.then = then
        self.opened = threading.Event()

    def open(self) -> None:
        self.opened.set()

    def send(self, handler: BaseHTTPRequestHandler) -> None:
        self.opened.wait(120)
        try:
            self.then.send(handler)
        except OSError:
            pass


class FakeModelServer:
    def __init__(self) -> None:
        self.script: list = []
        #: Or: answer each request by what it asks (request -> a response), not in order.
        self.respond = None
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with server._lock:
                    headers = {k.lower(): v for k, v in self.headers.items()}
                    server.requests.append({"path": self.path, "headers": headers,
                                            "body": json.loads(body)})
                    response = (server.respond(server.requests[-1]) if server.respond
                                else server.script.pop(0) if server.script
                                else Raw(500, b'{"error":"no script"}'))
                response.send(self)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "FakeModelServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

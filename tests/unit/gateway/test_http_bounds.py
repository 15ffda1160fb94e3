"""What a sandbox can send the gateway by hand: every malformed request is a
4xx, the listener keeps serving, and the socket alone names the agent."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from sessions.gateway.messages import ModelReply


def raw(sock_path, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(sock_path))
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize("request_bytes, expected", [
    (b"GARBAGE\r\n\r\n", 400),
    (b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 5\r\nconnection: close\r\n\r\nnot{}", 400),
    (b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 3\r\nconnection: close\r\n\r\nNaN", 400),
    (b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 2\r\nconnection: close\r\n\r\n[]", 400),
    (b"POST /v1/messages HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n", 411),
    (b"POST /v1/messages HTTP/1.1\r\ncontent-length: 99999999\r\n\r\n", 413),
    (b"POST /v1/messages HTTP/1.1\r\ncontent-length: -1\r\n\r\n", 400),
    (b"GET /v1/" + b"x" * 20000 + b" HTTP/1.1\r\n\r\n", 431),
    (b"GET /v1/models HTTP/1.1\r\n" + b"h: v\r\n" * 101 + b"\r\n", 431),
    (b"GET /etc/passwd HTTP/1.1\r\nconnection: close\r\n\r\n", 404),
])
def test_malformed_requests_are_4xx_and_the_listener_keeps_serving(serve, request_bytes, expected):
    sock = serve()
    answer = raw(sock, request_bytes)
    assert status(answer) == expected, answer[:300]
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["message"]
    again = raw(sock, b"GET /v1/models HTTP/1.1\r\nconnection: close\r\n\r\n")
    assert status(again) == 200


def test_deeply_nested_json_is_a_400(serve):
    body = b"[" * 100_000 + b"]" * 100_000
    head = b"POST /v1/chat/completions HTTP/1.1\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
    assert status(raw(serve(), head % len(body) + body)) == 400


class Named:
    """An upstream that says whose socket it serves."""

    def __init__(self, name):
        self.label = name

    async def complete(self, request):
        return ModelReply(f"answered by {self.label}")

    def model_ids(self):
        return [self.label]


def test_the_socket_names_the_agent_not_the_request(serve):
    mine = serve(Named("upstream-of-a-1"), agent_id="a-1")
    serve(Named("upstream-of-a-2"), agent_id="a-2")
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(mine))) as client:
        answer = client.post("http://gateway/v1/chat/completions",
                             headers={"x-alineo-agent": "a-2", "authorization": "Bearer a-2"},
                             json={"model": "upstream-of-a-2",
                                   "messages": [{"role": "user", "content": "hi"}]})
    assert answer.json()["choices"][0]["message"]["content"] == "answered by upstream-of-a-1"


def test_keep_alive_serves_many_requests_on_one_connection(serve):
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(serve()))) as client:
        for i in range(5):
            got = client.post("http://gateway/v1/chat/completions", json={
                "model": "demo", "stream": i % 2 == 1,
                "messages": [{"role": "user", "content": f"say: {i}"}]})
            assert got.status_code == 200 and f"[demo] {i}" in got.text

"""A TCP proxy for the stream-drop test: forwards everything to the server,
but cuts every SSE stream connection (a request for .../stream) after
`cut_after` bytes of its answer — mid-line, mid-event — as a server or a
load balancer that drops a connection would."""

from __future__ import annotations

import socket
import threading


class CuttingProxy:
    def __init__(self, upstream_port: int, cut_after: int):
        self.upstream_port, self.cut_after = upstream_port, cut_after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.streams = 0  # stream connections served
        self.cuts = 0     # of which were cut
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        first = client.recv(65536)
        is_stream = b"/stream" in first.split(b"\r\n", 1)[0]
        if is_stream:
            self.streams += 1
        upstream.sendall(first)
        threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
        sent = 0
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    break
                if is_stream and sent + len(data) >= self.cut_after:
                    client.sendall(data[: self.cut_after - sent])
                    self.cuts += 1
                    break
                client.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for s in (client, upstream):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass

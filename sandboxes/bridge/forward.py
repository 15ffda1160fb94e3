"""The sandbox's way to the model gateway: a TCP listener on 127.0.0.1 in the
sandbox's own network namespace (Docker's `none` and bubblewrap keep `lo`)
that forwards each connection, byte for byte, to the gateway's unix socket in
the run dir (docs/GATEWAY.md). The gateway knows the agent by that socket;
nothing the forwarder or a harness adds can change it.

When the socket is not there yet (the control plane is restarting), a new
connection waits for it up to ``wait_s`` seconds before it is dropped, so a
model call made across a control-plane restart is delayed, not failed.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

log = logging.getLogger("bridge")

BUFFER = 64 * 1024
MAX_CONNECTIONS = 32
RETRY_S = 0.2


class Forwarder:
    def __init__(self, gateway_socket: str, port: int = 0, *, wait_s: float = 60.0):
        self.gateway_socket = gateway_socket
        self.wait_s = wait_s
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.closed = threading.Event()

    def start(self) -> "Forwarder":
        threading.Thread(target=self._accept, name="gateway-forward", daemon=True).start()
        return self

    def close(self) -> None:
        self.closed.set()
        try:
            self.listener.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.slots.acquire(blocking=False):
                client.close()
                continue
            # Streamed answers are many small writes: send each at once.
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = self._connect()
            if upstream is None:
                return
            with upstream:
                other = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
                other.start()
                _pump(client, upstream)
                other.join()
        finally:
            client.close()
            self.slots.release()

    def _connect(self) -> socket.socket | None:
        deadline = time.monotonic() + self.wait_s
        while not self.closed.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.gateway_socket)
                return sock
            except OSError:
                sock.close()
                if time.monotonic() >= deadline:
                    log.warning("the model gateway (%s) does not answer", self.gateway_socket)
                    return None
                time.sleep(RETRY_S)
        return None


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy until src ends, then tell dst no more is coming."""
    try:
        while data := src.recv(BUFFER):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

"""The unix socket: JSON lines in, one JSON line out per request.

Each connection is served by its own thread, requests on one connection in
order (a long-polling `events` holds only its own connection). A client going
away never affects turns: they belong to the runner thread.
"""

from __future__ import annotations

import logging
import os
import socketserver

from .ops import OpError, Ops
from .protocol import (
    MAX_LINE,
    MAX_MESSAGE,
    MAX_SOCKET_PATH,
    ErrorCode,
    ErrorInfo,
    ProtocolError,
    decode_line,
    encode_line,
    error_answer,
    ok_answer,
)

log = logging.getLogger("bridge")


class _Handler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        ops: Ops = self.server.ops
        while True:
            try:
                line = self.rfile.readline(MAX_LINE)
            except OSError:
                return
            if not line:
                return
            if not line.strip():
                continue
            response = _respond(ops, line)
            try:
                self.wfile.write(encode_line(response))
                self.wfile.flush()
            except OSError:
                return  # the client left; nothing else depends on it
            finally:
                ops.after_response()


def _respond(ops: Ops, line: bytes) -> dict:
    try:
        req = decode_line(line)
    except ProtocolError:
        return _error(None, ErrorInfo(ErrorCode.BAD_JSON, "the request line is not JSON"))
    if not isinstance(req, dict):
        return _error(None, ErrorInfo(ErrorCode.BAD_REQUEST, "a request is a JSON object"))
    rid = req.get("id")
    try:
        return ok_answer(rid, ops.handle(req))
    except OpError as exc:
        return _error(rid, exc.info())
    except Exception as exc:  # noqa: BLE001 - answer, log, keep serving
        log.exception("op %r failed", req.get("op"))
        return _error(rid, ErrorInfo(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"))


def _error(rid, error: ErrorInfo) -> dict:
    # The host refuses longer messages (protocol.py): cut ours to fit.
    if len(error.message) > MAX_MESSAGE:
        error = ErrorInfo(error.code, error.message[:MAX_MESSAGE], error.extra)
    return error_answer(rid, error)


def socket_mode(run_dir: str) -> int:
    """Only the control plane may drive a bridge. When the run dir is ours (the
    control plane runs as the uid we run as, or the dir was made for us), the
    socket is 0600. Otherwise — a non-root control plane with a container
    whose bridge runs as root — it must be 0666 for the control plane to
    connect, and the data dir around it (0700, sandboxes/config.py) is what
    keeps other users out: no one else can reach the path."""
    return 0o600 if os.stat(run_dir).st_uid == os.getuid() else 0o666


class BridgeServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, path: str, ops: Ops):
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise ValueError(f"socket path is {len(os.fsencode(path))} bytes; "
                             f"AF_UNIX allows {MAX_SOCKET_PATH}")
        # A socket left by a dead bridge refuses connections: replace it. The
        # session lock, taken before this, guarantees no live bridge owns it.
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self.ops = ops
        super().__init__(path, _Handler)
        os.chmod(path, socket_mode(os.path.dirname(path)))

"""Wiring: session, provider, tools, runner, socket server, signals."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path

from . import config as cfg
from .forward import Forwarder
from .harness import Harness
from .hooks import Hooks
from .ops import Ops
from .pi import PiHarness
from .pi_extension import BRIDGE_TOOLS, ExtensionConfig
from .pi_rpc import PI_TOOLS, PiCommand
from .redact import RedactingFilter, Redactor, placeholder
from .providers import make_provider
from .requests import Requests
from .runner import SYSTEM_PROMPT, Runner
from .server import BridgeServer
from .session import Session, SessionFile, SessionLocked, new_state
from .tools import ToolContext, ToolLimits, schemas

log = logging.getLogger("bridge")

EXIT_CONFIG = 2
EXIT_LOCKED = 3
EXIT_HOME = 4


#: Stack per thread (the socket server's, the gateway forwarder's …). The
#: default is RLIMIT_STACK, 8 MiB of address space each: under the local
#: sandbox's RLIMIT_AS (its memory_mb) a few threads would use up a 64 MB
#: agent before it ran a tool.
THREAD_STACK = 1024 * 1024


def main(argv=None) -> int:
    threading.stack_size(THREAD_STACK)
    args = cfg.parse_args(argv)
    Path(args.run_dir).mkdir(parents=True, exist_ok=True)
    _setup_logging(args.run_dir)
    if args.wait_home and not cfg.wait_for_home(args.run_dir):
        # Never a session on a half-written home: the ladder restores again.
        log.error("the home was not completed within %d s; not starting", cfg.WAIT_HOME_S)
        return EXIT_HOME
    try:
        config = cfg.load_config(args.run_dir, args.config)
        environ = _environ(args.run_dir, config)
        provider = make_provider(config, environ)
        cfg.harness_config(config)
    except (ValueError, OSError) as exc:
        log.error("bad configuration: %s", exc)
        return EXIT_CONFIG
    redactor = Redactor.from_config(config, os.environ, cfg.secret_env_names(config))
    log.addFilter(RedactingFilter(redactor))
    file = SessionFile(args.home, redactor)
    try:
        file.acquire()
    except SessionLocked as exc:
        log.error("%s: refusing to run the session twice", exc)
        return EXIT_LOCKED
    return _serve(args, config, provider, file, environ)


def _environ(run_dir: str, config: dict) -> dict:
    """The environment of providers, tools and hooks. With a gateway, its
    forwarder is started here and the model's base URLs point at it."""
    environ = dict(os.environ)
    gateway = config.get("gateway")
    if gateway:
        if not isinstance(gateway, dict) or not isinstance(gateway.get("port", 0), int):
            raise ValueError("gateway must be {\"port\": <int>}")
        forwarder = Forwarder(os.path.join(run_dir, "gateway.sock"), gateway.get("port", 0))
        environ.update(cfg.gateway_env(forwarder.start().port))
        log.info("model gateway on 127.0.0.1:%d", forwarder.port)
    return environ


def _serve(args, config: dict, provider, file: SessionFile, environ: dict) -> int:
    state = file.load()
    resumed = state is not None
    session = Session(file, state or new_state())
    seed = cfg.load_seed(args.seed) if args.seed and not resumed else None
    if args.seed and resumed:
        log.info("ignoring --seed: %s already holds a session", file.path)
    requests = Requests()
    runner = _make_runner(args, config, provider, session, requests, environ)
    runner.resume(resumed, "resume" if resumed or seed else "startup")
    if seed:
        runner.seed(*seed)
    stop = threading.Event()
    ops = Ops(session, runner, requests, stop.set)
    server = BridgeServer(os.path.join(args.run_dir, "bridge.sock"), ops)
    threading.Thread(target=server.serve_forever, name="server", daemon=True).start()
    runner.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("bridge serving %s (model %s, %s session %s, head %d)",
             server.server_address, provider.label, "resumed" if resumed else "new",
             session.state["session_id"], session.head())
    while not stop.wait(1.0):
        pass
    return _shutdown(runner, server)


def _make_runner(args, config, provider, session, requests, environ: dict) -> Harness:
    secrets = cfg.secret_env_names(config)
    tool_env = {k: v for k, v in environ.items() if k not in secrets}
    harness = cfg.harness_config(config)
    limits = config.get("limits") or {}
    names = ("bash_timeout", "bash_timeout_max", "request_timeout")
    tool_limits = ToolLimits(**{k: float(limits[k]) for k in names if k in limits})
    enabled = config.get("tools")
    ctx = ToolContext(home=args.home, run_dir=args.run_dir, env=tool_env, requests=requests,
                      emit=lambda *_: None, limits=tool_limits,
                      enabled=frozenset(enabled) if enabled is not None else None)
    if harness is not None:
        return _make_pi(args, config, provider, session, ctx, harness)
    return Runner(session, provider, ctx, schemas(config.get("tools")),
                  Hooks(config.get("hooks"), args.home, tool_env),
                  max_steps=int(limits.get("max_steps") or 50),
                  system=config.get("system") or SYSTEM_PROMPT)


def _make_pi(args, config, provider, session, ctx: ToolContext, harness: dict) -> PiHarness:
    enabled, hooks = config.get("tools"), Hooks(config.get("hooks"), args.home, ctx.env)
    tools = tuple(t for t in PI_TOOLS if enabled is None or t in enabled)
    extension = ExtensionConfig(
        pre_tool_use=hooks.has("pre_tool_use"),
        tools=tuple(t for t in BRIDGE_TOOLS if enabled is None or t in enabled),
        redact=tuple((b["env"], placeholder(str(b.get("name") or b["env"])))
                     for b in config.get("redact") or []
                     if isinstance(b, dict) and isinstance(b.get("env"), str)))
    command = PiCommand(node=harness["node"], cli=harness["cli"], home=args.home,
                        base_url=ctx.env["OPENAI_BASE_URL"], api_key=cfg.GATEWAY_KEY,
                        label=provider.label, tools=tools, env=ctx.env, extension=extension,
                        run_dir=args.run_dir)
    return PiHarness(session, hooks, provider.label, command, ctx)


def _shutdown(runner: Harness, server: BridgeServer) -> int:
    log.info("bridge shutting down")
    runner.stop()
    server.shutdown()
    server.server_close()
    try:
        os.unlink(server.server_address)
    except OSError:
        pass
    runner.thread.join(timeout=10)
    return 0


def _setup_logging(run_dir: str) -> None:
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(threadName)s %(message)s")
    logger = logging.getLogger("bridge")
    logger.setLevel(logging.INFO)
    for handler in (logging.FileHandler(os.path.join(run_dir, "bridge.log")),
                    logging.StreamHandler(sys.stderr)):
        handler.setFormatter(fmt)
        logger.addHandler(handler)

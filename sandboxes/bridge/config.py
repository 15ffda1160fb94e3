"""Configuration: command line and environment for places, RUN_DIR/config.json
(written by the control plane) for the agent. Secrets never come from here:
the config names the environment variables that hold them."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from .protocol import HOME_READY

DEFAULTS = {
    "agent_id": None,
    "model": "demo",
    "provider": {},       # base_url_env, api_key_env, timeout, max_tokens
    "tools": None,        # None = all tools
    "hooks": {},          # session_start, pre_tool_use, stop: shell commands
    "limits": {},         # bash_timeout, bash_timeout_max, request_timeout, max_steps
    "system": None,       # system prompt override
    "redact": [],         # bound credentials [{"name", "env"}]: their values never written
    "gateway": None,      # {"port": 0}: models through the control plane's gateway (forward.py)
    "harness": None,      # None: the built-in one; {"name": "pi", "node", "cli"} (pi.py)
}

#: The key a harness is given when it calls through the gateway: a placeholder,
#: never a credential (the gateway knows the agent by its socket).
GATEWAY_KEY = "alineo-gateway"

SECRET_ENV_DEFAULTS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


#: How long a bridge started with --wait-home waits for the run dir's
#: HOME_READY (written by the control plane once a restored home is complete).
WAIT_HOME_S = 900


def wait_for_home(run_dir: str, limit_s: float = WAIT_HOME_S) -> bool:
    """True once RUN_DIR/home.ready exists; False after ``limit_s``."""
    marker = Path(run_dir) / HOME_READY
    deadline = time.monotonic() + limit_s
    while not marker.exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bridge", description="Alineo's in-sandbox agent bridge")
    p.add_argument("--run-dir", default=os.environ.get("ALINEO_RUN_DIR"),
                   help="holds bridge.sock, config.json, bridge.log (env ALINEO_RUN_DIR)")
    p.add_argument("--home", default=os.environ.get("HOME"),
                   help="the agent's home; the session file is HOME/.alineo/session.json")
    p.add_argument("--config", help="config file (default RUN_DIR/config.json)")
    p.add_argument("--seed", help="JSON file with a conversation to start a fresh session from")
    p.add_argument("--wait-home", action="store_true",
                   help=f"wait (at most {WAIT_HOME_S} s) for RUN_DIR/{HOME_READY} before reading "
                        "the home: the control plane is still writing it (a restore, a fork)")
    args = p.parse_args(argv)
    if not args.run_dir or not args.home:
        p.error("--run-dir (or ALINEO_RUN_DIR) and --home (or HOME) are required")
    args.run_dir = str(Path(args.run_dir).resolve())
    args.home = str(Path(args.home).resolve())
    return args


def load_config(run_dir: str, path: str | None = None) -> dict:
    config_path = Path(path) if path else Path(run_dir) / "config.json"
    config = dict(DEFAULTS)
    if config_path.exists():
        with open(config_path, encoding="utf-8") as fh:
            loaded = json.load(fh)
        if not isinstance(loaded, dict):
            raise ValueError(f"{config_path}: the config must be a JSON object")
        config.update(loaded)
    return config


def secret_env_names(config: dict) -> set[str]:
    """Environment variables that hold model credentials: kept from tools' env.
    Through the gateway the model's key is a placeholder: no secret to keep."""
    if config.get("gateway"):
        return set()
    kind = (config.get("model") or "demo").partition(":")[0]
    names = {SECRET_ENV_DEFAULTS[kind]} if kind in SECRET_ENV_DEFAULTS else set()
    key_env = (config.get("provider") or {}).get("api_key_env")
    if key_env:
        names.add(key_env)
    return names


def gateway_env(port: int) -> dict[str, str]:
    """What a harness needs to call the gateway through the forwarder."""
    base = f"http://127.0.0.1:{port}"
    return {"OPENAI_BASE_URL": f"{base}/v1", "ANTHROPIC_BASE_URL": base,
            "OPENAI_API_KEY": GATEWAY_KEY, "ANTHROPIC_API_KEY": GATEWAY_KEY}


def harness_config(config: dict) -> dict | None:
    """The harness the config names (None: the built-in one); ValueError when it is wrong."""
    harness = config.get("harness")
    if harness is None or harness == "builtin":
        return None
    if not isinstance(harness, dict) or harness.get("name") != "pi":
        raise ValueError('harness must be {"name": "pi", "node": <path>, "cli": <path>}')
    for key in ("node", "cli"):
        if not isinstance(harness.get(key), str) or not harness[key]:
            raise ValueError(f"harness.{key} must be a path")
    if not config.get("gateway"):
        raise ValueError('the pi harness calls its model through the gateway: "gateway" is needed')
    return harness


def load_seed(path: str) -> tuple[list, int | None]:
    """A seed file is a list of messages, or {"messages": [...], "turns": N}."""
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if isinstance(data, dict):
        return data.get("messages"), data.get("turns")
    return data, None

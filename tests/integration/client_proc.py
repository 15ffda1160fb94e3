"""A client process for tests/integration/test_client.py: the client package
loaded on its own (no Django), driving one agent, printing one JSON line per
chunk (flushed), so the test can kill it at any point and know its cursor.

    client_proc.py start URL TOKEN TEXT          → {"agent"} then chunks, then {"end"}
    client_proc.py follow URL TOKEN AGENT AFTER  → {"rung", "sandbox_id"} then chunks, then {"end"}
"""

import importlib.util
import json
import sys
from pathlib import Path

CLIENT = Path(__file__).resolve().parents[2] / "sessions" / "client"


def load_client():
    spec = importlib.util.spec_from_file_location(
        "alineo_client", CLIENT / "__init__.py", submodule_search_locations=[str(CLIENT)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["alineo_client"] = module
    spec.loader.exec_module(module)
    assert "django" not in sys.modules, "the client imported Django"
    return module


def say(**fields):
    print(json.dumps(fields), flush=True)


def main(argv):
    client = load_client()
    mode, url, token = argv[1], argv[2], argv[3]
    if mode == "start":
        agent = client.Alineo.start({"model": "demo"}, url=url, token=token)
        say(agent=agent.id)
        turn = agent.prompt(argv[4])
    else:
        agent = client.Alineo.reattach(argv[4], url=url, token=token)
        say(rung=agent.rung, sandbox_id=agent.sandbox_id)
        turn = agent.follow(after=int(argv[5]))
    for chunk in turn:
        say(kind=chunk.kind, text=chunk.text, seq=chunk.seq)
    say(end=turn.outcome, turn=turn.number, text=turn.text)


if __name__ == "__main__":
    main(sys.argv)

#!/usr/bin/env python3
"""Get back in to an agent from any process: try reattach, fall back to resume.

    ALINEO_URL=http://127.0.0.1:8000 ALINEO_TOKEN=aln_… python3 examples/reattach_or_resume.py AGENT_ID
    python3 examples/reattach_or_resume.py --url http://127.0.0.1:8000 --token aln_… AGENT_ID ["say: hi"]
    python3 examples/reattach_or_resume.py --new ["say: hi"]          # start one first

A bad token, a server that does not answer (after --retry-for seconds) or a
malformed URL is one line on stderr and exit status 1.

Only the standard library and the client package sessions/client/ (copy that
directory next to this script, or run it from the repository). It prints the rung it got back in
by, the rest of a turn that was running, then the reply to an optional prompt.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)                                   # client/ copied next to this file
sys.path.insert(0, os.path.join(HERE, "..", "sessions"))   # or run from the repository

from client import (  # noqa: E402
    AgentEnded, Alineo, AlineoError, AuthError, BridgeUnavailable, NotFound, TransportError,
    text_only)


def get_back_in(agent_id: str, url: str, token: str, retry_for: float):
    """The usual pattern: keep the bridge if it answers (a running turn keeps
    running), else restart it on its session (a running turn is dropped)."""
    try:
        return Alineo.reattach(agent_id, url=url, token=token, retry_for=retry_for)
    except BridgeUnavailable as exc:
        print(f"reattach: {exc.message}; resuming instead", file=sys.stderr)
        return Alineo.resume(agent_id, url=url, token=token, retry_for=retry_for)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("agent_id", nargs="?", help="the agent to get back in to")
    p.add_argument("prompt", nargs="?", help="a prompt to send afterwards, e.g. 'say: hi'")
    p.add_argument("--url", default=os.environ.get("ALINEO_URL", "http://127.0.0.1:8000"))
    p.add_argument("--token", default=os.environ.get("ALINEO_TOKEN"))
    p.add_argument("--new", action="store_true", help="start a new demo agent first")
    p.add_argument("--retry-for", type=float, default=30.0, metavar="SECONDS",
                   help="how long to keep trying a server that does not answer (default 30)")
    args = p.parse_args()
    if not args.token:
        p.error("give --token or set ALINEO_TOKEN (manage.py issue_token USERNAME)")
    if not args.agent_id and not args.new:
        p.error("give an agent id (or --new)")
    try:
        if args.new:  # inside the try: a bad token or URL is a message, not a traceback
            args.prompt = args.prompt or args.agent_id
            args.agent_id = Alineo.start({"model": "demo"}, url=args.url, token=args.token,
                                         retry_for=args.retry_for).id
            print(f"started {args.agent_id}")
        agent = get_back_in(args.agent_id, args.url, args.token, args.retry_for)
        print(f"back in to {agent.id} by {agent.rung} (sandbox {agent.sandbox_id})")
        running = agent.follow()                  # the rest of a running turn, if any
        for text in text_only(running):
            print(text, end="", flush=True)
        if running.outcome:
            print(f"\n[turn {running.number} {running.outcome}]")
        if args.prompt:
            turn = agent.prompt(args.prompt)
            for text in text_only(turn):
                print(text, end="", flush=True)
            print(f"\n[turn {turn.number} {turn.outcome}]")
    except NotFound:
        print(f"no agent {args.agent_id} (or not in your workspace)", file=sys.stderr)
        return 2
    except AgentEnded as exc:
        print(f"the agent has ended: {exc.message}", file=sys.stderr)
        return 3
    except AuthError as exc:
        print(f"the server at {args.url} refused the token ({exc.code}); issue one with "
              "manage.py issue_token USERNAME, run with the server's ALINEO_DATA_DIR",
              file=sys.stderr)
        return 1
    except TransportError as exc:
        print(f"cannot reach Alineo at {args.url} ({exc.message}); is the server running?",
              file=sys.stderr)
        return 1
    except AlineoError as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

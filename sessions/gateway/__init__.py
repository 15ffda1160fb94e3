"""The model gateway (docs/GATEWAY.md): per sandbox, an OpenAI-compatible and
an Anthropic-compatible HTTP API on a unix socket in its run dir, answered by
the agent's upstream (the demo model, an OpenAI-compatible server, Anthropic),
every call journaled. Worker side: the listener knows
its agent by the socket alone.

    server.py          GatewayServer (one socket, one Route), the endpoints
    httpio.py          bounded HTTP/1.1 over asyncio streams
    openai_wire.py     chat completions <-> the neutral call (messages.py)
    anthropic_wire.py  messages <-> the neutral call
    fields.py          strict readers of the untrusted JSON
    demo.py            the demo model as an upstream (directives shared with the bridge)
    upstreams.py       OpenAI-compatible and Anthropic upstreams; the key is added here
    calls.py           a call as a fact (model.call), its request hash, its cost
    journaled.py       CallJournal: model.call / model.replayed in the agent's transcript
    usage.py           usage per agent and turn, folded from the facts
    budget.py          daily budgets per workspace: today's spending, the refusal
    hub.py             the worker's side: open_listener for a driven agent
    errors.py          GatewayError, the root
"""

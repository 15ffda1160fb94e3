"""The model gateway (docs/GATEWAY.md): per sandbox, an OpenAI-compatible and
an Anthropic-compatible HTTP API on a unix socket in its run dir, answered by
the agent's upstream (the demo model here). Worker side: the listener knows
its agent by the socket alone.

    server.py          GatewayServer (one socket, one Route), the endpoints
    httpio.py          bounded HTTP/1.1 over asyncio streams
    openai_wire.py     chat completions <-> the neutral call (messages.py)
    anthropic_wire.py  messages <-> the neutral call
    fields.py          strict readers of the untrusted JSON
    demo.py            the demo model as an upstream (directives shared with the bridge)
    errors.py          GatewayError, the root
"""

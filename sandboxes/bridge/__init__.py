"""Alineo's in-sandbox bridge: runs turns, keeps the session file, numbers its events.

Standard library only: it runs in any image with python3 (3.11+). Run it as
``python3 -m bridge`` from the directory holding this package, or as
``python3 /path/to/bridge/__main__.py``. The protocol is in docs/BRIDGE.md and
protocol.py, which the host imports too: keep this module free of imports, so
that importing ``sandboxes.bridge.protocol`` loads nothing of the runner.
"""

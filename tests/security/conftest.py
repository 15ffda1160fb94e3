"""The security suite reuses the integration suite's live worlds (a real
server on each backend, tests/integration/conftest.py)."""

from tests.integration.conftest import (  # noqa: F401 - fixtures, by name
    remove_sandboxes_made_by_live_servers,
    alineo_server,
    alineo_server_factory,
    world,
)

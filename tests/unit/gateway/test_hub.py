"""The worker's listeners: which models, which socket mode, whose socket."""

from __future__ import annotations

import os
import stat

import pytest

from sandboxes import launch
from sessions.gateway import hub


@pytest.mark.parametrize("model, served", [
    ("demo", True), (None, True), ("openai:gpt-x", True), ("anthropic:claude", True),
    ("openai:", False), ("mystery", False)])
def test_which_models_the_gateway_answers(model, served):
    assert launch.through_gateway(model) is served


def test_a_listener_opens_on_the_run_dirs_socket_private_to_its_owner(loop, short_dir):
    server = loop.run(hub.open_listener("a-1", "demo", short_dir))
    try:
        mode = os.stat(short_dir / "gateway.sock").st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    finally:
        loop.run(server.close())
    assert not (short_dir / "gateway.sock").exists()


def test_a_run_dir_others_must_write_gets_a_socket_they_can_reach(short_dir):
    short_dir.chmod(0o1733)
    assert hub.socket_mode(short_dir) == 0o666
    short_dir.chmod(0o700)
    assert hub.socket_mode(short_dir) == 0o600


def test_no_listener_for_a_model_it_does_not_serve(loop, short_dir):
    assert loop.run(hub.open_listener("a-1", "mystery", short_dir)) is None


def test_the_upstream_is_the_specs_model_with_the_bound_values():
    up = hub.upstream_for("openai:gpt-x", {"OPENAI_API_KEY": "sk-1", "OPENAI_BASE_URL": "http://h/v1"})
    assert (up.label, up.target.base_url, up.target.key) == ("openai:gpt-x", "http://h/v1", "sk-1")
    assert "sk-1" not in repr(up.target)
    up = hub.upstream_for("anthropic:claude-x", {})
    assert (up.label, up.target.base_url, up.target.key) == (
        "anthropic:claude-x", "https://api.anthropic.com", "")
    assert hub.upstream_for("demo", {"OPENAI_API_KEY": "sk-1"}).label == "demo"


def test_closing_an_old_listener_leaves_a_newer_ones_socket(loop, short_dir):
    """A worker that took the agent over made its own socket at the same path."""
    old = loop.run(hub.open_listener("a-1", "demo", short_dir))
    new = loop.run(hub.open_listener("a-1", "demo", short_dir))
    loop.run(old.close())
    assert (short_dir / "gateway.sock").exists()
    loop.run(new.close())
    assert not (short_dir / "gateway.sock").exists()

"""The harness install's cache (sandboxes/harnesses.py) and the spec's
``harness`` field. The real install from npm is exercised by tests/harnesses."""

from __future__ import annotations

import json

import pytest

from sandboxes import harnesses
from sessions.specs import SpecError, validate


def test_an_installed_tree_is_found_without_npm(tmp_path, monkeypatch):
    tree = tmp_path / f"pi-{harnesses.pi_key()}"
    tree.mkdir()
    (tree / harnesses.MARKER).write_text(json.dumps(harnesses.pi_inputs()))
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm: nothing may run
    found = harnesses.ensure_pi(tmp_path)
    assert (found.host_dir, found.built) == (tree, False)
    cfg = found.bridge_config()
    assert cfg["name"] == "pi" and cfg["cli"].startswith(harnesses.HARNESS_DIR + "/node_modules/")


def test_a_tree_without_its_marker_is_not_taken_for_installed(tmp_path, monkeypatch):
    (tmp_path / f"pi-{harnesses.pi_key()}" / "node_modules").mkdir(parents=True)  # a crash midway
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(harnesses.HarnessInstallFailed, match="npm is not installed"):
        harnesses.ensure_pi(tmp_path)


def test_the_key_follows_the_pinned_versions(monkeypatch):
    key = harnesses.pi_key()
    monkeypatch.setattr(harnesses, "PI_VERSION", "0.73.2")
    assert harnesses.pi_key() != key


def test_the_builtin_harness_installs_nothing():
    assert harnesses.ensure_harness({"model": "demo"}) is None
    assert harnesses.ensure_harness({"harness": "builtin"}) is None


def test_the_spec_names_a_known_harness():
    assert validate({"model": "demo"})["harness"] == "builtin"
    assert validate({"model": "demo", "harness": "pi"})["harness"] == "pi"
    with pytest.raises(SpecError) as err:
        validate({"model": "demo", "harness": "claude"})
    assert err.value.field == "harness"


def test_pi_has_no_pre_tool_use_hook():
    with pytest.raises(SpecError) as err:
        validate({"harness": "pi", "hooks": {"pre_tool_use": "true"}})
    assert err.value.field == "hooks.pre_tool_use"
    assert validate({"harness": "pi", "hooks": {"stop": "true"}})["hooks"] == {"stop": "true"}

"""`inject: gateway` bindings: the default for the model's key and base URL,
refused for anything else, kept by a child, and never in a sandbox's env."""

from __future__ import annotations

import pytest

from sandboxes import launch
from sessions.commands import lineage
from sessions.specs import SpecError, inject_of, validate

KEY = {"name": "openai", "env": "OPENAI_API_KEY"}


def test_the_model_key_and_base_url_default_to_the_gateway_others_to_env():
    assert inject_of(KEY) == "gateway"
    assert inject_of({"name": "u", "env": "ANTHROPIC_BASE_URL"}) == "gateway"
    assert inject_of({"name": "gh", "env": "GITHUB_TOKEN"}) == "env"
    assert inject_of({**KEY, "inject": "env"}) == "env"


def test_a_spec_may_say_inject_and_keeps_older_specs_as_they_were():
    spec = validate({"model": "openai:gpt-x", "credentials": [
        {**KEY, "inject": "env"}, {"name": "gh", "env": "GH_TOKEN"}]})
    assert spec["credentials"][0]["inject"] == "env"
    assert "inject" not in spec["credentials"][1]


@pytest.mark.parametrize("binding, field", [
    ({"name": "gh", "env": "GITHUB_TOKEN", "inject": "gateway"}, "credentials[0].inject"),
    ({**KEY, "inject": "proxy"}, "credentials[0].inject"),
])
def test_a_wrong_inject_is_refused_naming_the_field(binding, field):
    with pytest.raises(SpecError) as caught:
        validate({"credentials": [binding]})
    assert caught.value.field == field


def test_a_child_may_not_bring_a_gateway_key_into_its_sandbox():
    parent = {"credentials": [KEY]}
    assert lineage.widening(parent, {"credentials": [{**KEY, "inject": "env"}]})[0] == \
        "credentials[0].inject"
    assert lineage.widening(parent, {"credentials": [KEY]}) is None
    assert lineage.widening({"credentials": [{**KEY, "inject": "env"}]},
                            {"credentials": [KEY]}) is None  # narrower is fine


def test_only_env_bindings_enter_the_sandboxes_environment(monkeypatch, tmp_path):
    seen = {}

    class Backend:
        def list(self, labels):
            return []

        def run_dir_inside(self, run):
            return "/run/alineo"

        def create(self, agent_id, image, **kw):
            seen.update(kw["env"])
            return "sb-1"

        def start(self, sid):
            pass

    monkeypatch.setattr(launch, "prepare_run_dir", lambda *a, **k: ["bridge"])
    monkeypatch.setattr(launch, "ensure_setup_image", lambda *a, **k: "image")
    monkeypatch.setattr(launch, "run_dir_for", lambda agent_id: tmp_path)
    secrets = (launch.Secret("openai", "OPENAI_API_KEY", "sk-x", "gateway"),
               launch.Secret("gh", "GH_TOKEN", "ghp-y", "env"))
    launch.create_sandbox(Backend(), launch.Launch("a-1", {"model": "openai:g"}, secrets))
    assert seen.get("GH_TOKEN") == "ghp-y" and "OPENAI_API_KEY" not in seen

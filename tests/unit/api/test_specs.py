import pytest

from sessions import specs
from sessions.specs import SpecError, validate


def test_demo_model_alone_is_a_whole_spec_with_defaults():
    spec = validate({"model": "demo"})
    assert spec == specs.DEFAULTS | {"model": "demo"}
    assert spec["checkpoint"] is False and spec["network"] == "none" and spec["packages"] == []


def test_empty_and_missing_specs_get_the_defaults():
    assert validate({}) == validate(None) == validate({"model": "demo"})


def test_checkpoint_true_adds_checkpoints():
    assert validate({"model": "demo", "checkpoint": True})["checkpoint"] is True


def test_defaults_are_not_shared_between_specs():
    a = validate({})
    a["packages"].append("git")
    a["limits"]["pids"] = 1
    assert validate({})["packages"] == [] and validate({})["limits"]["pids"] == 512


def test_a_full_spec_is_kept():
    full = {
        "model": "openai:gpt-4o-mini",
        "image": "debian:bookworm",
        "packages": ["git", "python3-pip", "nodejs=18.19.0+dfsg-6"],
        "setup": ["pip install ruff"],
        "tools": ["bash", "read", "read"],
        "checkpoint": True,
        "credentials": [{"name": "openai", "env": "OPENAI_API_KEY", "approval": "hold"}],
        "network": "host",
        "limits": {"memory_mb": 512, "cpus": 0.5},
        "hooks": {"pre_tool_use": "/hooks/check.sh"},
        "run_as": "dev",
        "name": "reviewer",
    }
    spec = validate(full)
    assert spec["tools"] == ["bash", "read"]  # a repeated tool is dropped
    assert spec["limits"] == {"memory_mb": 512, "pids": 512, "cpus": 0.5}  # pids defaulted
    assert spec["credentials"][0] == {"name": "openai", "env": "OPENAI_API_KEY", "approval": "hold"}
    assert spec["model"] == "openai:gpt-4o-mini" and spec["run_as"] == "dev"


def test_credential_approval_defaults_to_auto():
    spec = validate({"credentials": [{"name": "anthropic", "env": "ANTHROPIC_API_KEY"}]})
    assert spec["credentials"][0]["approval"] == "auto"


def test_unknown_keys_are_named():
    with pytest.raises(SpecError) as err:
        validate({"model": "demo", "gpu": 1, "colour": "red"})
    assert "colour" in str(err.value) and "gpu" in str(err.value)


@pytest.mark.parametrize(
    "spec, field, words",
    [
        ("demo", "", "object"),
        ({"model": 3}, "model", "string"),
        ({"model": "gpt-4"}, "model", "demo"),
        ({"model": "openai:"}, "model", "openai:"),
        ({"image": "has space"}, "image", "image"),
        ({"packages": "git"}, "packages", "list"),
        ({"packages": ["git; rm -rf /"]}, "packages[0]", "package name"),
        ({"setup": [1]}, "setup[0]", "string"),
        ({"tools": ["bash", "sudo"]}, "tools[1]", "sudo"),
        ({"checkpoint": 1}, "checkpoint", "true or false"),
        ({"checkpoint": "yes"}, "checkpoint", "true or false"),
        ({"network": "bridge"}, "network", "none"),
        ({"limits": {"memory_mb": -1}}, "limits.memory_mb", "greater than 0"),
        ({"limits": {"pids": 0}}, "limits.pids", "greater than 0"),
        ({"limits": {"cpus": 0}}, "limits.cpus", "greater than 0"),
        ({"limits": {"memory_mb": 1.5}}, "limits.memory_mb", "integer"),
        ({"limits": {"pids": True}}, "limits.pids", "integer"),
        ({"limits": {"cpus": float("nan")}}, "limits.cpus", "finite"),
        ({"limits": {"memory_mb": 10**30}}, "limits.memory_mb", "at most"),
        ({"limits": {"disk": 1}}, "limits.disk", "unknown limit"),
        ({"limits": []}, "limits", "object"),
        ({"hooks": {"post": "x"}}, "hooks.post", "unknown hook"),
        ({"hooks": {"stop": ""}}, "hooks.stop", "empty"),
        ({"run_as": "Root User"}, "run_as", "unix user"),
        ({"name": 5}, "name", "string"),
        ({"credentials": {}}, "credentials", "list"),
        ({"credentials": [{"name": "x"}]}, "credentials[0].env", "required"),
        (
            {"credentials": [{"name": "x", "env": "1BAD"}]},
            "credentials[0].env",
            "environment variable",
        ),
        (
            {"credentials": [{"name": "x", "env": "K", "approval": "maybe"}]},
            "credentials[0].approval",
            "auto",
        ),
        (
            {"credentials": [{"name": "x", "env": "K", "value": "sk-123"}]},
            "credentials[0]",
            "secret",
        ),
        (
            {"credentials": [{"name": "a", "env": "K"}, {"name": "b", "env": "K"}]},
            "credentials",
            "same env",
        ),
    ],
)
def test_wrong_fields_are_named_with_the_reason(spec, field, words):
    with pytest.raises(SpecError) as err:
        validate(spec)
    assert err.value.field == field
    assert words in err.value.message


def test_spec_error_message_names_the_field():
    with pytest.raises(SpecError) as err:
        validate({"limits": {"memory_mb": -5}})
    assert str(err.value) == "spec.limits.memory_mb: must be greater than 0"

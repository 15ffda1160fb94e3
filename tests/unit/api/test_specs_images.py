"""Spec checks at POST /api/agents beyond the shape of the JSON: images that must
exist, provider models that need a key, packages that need the network, limits."""

from __future__ import annotations

import pytest

from sandboxes.backends.docker import DockerBackend
from sandboxes.backends.local import LocalBackend
from sandboxes.errors import BackendUnavailable, ImageMissing
from sessions import specs
from sessions.models import Agent, Command, Event
from sessions.specs import SpecError, check_available, validate, validate_for_spawn

from .conftest import assert_error


class FakeBackend:
    """Only the image lookup of a backend (what check_available asks)."""

    def __init__(self, name="docker", images=(), error=None):
        self.name, self.images, self.error, self.asked = name, set(images), error, []
        real = {"docker": DockerBackend, "local": LocalBackend}[name]
        self.installs_packages, self.image_hint = real.installs_packages, real.image_hint

    def unavailable_reason(self):
        return None

    def image_exists(self, image):
        self.asked.append(image)
        if self.error is not None:
            raise self.error
        return image in self.images


def _refused(spec, backend=None) -> SpecError:
    with pytest.raises(SpecError) as info:
        validate_for_spawn(spec, backend or FakeBackend())
    return info.value


# --- images ----------------------------------------------------------------------------
def test_the_default_image_needs_no_lookup():
    backend = FakeBackend()
    assert validate_for_spawn({"model": "demo"}, backend)["image"] == "default"
    assert backend.asked == []


def test_a_missing_docker_image_is_refused_naming_image():
    err = _refused({"image": "debian:bookworm"}, FakeBackend("docker"))
    assert err.field == "image" and "debian:bookworm" in err.message
    assert "does not exist" in str(err)


def test_an_existing_docker_image_is_accepted():
    backend = FakeBackend("docker", images={"alineo-setup:abc"})
    assert validate_for_spawn({"image": "alineo-setup:abc"}, backend)["image"] == "alineo-setup:abc"
    assert backend.asked == ["alineo-setup:abc"]


def test_local_backend_knows_only_its_snapshots():
    local = FakeBackend("local", images={"local-snapshot/setup-1"})
    assert validate_for_spawn({"image": "local-snapshot/setup-1"}, local)
    assert _refused({"image": "local-snapshot/nope"}, local).field == "image"
    err = _refused({"image": "debian:bookworm"}, local)
    assert err.field == "image" and "local" in err.message


def test_an_engine_that_does_not_answer_is_not_the_specs_fault():
    backend = FakeBackend("docker", error=BackendUnavailable("engine down"))
    assert validate_for_spawn({"image": "debian:bookworm"}, backend)
    permanent = FakeBackend("docker", error=ImageMissing("bad reference"))
    assert _refused({"image": "debian:bookworm"}, permanent).field == "image"


def test_check_available_with_the_real_local_backend(tmp_path):

    backend = LocalBackend(root=tmp_path)
    sid = backend.create("a1", "host")
    ref = backend.commit(sid, "made-by-test")
    check_available(validate({"image": ref}), backend)
    with pytest.raises(SpecError):
        check_available(validate({"image": ref + "-other"}), backend)
    backend.remove(sid)


# --- packages, credentials, limits (pure: validate() refuses them) --------------------
def test_packages_need_host_network():
    with pytest.raises(SpecError) as info:
        validate({"packages": ["git"]})
    assert info.value.field == "packages" and "network: host" in info.value.message
    assert validate({"packages": ["git"], "network": "host"})["packages"] == ["git"]


def test_packages_need_the_docker_backend():
    spec = {"packages": ["git"], "network": "host"}
    assert validate_for_spawn(spec, FakeBackend("docker"))
    assert _refused(spec, FakeBackend("local")).field == "packages"


@pytest.mark.parametrize("model,env", [("openai:gpt-4o-mini", "OPENAI_API_KEY"),
                                       ("anthropic:claude-sonnet-4", "ANTHROPIC_API_KEY")])
def test_a_provider_model_needs_a_binding_for_its_key(model, env):
    with pytest.raises(SpecError) as info:
        validate({"model": model})
    assert info.value.field == "credentials" and env in info.value.message
    with pytest.raises(SpecError):  # a binding of another variable does not count
        validate({"model": model, "credentials": [{"name": "x", "env": "OTHER_KEY"}]})
    ok = validate({"model": model, "credentials": [{"name": "mine", "env": env}]})
    assert ok["model"] == model


def test_the_demo_model_needs_no_credentials():
    assert validate({"model": "demo"})["credentials"] == []


# --- through the API: 400 naming the field, nothing written ----------------------------
def _nothing_written():
    return not Agent.objects.exists() and not Event.objects.exists() and not Command.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("spec,field", [
    ({"model": "openai:gpt-4o"}, "credentials"),
    ({"model": "anthropic:claude", "credentials": [{"name": "k", "env": "OPENAI_API_KEY"}]},
     "credentials"),
    ({"packages": ["git"]}, "packages"),
    ({"limits": {"memory_mb": 0}}, "limits.memory_mb"),
    ({"limits": {"pids": -5}}, "limits.pids"),
    ({"limits": {"cpus": 0.0}}, "limits.cpus"),
])
def test_post_refuses_with_400_naming_the_field(api, spec, field):
    body = assert_error(api.post("/api/agents", {"spec": spec}, key="k-1"), 400, "spec.invalid")
    assert body["field"] == field and field.split(".")[0] in body["message"]
    assert _nothing_written()


@pytest.mark.django_db
def test_post_accepts_a_provider_model_with_its_binding(api, workspace):
    from sessions.credentials import set_secret

    set_secret(workspace, "openai", "sk-test-not-a-real-key")
    spec = {"model": "openai:gpt-4o-mini", "credentials": [{"name": "openai", "env": "OPENAI_API_KEY"}]}
    assert api.post("/api/agents", {"spec": spec}).status_code == 201


@pytest.mark.django_db
def test_post_refuses_a_missing_image_when_spawn_checks_availability(api, monkeypatch):
    """POST /api/agents runs validate_for_spawn (sessions.commands): a missing
    image is a 400 naming `image`."""
    monkeypatch.setattr("sessions.specs.get_backend", lambda name=None: FakeBackend())
    body = assert_error(api.post("/api/agents", {"spec": {"image": "nope:1"}}), 400, "spec.invalid")
    assert body["field"] == "image"
    assert _nothing_written()


@pytest.mark.django_db
def test_post_and_fork_are_refused_with_409_when_no_backend_works(api, workspace, monkeypatch):
    """No Docker and no bubblewrap (sandboxes/backends/unavailable.py): the
    server serves, but spawning and forking are a 409 saying why, nothing written."""
    from sandboxes.backends.unavailable import UnavailableBackend

    none = UnavailableBackend("no sandbox backend: bubblewrap is not installed")
    monkeypatch.setattr("sessions.specs.get_backend", lambda name=None: none)
    body = assert_error(api.post("/api/agents", {"spec": {"model": "demo"}}), 409,
                        "sandbox.unavailable")
    assert "bubblewrap is not installed" in body["message"]
    assert _nothing_written()
    source = Agent.objects.create(workspace=workspace, spec={"model": "demo"})
    assert_error(api.post(f"/api/agents/{source.id}/fork", {"at_event": 1}), 409,
                 "sandbox.unavailable")
    assert Agent.objects.count() == 1 and not Event.objects.exists()


def test_provider_key_envs_match_the_bridge():
    from sandboxes.bridge.config import SECRET_ENV_DEFAULTS

    assert specs.PROVIDER_KEY_ENV == SECRET_ENV_DEFAULTS

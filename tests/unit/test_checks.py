"""The system checks in sessions/checks.py fire on misconfiguration and stay
quiet on the defaults. run_checks() also proves they are registered."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.test import override_settings

IN_MEMORY = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
REDIS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": "redis://127.0.0.1:6379"}]},
    }
}


def alineo_ids() -> set[str]:
    return {m.id for m in run_checks() if (m.id or "").startswith("alineo.")}


def with_engine(engine: str) -> dict:
    from django.conf import settings

    return {"default": {**settings.DATABASES["default"], "ENGINE": engine}}


@pytest.fixture
def private_data_dir(tmp_path):
    """A data dir as settings.py makes it (0700), whatever the caller's umask
    made of the one this run uses."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    return data


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_defaults_raise_nothing(private_data_dir):
    with override_settings(ALINEO_WORKERS=1, CHANNEL_LAYERS=IN_MEMORY, ALINEO_SANDBOX="auto",
                           DATABASES=with_engine("django.db.backends.sqlite3"),
                           DATA_DIR=private_data_dir):
        # I001 (how local sandboxes enforce limits) is information, shown when auto is local.
        assert alineo_ids() - {"alineo.I001"} == set()


def test_a_data_dir_other_users_can_read_warns(private_data_dir):
    with override_settings(DATA_DIR=private_data_dir):
        assert "alineo.W008" not in alineo_ids()
        private_data_dir.chmod(0o755)
        warning = next(m for m in run_checks() if m.id == "alineo.W008")
        assert str(private_data_dir) in warning.msg and "chmod -R go-rwx" in warning.hint


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_postgresql_without_redis_warns_and_with_redis_does_not():
    pg = with_engine("django.db.backends.postgresql")
    with override_settings(DATABASES=pg, CHANNEL_LAYERS=IN_MEMORY):
        assert "alineo.W003" in alineo_ids()
    with override_settings(DATABASES=pg, CHANNEL_LAYERS=REDIS):
        assert "alineo.W003" not in alineo_ids()


@pytest.mark.parametrize("lease_s, bad", [(2, True), (4.9, True), (5, False), (20, False)])
def test_a_lease_shorter_than_5_seconds_is_an_error(lease_s, bad):
    with override_settings(ALINEO_LEASE_S=lease_s):
        assert ("alineo.E004" in alineo_ids()) is bad


def test_several_workers_on_the_in_memory_layer_warn():
    with override_settings(ALINEO_WORKERS=3, CHANNEL_LAYERS=IN_MEMORY):
        assert "alineo.W001" in alineo_ids()


def test_several_workers_on_redis_do_not_warn_about_the_layer():
    with override_settings(ALINEO_WORKERS=3, CHANNEL_LAYERS=REDIS):
        assert "alineo.W001" not in alineo_ids()


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_several_workers_on_sqlite_warn():
    with override_settings(ALINEO_WORKERS=2, DATABASES=with_engine("django.db.backends.sqlite3")):
        assert "alineo.W002" in alineo_ids()


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_an_unsupported_database_is_an_error():
    with override_settings(DATABASES=with_engine("django.db.backends.mysql")):
        assert "alineo.E001" in alineo_ids()


@pytest.mark.parametrize("choice", ["auto", "docker", "local", "unisolated"])
def test_known_sandbox_choices_pass(choice):
    with override_settings(ALINEO_SANDBOX=choice):
        assert "alineo.E002" not in alineo_ids()


def test_unisolated_sandboxes_warn():
    with override_settings(ALINEO_SANDBOX="unisolated"):
        assert "alineo.W006" in alineo_ids()
    with override_settings(ALINEO_SANDBOX="local"):
        assert "alineo.W006" not in alineo_ids()


def test_the_local_backend_says_how_it_enforces_limits():
    from sandboxes.backends.limits import enforcement

    with override_settings(ALINEO_SANDBOX="local"):
        [info] = [m for m in run_checks() if m.id == "alineo.I001"]
    assert enforcement().describe() in info.msg


def test_no_backend_at_all_warns_but_does_not_stop_the_server(monkeypatch):
    from django.core.checks import ERROR

    from sandboxes.backends.unavailable import UnavailableBackend

    none = UnavailableBackend("no sandbox backend: bubblewrap is not installed")
    monkeypatch.setattr("sandboxes.backends.resolve_backend_name", lambda setting=None: "none")
    monkeypatch.setattr("sandboxes.backends.get_backend", lambda name=None: none)
    with override_settings(ALINEO_SANDBOX="auto"):
        messages = [m for m in run_checks() if m.id == "alineo.W007"]
    assert messages and "bubblewrap is not installed" in messages[0].msg
    assert messages[0].level < ERROR  # a warning: `serve` still starts


def test_an_unknown_sandbox_choice_is_an_error():
    with override_settings(ALINEO_SANDBOX="kubernetes"):
        assert "alineo.E002" in alineo_ids()


@pytest.mark.parametrize("every", [0, -5])
def test_snapshot_interval_below_one_is_an_error(every):
    with override_settings(ALINEO_SNAPSHOT_EVERY=every):
        assert "alineo.E003" in alineo_ids()


@pytest.mark.parametrize("docker_host, warns", [
    ("", False), ("unix:///run/docker.sock", False), ("tcp://127.0.0.1:2375", False),
    ("tcp://10.1.2.3:2376", True), ("ssh://ops@builder", True),
])
def test_a_docker_host_on_another_machine_warns(docker_host, warns):
    with override_settings(ALINEO_SANDBOX="docker", DOCKER_HOST=docker_host):
        assert ("alineo.W005" in alineo_ids()) is warns


@pytest.mark.parametrize("name, flagged", [
    ("ALINEO_SANBOX", True), ("ALINEO_LEASE", True), ("ALINEO_IDLE_UNLOAD", True),
    ("ALINEO_SANDBOX", False), ("ALINEO_URL", False), ("ALINEO_TEST_PASS", False),
    ("ALINEO_SOMETHING_ELSE_ENTIRELY", False),
])
def test_a_misspelt_setting_is_an_error_naming_the_setting(monkeypatch, name, flagged):
    monkeypatch.setenv(name, "1")
    found = [m for m in run_checks() if m.id == "alineo.E005"]
    assert bool(found) is flagged
    if flagged:
        assert name in found[0].msg and "did you mean ALINEO_" in found[0].msg


def test_the_fault_tests_hold_dir_warns_when_set():
    with override_settings(ALINEO_TEST_HOLD_DIR=""):
        assert "alineo.W009" not in alineo_ids()
    with override_settings(ALINEO_TEST_HOLD_DIR="/tmp/holds"):
        found = [m for m in run_checks() if m.id == "alineo.W009"]
        assert len(found) == 1 and "/tmp/holds" in found[0].msg

"""alineo_site/settings.py reads every variable once: a value that cannot
mean what its variable means stops the start with an error naming it,
instead of a silent default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(tmp_path, **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ALINEO_", "DJANGO_"))}
    clean.update(ALINEO_DATA_DIR=str(tmp_path), **env)
    code = "import alineo_site.settings as s; print(s.ALINEO_SANDBOX, s.ALINEO_SANDBOX_LABELS, s.PORT)"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=60)


def test_the_defaults_load(tmp_path):
    done = _load(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["auto", "{}", "8000"]


@pytest.mark.parametrize("env, named", [
    ({"ALINEO_SANDBOX": "dockr"}, "ALINEO_SANDBOX"),
    ({"ALINEO_DOCKER_HOST_TAR": "maybe"}, "ALINEO_DOCKER_HOST_TAR"),
    ({"DEBUG": "yes please"}, "DEBUG"),
    ({"ALINEO_LEASE_S": "twenty"}, "ALINEO_LEASE_S"),
    ({"PORT": "80a"}, "PORT"),
    ({"ALINEO_SANDBOX_LABELS": "team"}, "ALINEO_SANDBOX_LABELS"),
    ({"ALINEO_LOGIN_FAILURES": "five"}, "ALINEO_LOGIN_FAILURES"),
    ({"ALINEO_LOGIN_FAILURES": "-1"}, "ALINEO_LOGIN_FAILURES"),
    ({"ALINEO_LOGIN_LOCKOUT_S": "0"}, "ALINEO_LOGIN_LOCKOUT_S"),
    ({"ALINEO_LOGIN_LOCKOUT_BY": "ip"}, "ALINEO_LOGIN_LOCKOUT_BY"),
    ({"ALINEO_HTTPS": "sure"}, "ALINEO_HTTPS"),
    ({"ALINEO_HSTS_S": "3600"}, "ALINEO_HSTS_S"),  # HSTS without HTTPS
    ({"ALINEO_HTTPS": "1", "ALINEO_HSTS_S": "-1"}, "ALINEO_HSTS_S"),
    ({"ALINEO_GATEWAY_MAX_BODY_MB": "0"}, "ALINEO_GATEWAY_MAX_BODY_MB"),
    ({"ALINEO_GATEWAY_MAX_BODY_MB": "big"}, "ALINEO_GATEWAY_MAX_BODY_MB"),
    ({"ALINEO_MODEL_PRICES": "cheap"}, "ALINEO_MODEL_PRICES"),
    ({"ALINEO_MODEL_PRICES": '{"openai:x": {"input": -1}}'}, "ALINEO_MODEL_PRICES"),
    ({"ALINEO_MODEL_PRICES": '{"openai:x": {"inputs": 1}}'}, "ALINEO_MODEL_PRICES"),
])
def test_a_value_that_cannot_be_meant_stops_the_start_naming_its_variable(tmp_path, env, named):
    done = _load(tmp_path, **env)
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and named in done.stderr


def test_values_are_read_as_meant(tmp_path):
    done = _load(tmp_path, ALINEO_SANDBOX=" Local ", ALINEO_SANDBOX_LABELS="a=1, b = 2",
                 PORT="9001")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "local {'a': '1', 'b': '2'} 9001"


def _values(tmp_path, names: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ALINEO_", "DJANGO_"))}
    clean.update(ALINEO_DATA_DIR=str(tmp_path), **env)
    code = f"import alineo_site.settings as s; print([getattr(s, n) for n in {names.split()!r}])"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_login_throttling_reads_its_variables(tmp_path):
    names = "AXES_ENABLED AXES_FAILURE_LIMIT AXES_COOLOFF_TIME AXES_LOCKOUT_PARAMETERS"
    assert _values(tmp_path, names) == (
        "[True, 5, datetime.timedelta(seconds=900), ['ip_address']]")
    assert _values(tmp_path, names, ALINEO_LOGIN_FAILURES="3", ALINEO_LOGIN_LOCKOUT_S="60",
                   ALINEO_LOGIN_LOCKOUT_BY="client_and_username") == (
        "[True, 3, datetime.timedelta(seconds=60), [['ip_address', 'username']]]")
    assert _values(tmp_path, "AXES_ENABLED", ALINEO_LOGIN_FAILURES="0") == "[False]"
    known = _values(tmp_path, "KNOWN_ENV")
    assert all(n in known for n in ("ALINEO_LOGIN_FAILURES", "ALINEO_LOGIN_LOCKOUT_S",
                                    "ALINEO_LOGIN_LOCKOUT_BY"))


def test_https_makes_the_cookies_secure_and_trusts_the_proxys_scheme(tmp_path):
    names = ("SESSION_COOKIE_SECURE CSRF_COOKIE_SECURE SECURE_PROXY_SSL_HEADER SECURE_HSTS_SECONDS "
             "SESSION_COOKIE_HTTPONLY SESSION_COOKIE_SAMESITE CSRF_COOKIE_SAMESITE "
             "SECURE_CONTENT_TYPE_NOSNIFF")
    assert _values(tmp_path, names) == "[False, False, None, 0, True, 'Lax', 'Lax', True]"
    assert _values(tmp_path, names, ALINEO_HTTPS="1") == (
        "[True, True, ('HTTP_X_FORWARDED_PROTO', 'https'), 0, True, 'Lax', 'Lax', True]")
    assert _values(tmp_path, "SECURE_HSTS_SECONDS", ALINEO_HTTPS="1", ALINEO_HSTS_S="31536000") == (
        "[31536000]")

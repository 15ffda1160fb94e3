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

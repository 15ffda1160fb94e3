"""`manage.py serve` makes its data dir private at start
(sessions/management/commands/serve.py ``private_data_dir``): loudly when
other users could read it, quietly for the files `migrate` left 0644 inside a
dir that was already 0700 (every first `make run`)."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from sessions.management.commands.serve import private_data_dir

LOGGER = "sessions.management.commands.serve"


@pytest.fixture(autouse=True)
def umask_kept():
    """tighten() sets this process's umask to 077: the next tests get theirs back."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)


def _data_dir(tmp_path, settings, mode: int):
    root = tmp_path / "data"
    root.mkdir()
    (root / "alineo.sqlite3").write_text("db")
    os.chmod(root / "alineo.sqlite3", 0o644)
    os.chmod(root, mode)
    settings.DATA_DIR = str(root)
    return root


def test_files_left_readable_inside_a_private_dir_are_fixed_quietly(tmp_path, settings, caplog):
    root = _data_dir(tmp_path, settings, 0o700)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        changed = private_data_dir()
    assert changed == [str(root / "alineo.sqlite3")]
    assert stat.S_IMODE((root / "alineo.sqlite3").stat().st_mode) == 0o600
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.INFO]


def test_a_data_dir_other_users_could_read_is_a_warning(tmp_path, settings, caplog):
    root = _data_dir(tmp_path, settings, 0o755)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        changed = private_data_dir()
    assert str(root) in changed and stat.S_IMODE(root.stat().st_mode) == 0o700
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "readable by other users" in warnings[0].getMessage()


def test_nothing_to_change_says_nothing(tmp_path, settings, caplog):
    root = _data_dir(tmp_path, settings, 0o700)
    os.chmod(root / "alineo.sqlite3", 0o600)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert private_data_dir() == []
    assert not [r for r in caplog.records if r.name == LOGGER]

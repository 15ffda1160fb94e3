"""Wait-for inputs go into the run dir, which the sandbox writes too
(sandboxes/launch.py stage_inputs): what it planted there is replaced, never
written through, and the files are readable by the sandbox's uid whatever the
control plane's umask."""

from __future__ import annotations

import os
import stat

import pytest

from sandboxes.launch import stage_inputs


@pytest.fixture
def run_and_files(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    src = tmp_path / "src"
    src.mkdir()
    (src / "task.txt").write_text("the task")
    (src / "inputs.json").write_text('{"ticket": 42}')
    outside = tmp_path / "outside"
    outside.mkdir()
    return run, sorted(src.iterdir()), outside


def test_inputs_land_readable_under_a_private_umask(run_and_files):
    run, files, _ = run_and_files
    old = os.umask(0o077)
    try:
        stage_inputs(run, files)
    finally:
        os.umask(old)
    assert (run / "inputs" / "task.txt").read_text() == "the task"
    assert stat.S_IMODE((run / "inputs").stat().st_mode) == 0o755
    assert stat.S_IMODE((run / "inputs" / "inputs.json").stat().st_mode) == 0o644
    assert not [p for p in run.iterdir() if p.name.startswith(".inputs-")]


def test_a_planted_link_is_replaced_not_followed(run_and_files):
    run, files, outside = run_and_files
    (run / "inputs").symlink_to(outside)
    stage_inputs(run, files)
    assert os.listdir(outside) == []
    assert not (run / "inputs").is_symlink() and (run / "inputs" / "task.txt").is_file()


def test_a_planted_directory_of_links_is_replaced_not_followed(run_and_files):
    run, files, outside = run_and_files
    (run / "inputs").mkdir()
    (run / "inputs" / "task.txt").symlink_to(outside / "task.txt")
    (run / "inputs" / "other").symlink_to(outside)
    stage_inputs(run, files)
    assert os.listdir(outside) == []
    assert sorted(os.listdir(run / "inputs")) == ["inputs.json", "task.txt"]
    assert not (run / "inputs" / "task.txt").is_symlink()


def test_a_planted_file_is_replaced(run_and_files):
    run, files, _ = run_and_files
    (run / "inputs").write_text("not a dir")
    stage_inputs(run, files)
    assert (run / "inputs" / "task.txt").read_text() == "the task"

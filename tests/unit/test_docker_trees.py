"""sandboxes/backends/docker_trees.py without an engine: which mount of a
container is a home laid over a tree (never a volume or bind that merely sits
at /root under another name), and which names may name a layer directory."""

from __future__ import annotations

import pytest

from sandboxes.backends import docker_trees

OURS = "alineo-home-ag_1-0123abcd"


@pytest.mark.parametrize("mounts,expected", [
    ([{"Type": "volume", "Name": OURS, "Destination": "/root", "Source": "/v/_data"}], OURS),
    ([{"Type": "volume", "Name": OURS, "Destination": "/root/", "Source": "/v/_data"}], OURS),
    ([{"Type": "volume", "Name": "someone-else", "Destination": "/root"}], None),
    ([{"Type": "bind", "Name": OURS, "Destination": "/root", "Source": "/data/homes/x"}], None),
    ([{"Type": "volume", "Name": OURS, "Destination": "/root/sub"}], None),
    ([{"Type": "volume", "Name": "alineo-home-../../etc", "Destination": "/root"}], None),
    ([], None),
    (None, None),
])
def test_which_mount_is_a_tree_home(mounts, expected):
    assert docker_trees.volume_of(mounts, "/root") == expected


@pytest.mark.parametrize("name", ["alineo-home-", "other-volume", "alineo-home-../x", "alineo-home-a/b",
                                  "alineo-home-" + "a" * 200])
def test_a_layer_dir_is_named_only_by_a_tree_home_volume(name, settings, tmp_path):
    settings.DATA_DIR = str(tmp_path)
    with pytest.raises(ValueError):
        docker_trees.layer_dir(name)


def test_a_layer_dir_is_under_the_data_dir(settings, tmp_path):
    settings.DATA_DIR = str(tmp_path)
    assert docker_trees.layer_dir(OURS) == tmp_path / "layers" / OURS

"""The base image: mirror discovery, the input hash, and `manage.py build_base_image`."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from sandboxes import images
from sandboxes.errors import SandboxError

ONE_LINE = """\
# a comment
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.example/debian/ bookworm main contrib
deb-src http://mirror.example/debian bookworm main
deb http://mirror.example/debian-security bookworm-security main
"""

DEB822 = """\
Types: deb
URIs: http://other.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no
"""


def _apt_root(tmp_path, one_line="", deb822=""):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(one_line)
    (tmp_path / "sources.list.d" / "debian.sources").write_text(deb822)
    (tmp_path / "sources.list.d" / "x.list.disabled").write_text("deb http://no.example/ x main")
    return str(tmp_path)


def test_mirrors_from_one_line_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("ALINEO_DEBIAN_MIRROR", raising=False)
    monkeypatch.delenv("ALINEO_DEBIAN_SECURITY_MIRROR", raising=False)
    sources = images.read_apt_sources(_apt_root(tmp_path, one_line=ONE_LINE))
    assert images.debian_mirrors("bookworm", sources) == [
        "deb http://mirror.example/debian bookworm bookworm-updates main",
        "deb http://mirror.example/debian-security bookworm-security main",
    ]


def test_mirrors_from_deb822_sources_skip_disabled(tmp_path, monkeypatch):
    monkeypatch.delenv("ALINEO_DEBIAN_MIRROR", raising=False)
    monkeypatch.delenv("ALINEO_DEBIAN_SECURITY_MIRROR", raising=False)
    sources = images.read_apt_sources(_apt_root(tmp_path, deb822=DEB822))
    assert [s.uri for s in sources] == ["http://other.example/debian"]
    assert images.debian_mirrors("bookworm", sources) == [
        "deb http://other.example/debian bookworm bookworm-updates main",
    ]


def test_mirror_override_and_missing_mirror(tmp_path, settings):
    settings.ALINEO_DEBIAN_SECURITY_MIRROR = settings.ALINEO_DEBIAN_MIRROR = ""
    with pytest.raises(SandboxError, match="ALINEO_DEBIAN_MIRROR"):
        images.debian_mirrors("bookworm", [])
    settings.ALINEO_DEBIAN_MIRROR = "http://forced.example/debian/"
    assert images.debian_mirrors("bookworm", [])[0] == \
        "deb http://forced.example/debian bookworm bookworm-updates main"


def test_tag_is_a_hash_of_the_inputs():
    inputs = images.base_image_inputs()
    tag = images.base_image_tag(inputs)
    assert tag == images.base_image_tag(dict(inputs))
    assert tag.startswith("alineo-base:") and len(tag.split(":")[1]) == 16
    changed = {**inputs, "packages": [*inputs["packages"], "git"]}
    assert images.base_image_tag(changed) != tag
    argv = images.mmdebstrap_argv(inputs)
    assert "--variant=minbase" in argv and "--include=python3,ca-certificates" in argv
    assert f"--hook-dir={images.HOOK_ROOT}/merged-usr" in argv
    assert "--dpkgopt=path-exclude=/usr/share/doc/*" in argv
    assert argv[argv.index("bookworm") + 1] == "-"  # tar on stdout, piped into the import


def test_build_base_image_command_prints_the_tag(docker_base_image):
    out, err = io.StringIO(), io.StringIO()
    call_command("build_base_image", stdout=out, stderr=err)  # present: skipped
    assert out.getvalue().strip() == docker_base_image
    assert "nothing to build" in err.getvalue()


def test_build_base_image_without_docker_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/alineo-test.sock")
    with pytest.raises(CommandError, match="no Docker engine answers"):
        call_command("build_base_image", stdout=io.StringIO(), stderr=io.StringIO())

"""The sandbox backends, for real: the same suite runs on docker and on local.

Docker tests need an engine. With CI set (CI always has Docker: .ci/docker-up
starts one) a missing engine FAILS the tests; on a developer machine without
Docker they are skipped, loudly. Everything a test creates carries the label
``alineo.test=<run id>`` and is removed at the end, containers and committed
images alike. The base image is a product artifact (``manage.py
build_base_image`` makes it too) and is kept, so later runs skip its build.
"""

from __future__ import annotations

import os
import uuid

import pytest

from sandboxes.backends import docker_engine_answers

RUN_ID = uuid.uuid4().hex[:10]
TEST_LABELS = {"alineo.test": RUN_ID}


def _no_docker(reason: str):
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {reason}: CI must exercise the docker backend "
                    "(.ci/docker-up starts an engine)", pytrace=False)
    pytest.skip(f"!!! DOCKER BACKEND NOT TESTED: {reason}. As root, run .ci/docker-up "
                "to install and start an engine !!!")


@pytest.fixture(scope="session")
def docker_base_image():
    """The base image tag, built once (offline, ~30-80 s) when absent."""
    if not docker_engine_answers():
        _no_docker("no Docker engine answers")
    from sandboxes import images

    try:
        tag, _ = images.ensure_base_image()
    except Exception as exc:  # noqa: BLE001
        _no_docker(f"the base image cannot be built ({exc})")
    return tag


@pytest.fixture(scope="session")
def docker_cleanup():
    yield
    if not docker_engine_answers():
        return
    import docker

    client = docker.from_env()
    label = f"alineo.test={RUN_ID}"
    for c in client.api.containers(all=True, filters={"label": label}):
        client.api.remove_container(c["Id"], force=True, v=True)
    for v in client.api.volumes(filters={"label": label})["Volumes"] or []:
        client.api.remove_volume(v["Name"], force=True)  # tree homes (docker_trees.py)
    for img in client.api.images(filters={"label": label}):
        client.api.remove_image(img["Id"], force=True)


class Sandboxes:
    """Creates sandboxes for one test on one backend, removes them after it."""

    def __init__(self, backend, image: str):
        self.backend = backend
        self.image = image
        self.created: list[str] = []
        self.snapshots: list[str] = []

    def create(self, agent_id: str = "agent-1", image: str | None = None, **kwargs) -> str:
        labels = {**TEST_LABELS, **kwargs.pop("labels", {})}
        sid = self.backend.create(agent_id, image or self.image, labels=labels, **kwargs)
        self.created.append(sid)
        return sid

    def started(self, agent_id: str = "agent-1", **kwargs) -> str:
        sid = self.create(agent_id, **kwargs)
        self.backend.start(sid)
        return sid

    def commit(self, sid: str, tag: str) -> str:
        ref = self.backend.commit(sid, tag)
        self.snapshots.append(ref)
        return ref

    def cleanup(self):
        for sid in self.created:
            try:
                self.backend.remove(sid)
            except Exception:  # noqa: BLE001 - best effort, the session sweep follows
                pass
        for ref in self.snapshots:
            try:
                self.backend.remove_image(ref)
            except Exception:  # noqa: BLE001
                pass


def _sandboxes(request, kind: str):
    if kind == "docker":
        image = request.getfixturevalue("docker_base_image")
        request.getfixturevalue("docker_cleanup")
        from sandboxes.backends.docker import DockerBackend

        backend = DockerBackend()
    else:
        from sandboxes.backends.local import LocalBackend

        root = request.getfixturevalue("tmp_path_factory").mktemp("local-sandboxes")
        backend = LocalBackend(root=root)
        image = "alineo-base:host"  # the local backend runs on the host
    return Sandboxes(backend, image)


@pytest.fixture(params=["docker", "local"])
def sandboxes(request):
    box = _sandboxes(request, request.param)
    yield box
    box.cleanup()


@pytest.fixture
def docker_sandboxes(request):
    box = _sandboxes(request, "docker")
    yield box
    box.cleanup()


@pytest.fixture
def local_sandboxes(request):
    box = _sandboxes(request, "local")
    yield box
    box.cleanup()

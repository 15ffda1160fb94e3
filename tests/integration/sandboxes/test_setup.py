"""Setup snapshots (sandboxes.setup): built once per spec, on docker and local."""

from __future__ import annotations

import threading
import uuid

import pytest

from sandboxes.setup import SetupFailed, ensure_setup, ensure_setup_image, needs_setup, setup_key

from .conftest import TEST_LABELS


def _spec(sandboxes, steps, **extra):
    return {"image": sandboxes.image, "packages": [], "setup": steps, "run_as": "root",
            "network": "none", "limits": {"memory_mb": 512, "pids": 256}, **extra}


def test_a_spec_without_setup_uses_its_image(sandboxes, tmp_path):
    spec = _spec(sandboxes, [])
    assert not needs_setup(spec)
    assert ensure_setup_image(sandboxes.backend, spec, lock_dir=tmp_path) == sandboxes.image


def test_concurrent_starts_of_one_spec_build_once_and_later_starts_skip_setup(sandboxes, tmp_path):
    b = sandboxes.backend
    token = uuid.uuid4().hex  # a new key for every run: never an old snapshot
    spec = _spec(sandboxes, [
        f'echo {token} > "$HOME/marker"',
        'echo ran >> "$HOME/setup-count"',
        'mkdir -p "$HOME/.cache" && head -c 100000 /dev/zero > "$HOME/.cache/junk"',
    ])
    results, errors = [], []

    def start():
        try:
            results.append(ensure_setup(b, spec, labels=TEST_LABELS, lock_dir=tmp_path))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    sandboxes.snapshots.append(results[0].ref)
    assert len({r.ref for r in results}) == 1
    assert sum(r.built for r in results) == 1  # built once, the others waited and reused it
    assert results[0].key == setup_key(b, spec)
    again = ensure_setup(b, spec, labels=TEST_LABELS, lock_dir=tmp_path)
    assert again.ref == results[0].ref and not again.built
    # Two agents of the spec start from the snapshot: setup's files, setup ran once.
    for agent in ("agent-a", "agent-b"):
        sid = sandboxes.started(agent, image=again.ref)
        out = b.exec(sid, ["sh", "-c", 'cat "$HOME/marker" "$HOME/setup-count"; '
                                       'ls -A "$HOME/.cache" 2>/dev/null | wc -l'])
        assert out.text.split() == [token, "ran", "0"], out.text  # caches cleaned


def test_a_changed_step_makes_a_new_snapshot(sandboxes, tmp_path):
    b = sandboxes.backend
    one = _spec(sandboxes, [f"echo {uuid.uuid4().hex} > x"])
    two = dict(one, setup=one["setup"] + ["true"])
    assert setup_key(b, one) != setup_key(b, two)
    assert setup_key(b, one) == setup_key(b, dict(one, name="another", checkpoint=True))


def test_a_failing_step_fails_the_build_and_leaves_nothing(sandboxes, tmp_path):
    b = sandboxes.backend
    spec = _spec(sandboxes, [f"echo {uuid.uuid4().hex}", "echo boom >&2; exit 7"])
    with pytest.raises(SetupFailed) as info:
        ensure_setup(b, spec, labels=TEST_LABELS, lock_dir=tmp_path)
    assert info.value.exit_code == 7 and "boom" in info.value.output
    assert info.value.permanent
    key = setup_key(b, spec)
    assert not b.image_exists(ensure_ref(b, key))
    assert not [h for h in b.list(TEST_LABELS) if h.labels.get("alineo.setup-key") == key]


def ensure_ref(backend, key):
    from sandboxes.setup import setup_ref

    return setup_ref(backend, key)


def test_packages_need_host_network(docker_sandboxes, tmp_path):
    from sandboxes.errors import SandboxError

    spec = _spec(docker_sandboxes, [], packages=["jq"])
    with pytest.raises(SandboxError, match="network: host"):
        ensure_setup(docker_sandboxes.backend, spec, lock_dir=tmp_path)


def test_docker_setup_writes_outside_home_and_runs_as_root(docker_sandboxes, tmp_path):
    b = docker_sandboxes.backend
    token = uuid.uuid4().hex
    spec = _spec(docker_sandboxes, [f"echo {token} > /opt/marker", "chown nobody /opt/marker"],
                 run_as="dev")
    ref = ensure_setup_image(b, spec, labels=TEST_LABELS, lock_dir=tmp_path)
    docker_sandboxes.snapshots.append(ref)
    sid = docker_sandboxes.started("agent-opt", image=ref)
    out = b.exec(sid, ["sh", "-c", "cat /opt/marker; stat -c %U /opt/marker; id -u dev"])
    lines = out.text.split()
    assert lines[:2] == [token, "nobody"] and lines[2].isdigit()
    # The snapshot does not leak the setup sandbox's anonymous volumes or its command.
    info = b.client.api.inspect_image(ref)
    assert not info["Config"].get("Volumes")
    assert info["Config"]["Labels"]["alineo.setup-key"]

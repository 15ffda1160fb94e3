"""A bound credential value never leaves the control plane's database in a
form anyone could read back: the agent prints it (`run: env`), and it is in
no transcript row, no file of the turn checkpoint (the bridge's session file
included, and Pi's own with the pi harness), no bridge log, and no file of a
backup bundle."""

from __future__ import annotations

import io
import json
import tarfile
import uuid

import pytest
import zstandard

from sandboxes.harnesses import ensure_pi
from tests.integration.worlds import events_of

#: The harness's own session file, besides the bridge's (docs/HARNESSES.md).
HARNESS_FILES = {"builtin": [], "pi": ["./.alineo/pi/session.jsonl"]}


def _files_of(checkpoint) -> dict[str, bytes]:
    raw = zstandard.ZstdDecompressor().stream_reader(open(checkpoint, "rb")).read()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


@pytest.mark.parametrize("harness", ["builtin", "pi"])
def test_a_printed_credential_is_in_no_transcript_checkpoint_log_or_backup(world, tmp_path, harness):
    if harness == "pi":
        ensure_pi()
    canary = "canary-" + uuid.uuid4().hex
    world.server.django(
        "from sessions.models import Workspace\nfrom sessions.credentials import set_secret\n"
        f"set_secret(Workspace.objects.get(name={world.actor.workspace!r}), 'github', {canary!r})\n"
        "result = 1\n")
    spec = {"model": "demo", "checkpoint": True, "harness": harness,
            "credentials": [{"name": "github", "env": "GH_TOKEN"}]}
    agent = world.spawn(spec, "run: env\nrun: echo the token is $GH_TOKEN")
    events = world.wait_for(agent, lambda evs: events_of(evs, "agent.checkpointed"), "a checkpoint")
    outputs = [e["data"]["output"] for e in events_of(events, "tool.result")]
    assert any("the token is [redacted:github]" in o for o in outputs)  # it really was printed
    assert canary not in json.dumps(world.events(agent))

    data = world.server.data_dir
    checkpoint = next((data / "checkpoints" / agent).glob("*.tar.zst"))
    files = _files_of(checkpoint)
    for name in ["./.alineo/session.json", *HARNESS_FILES[harness]]:
        assert name in files and b"[redacted:github]" in files[name], name
    leaked = [name for name, body in files.items() if canary.encode() in body]
    assert leaked == []
    assert canary not in (data / "run" / agent / "bridge.log").read_text()

    world.server.manage("backup", "--to", str(tmp_path / "bundles"), "--no-images")
    bundle = next((tmp_path / "bundles").glob("alineo-backup-*"))
    in_bundle = [p for p in bundle.rglob("*") if p.is_file() and canary.encode() in p.read_bytes()]
    assert in_bundle == []

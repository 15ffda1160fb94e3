import pytest
from django.core.management import CommandError, call_command

from sessions import credentials
from sessions.models import Credential
from sessions.specs import SpecError

pytestmark = pytest.mark.django_db


def test_redact_replaces_every_occurrence_recursively():
    secrets = [credentials.Secret("tok", "TOKEN", "s3cr3t-value")]
    data = {"output": "a s3cr3t-value b s3cr3t-value", "nested": [{"x": "s3cr3t-value"}], "n": 3}
    assert credentials.redact(data, secrets) == {
        "output": "a [redacted:tok] b [redacted:tok]", "nested": [{"x": "[redacted:tok]"}], "n": 3,
    }


def test_a_secret_never_shows_in_its_repr():
    assert "s3cr3t" not in repr(credentials.Secret("tok", "TOKEN", "s3cr3t-value"))


def test_check_bindings_names_the_missing_one(workspace):
    credentials.set_secret(workspace, "gh", "ghp_xxxxxxxx")
    credentials.check_bindings(workspace, [{"name": "gh", "env": "GH_TOKEN"}])
    with pytest.raises(SpecError) as err:
        credentials.check_bindings(workspace, [{"name": "gh", "env": "A"}, {"name": "nope", "env": "B"}])
    assert err.value.field == "credentials[1].name"


def test_secrets_are_scoped_to_their_workspace(workspace, other_workspace):
    credentials.set_secret(other_workspace, "gh", "other-secret")
    with pytest.raises(SpecError):
        credentials.check_bindings(workspace, [{"name": "gh", "env": "GH_TOKEN"}])
    assert credentials.secrets_for(workspace.id, [{"name": "gh", "env": "GH_TOKEN"}]) == []


def test_set_credential_command_reads_the_value_from_the_environment(workspace, monkeypatch, capsys):
    monkeypatch.setenv("MY_SECRET", "value-from-env")
    call_command("set_credential", "acme", "deploy", from_env="MY_SECRET")
    assert Credential.objects.get(workspace=workspace, name="deploy").secret == "value-from-env"
    assert "value-from-env" not in capsys.readouterr().out
    with pytest.raises(CommandError, match="no workspace"):
        call_command("set_credential", "nope", "deploy", from_env="MY_SECRET")


def test_the_admin_never_renders_a_stored_secret(client, workspace, django_user_model):
    admin = django_user_model.objects.create_superuser("root", password="pw-123456789")
    cred = credentials.set_secret(workspace, "gh", "ghp_super_secret_value")
    client.force_login(admin)
    page = client.get(f"/admin/agent_sessions/credential/{cred.pk}/change/").content.decode()
    assert "ghp_super_secret_value" not in page
    response = client.post(f"/admin/agent_sessions/credential/{cred.pk}/change/",
                           {"workspace": workspace.pk, "name": "gh", "secret": ""})
    assert response.status_code == 302
    cred.refresh_from_db()
    assert cred.secret == "ghp_super_secret_value"  # empty keeps the stored value

"""Shared actors: an owner and a teammate in one workspace, an outsider in another."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from sessions.models import Agent, ApiToken, Workspace


@pytest.fixture
def workspace(db):
    return Workspace.objects.create(name="acme")


@pytest.fixture
def other_workspace(db):
    return Workspace.objects.create(name="globex")


def _user(name, ws):
    user = get_user_model().objects.create_user(name, password=f"{name}-password-123")
    ws.members.add(user)
    return user


@pytest.fixture
def owner(workspace):
    return _user("olivia", workspace)


@pytest.fixture
def teammate(workspace):
    return _user("tomas", workspace)


@pytest.fixture
def outsider(other_workspace):
    return _user("oscar", other_workspace)


@pytest.fixture
def owner_token(owner):
    return ApiToken.issue(owner)[1]


@pytest.fixture
def agent(workspace, owner):
    """An agent row with no transcript yet (journal tests append to it)."""
    return Agent.objects.create(workspace=workspace, created_by=owner, spec={"model": "demo"})

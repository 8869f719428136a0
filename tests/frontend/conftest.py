"""Fixtures for portal tests: signed-in clients, a second team, deployments in chosen states."""
import pytest
from django.test import Client

from deployments.models import Membership
from tests.factories import DeploymentFactory, MembershipFactory, TeamFactory


@pytest.fixture
def signed_in():
    """signed_in(user) → a Django test client with that user's session."""
    def make(user):
        client = Client()
        client.force_login(user)
        return client
    return make


@pytest.fixture
def htmx_headers():
    def make(target: str | None = None, trigger_name: str | None = None) -> dict:
        headers = {"HX-Request": "true"}
        if target:
            headers["HX-Target"] = target
        if trigger_name:
            headers["HX-Trigger-Name"] = trigger_name
        return headers
    return make


@pytest.fixture
def other_team(db):
    return TeamFactory(slug="other-team", gpu_quota=32)


@pytest.fixture
def outsider(other_team):
    return MembershipFactory(team=other_team, role=Membership.Role.ADMIN).user


@pytest.fixture
def deployment(team, cluster, member):
    """A pending request of `member` in `team`, with its `requested` event (as the service writes it)."""
    from deployments.services.events import event_record

    d = DeploymentFactory(team=team, cluster=cluster, requested_by=member, name="chat-8b")
    event_record(kind="requested", deployment=d, actor=member, after={"name": d.name})
    return d

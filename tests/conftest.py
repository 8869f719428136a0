"""Shared fixtures. Tests run against real PostgreSQL and Redis (DATABASE_URL, REDIS_URL)."""
import pytest
import redis as redis_lib
from django.conf import settings
from rest_framework.test import APIClient

from deployments.models import Membership
from tests.factories import ClusterFactory, MembershipFactory, TeamFactory, UserFactory


@pytest.fixture
def redis_client():
    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    client.flushdb()
    yield client
    client.flushdb()


@pytest.fixture
def team(db):
    return TeamFactory(slug="ml-research", gpu_quota=16)


@pytest.fixture
def member(team):
    return MembershipFactory(team=team, role=Membership.Role.MEMBER).user


@pytest.fixture
def team_admin(team):
    return MembershipFactory(team=team, role=Membership.Role.ADMIN).user


@pytest.fixture
def platform_admin(db):
    return UserFactory(username="root-admin", is_staff=True, is_superuser=True)


@pytest.fixture
def cluster(db):
    return ClusterFactory(name="gpu-prod")


@pytest.fixture
def api():
    """An API client; `api.force_authenticate(user)` signs in."""
    return APIClient()

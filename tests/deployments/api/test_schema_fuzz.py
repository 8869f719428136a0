"""Schemathesis over the OpenAPI schema: no generated request may produce a server error."""
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from controlplane.wsgi import application
from deployments.models import AccessToken, Membership
from deployments.services.credentials import credential_mint
from tests.factories import ClusterFactory, DeploymentFactory, MembershipFactory

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)


@pytest.fixture
def auth_header(transactional_db):
    membership = MembershipFactory(role=Membership.Role.ADMIN)
    DeploymentFactory(team=membership.team, cluster=ClusterFactory(), requested_by=membership.user)
    _, raw = credential_mint(model=AccessToken, user=membership.user, name="fuzz")
    return {"Authorization": f"Bearer {raw}"}


@pytest.mark.django_db(transaction=True)
@schema.parametrize()
@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case, auth_header):
    case.call_and_validate(headers=auth_header, checks=[not_a_server_error])

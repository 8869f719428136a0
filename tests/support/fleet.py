"""Many deployments as a busy installation has them, for tests whose point is that cost does not grow with rows."""
from django.db import connection
from django.test.utils import CaptureQueriesContext

from deployments.lifecycle import Status
from deployments.services.events import event_record
from deployments.services.spec_store import deployment_proposal_set
from tests.factories import ClusterFactory, DeploymentFactory, UserFactory


def grow(*, teams, to: int) -> None:
    """Add deployments until there are `to`, spread over `teams` and two clusters: each requested by a different
    person, every third one running with an update proposed by yet another, each with an event of its own."""
    from deployments.models import Deployment

    clusters = [ClusterFactory(), ClusterFactory()]
    for i in range(Deployment.objects.count(), to):
        d = DeploymentFactory(team=teams[i % len(teams)], cluster=clusters[i % 2])
        if i % 3 == 0:
            d.status = Status.RUNNING
            deployment_proposal_set(deployment=d, spec=d.spec, by=UserFactory())
            d.save()
        event_record(kind="requested", deployment=d, actor=d.requested_by, after={"name": d.name})


def count_queries(get, url: str, **kwargs) -> int:
    """SQL queries one GET makes (which must answer 200)."""
    with CaptureQueriesContext(connection) as ctx:
        response = get(url, **kwargs)
    assert response.status_code == 200, response.content[:500]
    return len(ctx)

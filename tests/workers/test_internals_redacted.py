"""What members read about their deployment names the cluster, never its internal addresses or where its secret
lives: real reconcile passes against the emulated Kubernetes API, read back through the REST API as a member."""
import json

import pytest

from deployments.lifecycle import Status
from deployments.models import Cluster, Deployment, Membership
from tests.factories import RUNTIME_IMAGES, ClusterFactory, DeploymentFactory, MembershipFactory, TeamFactory
from tests.support.processes import wait_for
from tests.workers.conftest import gpu_spec
from workers.pipeline import reconcile_pass


def member_reads(api, d) -> str:
    """Everything a member of the team can read about the deployment, as one text."""
    member = MembershipFactory(team=d.team, role=Membership.Role.MEMBER).user
    api.force_authenticate(member)
    body = api.get(f"/api/v1/deployments/{d.pk}/").json()
    events = api.get(f"/api/v1/deployments/{d.pk}/events/?limit=500").json()["results"]
    return json.dumps({"deployment": body, "events": events})


@pytest.mark.django_db
def test_the_endpoint_step_and_its_condition_name_the_cluster_not_its_service_address(api, k8s_cluster,
                                                                                      redis_client):
    team = TeamFactory(slug="ml-research", gpu_quota=64)
    d = DeploymentFactory(team=team, cluster=k8s_cluster, name="llama", spec=gpu_spec(), status=Status.APPROVED)
    wait_for(lambda: reconcile_pass(d.pk) is None and Deployment.objects.get(pk=d.pk).status == Status.RUNNING,
             timeout=30, what="running")
    endpoint_url = Deployment.objects.get(pk=d.pk).endpoint_url
    assert endpoint_url.startswith("http")  # the gateway still has it: it is only kept from members
    seen = member_reads(api, d)
    assert endpoint_url not in seen and "svc.cluster.local" not in seen
    assert f"[an address on cluster {k8s_cluster.name}]" in seen
    assert k8s_cluster.secret_ref.removeprefix("file:") not in seen


@pytest.mark.django_db
def test_an_unreadable_secret_file_fails_the_deployment_without_naming_the_file(api, redis_client, tmp_path):
    missing = tmp_path / "prod-kubeconfig-do-not-share"
    cluster = ClusterFactory(name="shared-gpu", kind=Cluster.Kind.KUBERNETES, secret_ref=f"file:{missing}",
                             config={"runtime_images": RUNTIME_IMAGES})
    d = DeploymentFactory(team=TeamFactory(), cluster=cluster, spec=gpu_spec(), status=Status.APPROVED)
    assert reconcile_pass(d.pk) is None
    d.refresh_from_db()
    assert d.status == Status.FAILED and "cluster" in d.status_reason
    seen = member_reads(api, d)
    assert "prod-kubeconfig-do-not-share" not in seen and str(tmp_path) not in seen

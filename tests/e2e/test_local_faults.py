"""Bad input and faults on the local target fail the deployment with a reason a user can act on, fast, and leave
no application behind on Ray. A real worker drives each one, against real Ray Serve."""
import pytest

from deployments.models import Cluster, Deployment, Membership
from deployments.services import actions
from local.smoke import unsupported_model
from tests.e2e.conftest import MODEL, local_cluster_config, ray_apps
from tests.factories import MembershipFactory, TeamFactory, local_spec_input
from tests.support.processes import Worker, free_port, wait_for, worker_environment

pytestmark = [pytest.mark.pd, pytest.mark.e2e, pytest.mark.timeout(1800)]


def approve_and_settle(cluster: Cluster, spec: dict, name: str, *, timeout: float = 120) -> Deployment:
    team = TeamFactory(gpu_quota=0)
    member = MembershipFactory(team=team, role=Membership.Role.MEMBER).user
    admin = MembershipFactory(team=team, role=Membership.Role.ADMIN).user
    d = actions.deployment_request(actor=member, team=team, cluster=cluster, name=name, spec=spec)
    actions.deployment_approve(actor=admin, deployment=d, generation=d.generation)
    wait_for(lambda: Deployment.objects.get(pk=d.pk).status in ("running", "failed"), timeout=timeout, every=0.5,
             what=f"{name} to settle")
    return Deployment.objects.get(pk=d.pk)


@pytest.fixture
def worker(transactional_db, redis_client, tmp_path, request):
    """A worker; where the Ray dashboard cannot be reached at all, one that calls a deployment stuck after 8 s of
    nothing but transient errors (so that test ends quickly). Elsewhere the default: a dashboard slow to answer on a
    busy machine is a transient error there, not a failure."""
    stuck = {"TANDEM_STUCK_AFTER_SECONDS": "8"} if request.node.get_closest_marker("dashboard_unreachable") else {}
    w = Worker(worker_environment(tmp_path, **stuck)).start()
    yield w
    w.stop()


@pytest.fixture
def local_cluster(transactional_db, local_ray):
    return Cluster.objects.create(name="local", kind=Cluster.Kind.RAY, secret_ref=local_ray["secret_ref"],
                                  config=local_cluster_config(local_ray))


def test_a_model_source_that_does_not_exist(worker, local_cluster, local_ray):
    spec = local_spec_input(model={"id": "ghost", "source": str(MODEL.parent / "does-not-exist")})
    d = approve_and_settle(local_cluster, spec, "ghost")
    assert d.status == "failed"
    assert "does-not-exist does not exist on the Ray cluster's machine" in d.status_reason
    assert f"tdm-{d.pk}-ghost" not in ray_apps(local_ray)


def test_an_engine_setting_the_model_cannot_take(worker, local_cluster, local_ray):
    spec = local_spec_input(model={"id": "too-long", "source": str(MODEL)}, engine={"max_model_len": 65536})
    d = approve_and_settle(local_cluster, spec, "too-long")
    assert d.status == "failed"
    assert "max_model_len (65536) is greater than the model's max_position_embeddings (2048)" in d.status_reason
    assert f"tdm-{d.pk}-too-long" not in ray_apps(local_ray)


def test_a_model_vllm_refuses_fails_with_serves_own_reason_and_leaves_no_application(worker, local_cluster,
                                                                                      local_ray):
    """Tandem's preflight passes (config.json is there, max_model_len fits), so the app reaches real Serve; vLLM
    refuses the architecture when it builds the engine config, Serve says DEPLOY_FAILED, and the user reads
    vLLM's reason, not Serve's "Failed to update the deployments [...]"."""
    broken = unsupported_model(MODEL)  # beside the model, inside the cluster's allowed model sources
    spec = local_spec_input(model={"id": "tiny-llama", "source": str(broken)}, engine={"max_model_len": 1024})
    d = approve_and_settle(local_cluster, spec, "unsupported", timeout=900)
    assert d.status == "failed", d.status_reason
    # Prefill and decode load the same model; Serve names whichever failed first (both have been seen).
    assert d.status_reason.startswith(("Ray Serve could not deploy the application: Prefill:tiny-llama",
                                       "Ray Serve could not deploy the application: Decode:tiny-llama")), \
        d.status_reason
    assert ("Model architectures ['TandemUnsupportedForCausalLM'] are not supported for now. Supported "
            "architectures: dict_keys([…])") in d.status_reason
    assert d.status_reason.endswith("releases its nodes (kept for a retry); fix the spec, then retry.")
    # Its failure releases what it ran on: the application is taken off Serve again.
    wait_for(lambda: Deployment.objects.get(pk=d.pk).released_at is not None, timeout=120, every=1,
             what="the failed deployment's release")
    assert f"tdm-{d.pk}-unsupported" not in ray_apps(local_ray)
    kinds = list(d.events.values_list("kind", flat=True))
    assert "applied" in kinds and "released" in kinds, kinds  # it did reach Serve, and was taken off again


@pytest.mark.dashboard_unreachable
def test_ray_not_running(worker, transactional_db):
    port = free_port()
    cluster = Cluster.objects.create(name="nowhere", kind=Cluster.Kind.RAY,
                                     config={"dashboard_url": f"http://127.0.0.1:{port}",
                                             "model_sources": {"paths": [str(MODEL)]}})
    d = approve_and_settle(cluster, local_spec_input(model={"id": "m", "source": str(MODEL)}), "nowhere")
    assert d.status == "failed"
    assert "Cannot reach the Ray dashboard of nowhere" in d.status_reason
    assert d.events.filter(kind="transient_error").exists()

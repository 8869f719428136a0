"""The eks driver over real HTTP: boto3 against moto's server (EKS, STS) and the emulated Kubernetes API."""
import base64
import time

import boto3
import pytest

from deployments.models import Cluster
from tests.factories import RUNTIME_IMAGES, ClusterFactory, DeploymentFactory, TeamFactory
from tests.support.eks_nodes import eks_emulated
from tests.support.moto_server import eks_cluster_create
from tests.support.processes import wait_for
from tests.workers.conftest import gpu_spec
from workers.targets.base import PermanentError, TransientError
from workers.targets.eks import EksTarget

REGION = "us-west-2"
NODEGROUPS = r"/clusters/gpu-prod/node-groups"


def _pool(itype, gpus, tp, nodes=1):
    return {"instance_type": itype, "nodes": nodes, "gpus_per_node": gpus, "tensor_parallel_size": tp}


@pytest.fixture
def eks_cluster(aws, emulator, db):
    made = eks_emulated(aws, emulator, name="gpu-prod", region=REGION)  # its API server takes EKS tokens only
    return ClusterFactory(name="eks-prod", kind=Cluster.Kind.EKS, config={
        "region": REGION, "cluster_name": "gpu-prod", "aws_endpoint_url": aws.url,
        "kubernetes_endpoint_url": emulator.base_url, "node_role_arn": "arn:aws:iam::123456789012:role/nodes",
        "subnet_ids": made["subnet_ids"], "runtime_images": RUNTIME_IMAGES})


@pytest.fixture
def deployment(eks_cluster):
    spec = gpu_spec(prefill=_pool("p5.48xlarge", 8, 8), decode=_pool("g6e.xlarge", 1, 1, nodes=2))
    return DeploymentFactory(team=TeamFactory(slug="ml-research"), cluster=eks_cluster, name="llama", spec=spec)


def _eks(aws):
    return boto3.client("eks", region_name=REGION, endpoint_url=aws.url)


def test_node_groups_are_created_with_types_sizes_labels_and_gpu_taints(aws, deployment):
    target = EksTarget(deployment.cluster)
    step = target.ensure_node_pools(deployment)
    assert not step.ready and "creating" in step.message  # created this pass
    step = target.ensure_node_pools(deployment)  # EKS is still creating one: the pass waits
    assert not step.ready and f"tandem-d{deployment.pk}-decode: creating" in step.message
    assert target.ensure_node_pools(deployment).ready
    prefill = _eks(aws).describe_nodegroup(clusterName="gpu-prod",
                                           nodegroupName=f"tandem-d{deployment.pk}-prefill")["nodegroup"]
    assert prefill["instanceTypes"] == ["p5.48xlarge"]
    assert prefill["scalingConfig"] == {"minSize": 1, "maxSize": 1, "desiredSize": 1}
    assert prefill["labels"]["tandem.dev/pool"] == "prefill"
    assert {"key": "vpc.amazonaws.com/efa", "value": "true", "effect": "NO_SCHEDULE"} in prefill["taints"]
    decode = _eks(aws).describe_nodegroup(clusterName="gpu-prod",
                                          nodegroupName=f"tandem-d{deployment.pk}-decode")["nodegroup"]
    assert decode["scalingConfig"]["desiredSize"] == 2
    assert decode["taints"] == [{"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"}]


def test_an_update_resizes_only_the_pool_that_changed(aws, deployment):
    target = EksTarget(deployment.cluster)
    _ready(target, deployment)
    deployment.spec["decode"]["nodes"] = 3
    aws.hits.clear()
    step = target.ensure_node_pools(deployment)
    assert "resizing to 3" in step.message and not step.ready
    updates = [p for m, p in aws.hits if m == "POST" and p.endswith("/update-config")]
    assert updates == [f"/clusters/gpu-prod/node-groups/tandem-d{deployment.pk}-decode/update-config"]
    assert _eks(aws).describe_nodegroup(clusterName="gpu-prod", nodegroupName=f"tandem-d{deployment.pk}-decode")[
        "nodegroup"]["scalingConfig"]["desiredSize"] == 3


def test_the_kubernetes_side_authenticates_with_an_sts_presigned_token(aws, emulator, deployment):
    target = EksTarget(deployment.cluster)
    objects, _ = target.desired(deployment)
    target.apply(deployment, objects)
    auth = emulator.authorizations[-1]
    token = auth.removeprefix("Bearer k8s-aws-v1.")
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    assert "Action=GetCallerIdentity" in url and "X-Amz-Signature=" in url and "x-k8s-aws-id" in url
    rs = emulator.rayservices()[0]
    selector = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"]
    assert selector == {"eks.amazonaws.com/nodegroup": f"tandem-d{deployment.pk}-prefill"}



def test_the_head_and_both_pools_run_the_image_the_cluster_registered_by_digest(aws, emulator, deployment):
    target = EksTarget(deployment.cluster)
    objects, _ = target.desired(deployment)
    target.apply(deployment, objects)
    cluster = emulator.rayservices()[0]["spec"]["rayClusterConfig"]
    assert [g["template"]["spec"]["containers"][0]["image"] for g in [cluster["headGroupSpec"],
                                                                      *cluster["workerGroupSpecs"]]] == \
        [RUNTIME_IMAGES["ray-2.60.0-vllm-0.29.0"]] * 3
    assert cluster["rayVersion"] == "2.60.0"  # the registered runtime's Ray


def test_a_little_throttling_is_absorbed_and_a_lot_is_transient(aws, deployment):
    target = EksTarget(deployment.cluster)
    aws.inject("GET", NODEGROUPS, count=2)  # botocore's standard retry mode rides this out
    target.ensure_node_pools(deployment)
    aws.inject("GET", NODEGROUPS, count=10)
    with pytest.raises(TransientError, match="throttling"):
        EksTarget(deployment.cluster).ensure_node_pools(deployment)


def test_denied_credentials_are_permanent(aws, deployment):
    aws.inject("POST", NODEGROUPS, status=403, code="AccessDeniedException")
    aws.inject("GET", NODEGROUPS, status=404, code="ResourceNotFoundException", count=2)
    with pytest.raises(PermanentError, match="refused the worker's credentials"):
        EksTarget(deployment.cluster).ensure_node_pools(deployment)


def test_teardown_deletes_the_kubernetes_objects_and_only_the_node_groups_tandem_created(aws, emulator, deployment):
    eks = _eks(aws)
    eks.create_nodegroup(clusterName="gpu-prod", nodegroupName="someone-elses", nodeRole="arn:aws:iam::123456789012:role/n",
                         subnets=deployment.cluster.config["subnet_ids"],
                         scalingConfig={"minSize": 1, "maxSize": 1, "desiredSize": 1})
    target = EksTarget(deployment.cluster)
    target.ensure_node_pools(deployment)
    objects, _ = target.desired(deployment)
    target.apply(deployment, objects)
    for _ in range(5):
        if (step := EksTarget(deployment.cluster).teardown(deployment)).ready:
            break
    assert step.ready, step.message
    assert emulator.live_objects() == []
    assert sorted(eks.list_nodegroups(clusterName="gpu-prod")["nodegroups"]) == ["someone-elses", "system"]


def _ready(target, d):
    for _ in range(5):
        if target.ensure_node_pools(d).ready:
            return
    raise AssertionError("node groups never became ready")


def _torn_down(target, d):
    for _ in range(5):
        if target.teardown(d).ready:
            return
    raise AssertionError("teardown never finished")


def _scaling(aws, name):
    return _eks(aws).describe_nodegroup(clusterName="gpu-prod", nodegroupName=name)["nodegroup"]["scalingConfig"]


def test_two_teams_whose_names_collide_cannot_resize_or_delete_each_others_node_groups(aws, eks_cluster):
    """Team `ml` + `research-chat` and team `ml-research` + `chat` once shared `tandem-ml-research-chat-*`."""
    a = DeploymentFactory(team=TeamFactory(slug="ml"), cluster=eks_cluster, name="research-chat",
                          spec=gpu_spec(prefill=_pool("g6e.xlarge", 1, 1), decode=_pool("g6e.xlarge", 1, 1, nodes=2)))
    b = DeploymentFactory(team=TeamFactory(slug="ml-research"), cluster=eks_cluster, name="chat",
                          spec=gpu_spec(prefill=_pool("g6e.xlarge", 1, 1), decode=_pool("g6e.xlarge", 1, 1, nodes=3)))
    target = EksTarget(eks_cluster)
    _ready(target, a)
    a_groups = {s: target.nodegroup_name(a, s) for s in ("prefill", "decode")}
    _ready(target, b)
    assert not set(a_groups.values()) & {target.nodegroup_name(b, s) for s in ("prefill", "decode")}
    assert _scaling(aws, a_groups["decode"])["desiredSize"] == 2  # B's 3 nodes went to B's own node group
    _torn_down(EksTarget(eks_cluster), b)
    assert sorted(_eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"]) == \
        sorted([*a_groups.values(), "system"])
    assert EksTarget(eks_cluster).ensure_node_pools(a).ready


def test_a_node_group_of_another_deployment_under_our_name_is_a_permanent_error_naming_both(aws, deployment):
    """Whatever the name, Tandem resizes or deletes a node group only when its deployment-id tag is ours."""
    target = EksTarget(deployment.cluster)
    name = target.nodegroup_name(deployment, "decode")
    _eks(aws).create_nodegroup(clusterName="gpu-prod", nodegroupName=name, nodeRole="arn:aws:iam::123456789012:role/n",
                               subnets=deployment.cluster.config["subnet_ids"], instanceTypes=["g6e.xlarge"],
                               scalingConfig={"minSize": 5, "maxSize": 5, "desiredSize": 5},
                               tags={"tandem.dev/managed-by": "tandem", "tandem.dev/deployment-id": "999999",
                                     "tandem.dev/team": "other-team", "tandem.dev/deployment": "llama"})
    aws.hits.clear()
    with pytest.raises(PermanentError) as caught:
        _ready(EksTarget(deployment.cluster), deployment)
    message = str(caught.value)
    assert "deployment 999999 (other-team/llama)" in message
    assert f"deployment {deployment.pk} (ml-research/llama)" in message
    with pytest.raises(PermanentError, match="will not delete it"):
        _torn_down(EksTarget(deployment.cluster), deployment)
    assert not [p for m, p in aws.hits if m in ("POST", "DELETE") and name in p]  # neither resized nor deleted
    assert _scaling(aws, name)["desiredSize"] == 5


def test_a_node_group_named_before_ids_is_kept_by_its_own_deployment(aws, deployment):
    """A deployment from before node groups were named by id keeps its (id-tagged) node groups: no second set."""
    legacy = {s: f"tandem-ml-research-llama-{s}" for s in ("prefill", "decode")}
    for stage, name in legacy.items():
        pool = deployment.spec_typed.pool(stage)
        _eks(aws).create_nodegroup(clusterName="gpu-prod", nodegroupName=name, nodeRole="arn:aws:iam::123456789012:role/n",
                                   subnets=deployment.cluster.config["subnet_ids"], instanceTypes=[pool.instance_type],
                                   scalingConfig={"minSize": pool.nodes, "maxSize": pool.nodes,
                                                  "desiredSize": pool.nodes},
                                   tags={"tandem.dev/managed-by": "tandem",
                                         "tandem.dev/deployment-id": str(deployment.pk)})
        aws.advance(name, cluster="gpu-prod")  # made long ago: ACTIVE
    target = EksTarget(deployment.cluster)
    assert target.ensure_node_pools(deployment).ready
    assert target.node_selectors(deployment)["decode"] == {"eks.amazonaws.com/nodegroup": legacy["decode"]}
    _torn_down(EksTarget(deployment.cluster), deployment)
    assert _eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"] == ["system"]  # the cluster's own


# --- faults EKS reports: injected into moto's own state, driven through the reconcile pipeline ------------------
@pytest.fixture
def approved(eks_cluster, redis_client):
    """An approved deployment the pipeline drives onto the EKS cluster (whose model sources allow the spec)."""
    from deployments.lifecycle import Status
    from tests.factories import MODEL_SOURCES

    eks_cluster.config["model_sources"] = MODEL_SOURCES
    eks_cluster.save()
    spec = gpu_spec(prefill=_pool("p5.48xlarge", 8, 8), decode=_pool("g6e.xlarge", 1, 1, nodes=2))
    return DeploymentFactory(team=TeamFactory(slug="ml-research"), cluster=eks_cluster, name="llama", spec=spec,
                             status=Status.APPROVED)


def _moto_cluster(name: str = "gpu-prod"):
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.eks.models import eks_backends

    return eks_backends[DEFAULT_ACCOUNT_ID][REGION].clusters[name]


def _passed(d):
    from deployments.models import Deployment
    from workers.pipeline import reconcile_pass

    reconcile_pass(d.pk)
    return Deployment.objects.get(pk=d.pk)


@pytest.mark.parametrize(("status", "advice"), [
    ("CREATE_FAILED", "Tandem deleted it; check the instance type's availability and quota in the cluster's "
                      "subnets, then retry."),
    ("DEGRADED", "fix it in the EKS console, then retry."),
])
def test_a_node_group_that_fails_or_degrades_fails_the_deployment_with_eks_words_and_what_to_do(
        aws, approved, status, advice):
    assert _passed(approved).status == "provisioning"  # the node groups are asked for
    group = _moto_cluster().nodegroups[f"tandem-d{approved.pk}-prefill"]
    group.status = status
    group.health = {"issues": [{"code": "InsufficientFreeAddresses", "resourceIds": ["subnet-1"],
                                "message": "Subnet subnet-1 has no free addresses"}]}
    d = _passed(approved)
    assert d.status == "failed"
    assert f"Node group tandem-d{approved.pk}-prefill " in d.status_reason
    assert "InsufficientFreeAddresses: Subnet subnet-1 has no free addresses" in d.status_reason
    assert d.status_reason.endswith(advice)


def test_a_cluster_that_is_not_active_is_waited_for_and_a_failed_one_fails_the_deployment(aws, approved):
    _moto_cluster().status = "UPDATING"
    d = _passed(approved)
    assert d.status == "provisioning" and d.transient_errors == 1, d.status_reason
    assert d.events.filter(kind="transient_error").get().message == \
        "EKS cluster gpu-prod is UPDATING; waiting for ACTIVE."
    _moto_cluster().status = "FAILED"
    d = _passed(approved)
    assert d.status == "failed"
    assert d.status_reason == ("EKS cluster gpu-prod is FAILED: nothing can run on it. Fix or recreate it in the "
                               "EKS console (or register another cluster), then retry.")


def test_a_provision_longer_than_the_token_lives_keeps_its_credentials(aws, emulator, approved):
    """EKS refuses a presigned token some time after it was signed (15 minutes; 2 s here). Each pass signs its own
    (a pass lasts at most the task time limit, under the token's life), so a provision that takes longer than
    the token lives reaches running without a 401."""
    emulator.token_max_age, emulator.ready_after = 2.0, 4.0
    started = time.monotonic()
    d = wait_for(lambda: (r := _passed(approved)).status in ("running", "failed") and r, timeout=30, every=0.3,
                 what="running")
    assert d.status == "running", d.status_reason
    assert time.monotonic() - started > emulator.token_max_age
    assert len(set(emulator.authorizations)) > 1  # tokens signed at different times


def test_a_token_eks_refuses_fails_the_deployment_saying_what_the_worker_needs(aws, emulator, approved):
    emulator.token_max_age = -1.0  # every token refused, as for an IAM role the cluster does not let in
    d = wait_for(lambda: (r := _passed(approved)).status == "failed" and r, timeout=20, every=0.2, what="failed")
    assert d.status_reason.startswith("Kubernetes refused Tandem's credentials on eks-prod (401)")
    assert "give the worker's IAM role access to the cluster (an EKS access entry" in d.status_reason
    assert "kubeconfig" not in d.status_reason


def test_every_pass_uses_the_one_ca_file_of_its_cluster(monkeypatch, tmp_path):
    """The worker's /tmp is a small emptyDir: a CA copy per pass would fill it. One file per CA, written once."""
    import tempfile

    from workers.clients import kubernetes_api_from_token

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    paths = {kubernetes_api_from_token(host="https://eks.example", token="t",
                                       ca_data=base64.b64encode(pem).decode()).configuration.ssl_ca_cert
             for _ in range(3)}
    assert len(paths) == 1 and list(tmp_path.iterdir()) == [tmp_path / paths.pop().rsplit("/", 1)[1]]
    assert next(tmp_path.iterdir()).read_bytes() == pem
    other = kubernetes_api_from_token(host="https://eks2.example", token="t",
                                      ca_data=base64.b64encode(pem + b"\n").decode()).configuration.ssl_ca_cert
    assert len(list(tmp_path.iterdir())) == 2 and open(other, "rb").read() == pem + b"\n"

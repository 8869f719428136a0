"""What the eks driver asks EC2 and EKS for, read back from moto's server (made as strict as EKS by
tests/support/eks_rules.py) with real boto3: launch templates, EFA, subnets, capacity, failures, call counts."""
import base64
import dataclasses
import email
from datetime import timedelta

import boto3
import pytest
import yaml
from django.utils import timezone

from deployments.catalog import INSTANCE_TYPES

from deployments.lifecycle import Status
from deployments.manifests import EFA_HUGEPAGES
from deployments.models import Cluster, Deployment
from deployments.services.actions import deployment_retry
from deployments.services.clusters import cluster_update
from tests.factories import MODEL_SOURCES, ClusterFactory, DeploymentFactory, TeamFactory
from tests.support.eks_nodes import eks_emulated
from tests.workers.conftest import gpu_spec
from workers.pipeline import reconcile_pass
from workers.targets.base import PermanentError
from workers.targets.eks import EksTarget
from workers.targets.eks_launch_template import launch_template_data

REGION = "us-west-2"


def _pool(itype, gpus, tp, nodes=1):
    return {"instance_type": itype, "nodes": nodes, "gpus_per_node": gpus, "tensor_parallel_size": tp}


def _cluster(aws, emulator, *, zones=("a",), public=False, **config):
    made = eks_emulated(aws, emulator, name="gpu-prod", region=REGION, zones=zones, public=public)
    return ClusterFactory(name="eks-prod", kind=Cluster.Kind.EKS, config={
        "region": REGION, "cluster_name": "gpu-prod", "aws_endpoint_url": aws.url,
        "kubernetes_endpoint_url": emulator.base_url, "node_role_arn": "arn:aws:iam::123456789012:role/nodes",
        "subnet_ids": made["subnet_ids"], "model_sources": MODEL_SOURCES, **config}), made


def _deployment(cluster, status=Status.APPROVED):
    spec = gpu_spec(prefill=_pool("p5.48xlarge", 8, 8), decode=_pool("g6e.xlarge", 1, 1, nodes=2))
    return DeploymentFactory(team=TeamFactory(slug="ml-research"), cluster=cluster, name="llama", spec=spec,
                             status=status)


def _eks(aws):
    return boto3.client("eks", region_name=REGION, endpoint_url=aws.url)


def _ec2(aws):
    return boto3.client("ec2", region_name=REGION, endpoint_url=aws.url)


def _group(aws, name):
    return _eks(aws).describe_nodegroup(clusterName="gpu-prod", nodegroupName=name)["nodegroup"]


def _template(aws, ng):
    return _ec2(aws).describe_launch_template_versions(
        LaunchTemplateId=ng["launchTemplate"]["id"], Versions=[ng["launchTemplate"]["version"]],
    )["LaunchTemplateVersions"][0]["LaunchTemplateData"]


def _passed(d):
    reconcile_pass(d.pk)
    return Deployment.objects.get(pk=d.pk)


def test_an_efa_pool_runs_on_a_launch_template_with_every_network_card_a_placement_group_and_its_security_group(
        aws, emulator, db):
    cluster, made = _cluster(aws, emulator)
    d = _deployment(cluster)
    EksTarget(cluster).ensure_node_pools(d)
    prefill = _group(aws, f"tandem-d{d.pk}-prefill")
    data = _template(aws, prefill)
    cards = data["NetworkInterfaces"]
    assert sorted(c["NetworkCardIndex"] for c in cards) == list(range(32))  # p5.48xlarge has 32 network cards
    assert {c["InterfaceType"] for c in cards} == {"efa"}
    efa_group = next(g for g in cards[0]["Groups"] if g != made["cluster_security_group_id"])
    assert all(set(c["Groups"]) == {efa_group, made["cluster_security_group_id"]} for c in cards)
    sg = _ec2(aws).describe_security_groups(GroupIds=[efa_group])["SecurityGroups"][0]
    for rules in (sg["IpPermissions"], sg["IpPermissionsEgress"]):
        assert any(r["IpProtocol"] == "-1" and [p["GroupId"] for p in r["UserIdGroupPairs"]] == [efa_group]
                   for r in rules)
    placement = _ec2(aws).describe_placement_groups(GroupNames=[data["Placement"]["GroupName"]])["PlacementGroups"]
    assert [p["Strategy"] for p in placement] == ["cluster"]
    assert prefill["subnets"] == made["subnet_ids"][:1]
    assert prefill["capacityType"] == "ON_DEMAND"
    assert "IamInstanceProfile" not in data
    # User data EKS can merge (MIME multipart): the 30 TB NVMe instance store as RAID0 under containerd and the
    # kubelet (images and weights; EKS's default root disk is 20 GiB), and hugepages reserved for at least what
    # the Ray pod on the node requests (manifests.EFA_HUGEPAGES).
    parts = _user_data(data)
    assert yaml.safe_load(parts["application/node.eks.aws"]) == {
        "apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig",
        "spec": {"instance": {"localStorage": {"strategy": "RAID0"}}}}
    pages = int(parts["text/x-shellscript"].split("vm.nr_hugepages = ")[1].split("'")[0])
    assert pages * 2 >= int(EFA_HUGEPAGES.removesuffix("Mi"))
    decode = _template(aws, _group(aws, f"tandem-d{d.pk}-decode"))  # g6e.xlarge: no EFA, no placement group
    assert "NetworkInterfaces" not in decode and "Placement" not in decode
    assert set(_user_data(decode)) == {"application/node.eks.aws"}  # its 250 GB NVMe holds image and 48 GB


def _user_data(data) -> dict[str, str]:
    message = email.message_from_bytes(base64.b64decode(data["UserData"]))
    assert message.is_multipart()
    return {part.get_content_type(): part.get_payload() for part in message.get_payload()}


def test_a_type_without_an_instance_store_big_enough_gets_a_root_volume_for_image_and_weights():
    big = dataclasses.replace(INSTANCE_TYPES["p5.48xlarge"], nvme_gb=0)
    data = launch_template_data(instance=big, security_group_ids=["sg-1"], placement_group="pg",
                                capacity_reservation_id=None, capacity_block=False)
    assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] >= 8 * 80 + 15  # 8 × 80 GB of GPU memory, the image
    assert set(_user_data(data)) == {"text/x-shellscript"}


def test_subnets_in_two_zones_fail_the_deployment_before_anything_is_created(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator, zones=("a", "b"))
    d = _passed(_deployment(cluster))
    assert d.status == "failed"
    assert d.status_reason.startswith("The cluster's subnet_ids span us-west-2a, us-west-2b: EFA does not cross")
    assert _eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"] == ["system"]
    assert "ec2:CreateLaunchTemplate" not in aws.operations


def test_after_the_cluster_is_edited_to_one_zone_a_retry_provisions_there(aws, emulator, platform_admin):
    """The fix the preflight names (keep one zone's subnets), applied with cluster_update: the driver reads the
    cluster's config on every pass, so the retried deployment's node groups land in the zone that was kept."""
    cluster, made = _cluster(aws, emulator, zones=("a", "b"))
    d = _passed(_deployment(cluster))
    assert d.status == "failed"

    kept = made["subnet_ids"][1:]  # zone b's
    cluster_update(actor=platform_admin, cluster=cluster, config={**cluster.config, "subnet_ids": kept})
    deployment_retry(actor=platform_admin, deployment=d)
    _passed(d)
    assert _group(aws, f"tandem-d{d.pk}-prefill")["subnets"] == kept
    assert _group(aws, f"tandem-d{d.pk}-decode")["subnets"] == kept


def test_a_public_subnet_is_refused(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator, public=True)
    d = _passed(_deployment(cluster))
    assert d.status == "failed"  # (subnet ids are redacted from what users read)
    assert d.status_reason.startswith("Subnet [a network of cluster eks-prod] gives instances public IP addresses")
    assert _eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"] == ["system"]


@pytest.mark.parametrize("capacity", ["SPOT", "CAPACITY_BLOCK"])
def test_the_cluster_names_the_capacity_the_node_groups_run_on(aws, emulator, db, capacity):
    reservation = "cr-0123456789abcdef0"
    cluster, _ = _cluster(aws, emulator, capacity_type=capacity,
                          capacity_reservation_ids={"p5.48xlarge": reservation, "g6e.xlarge": reservation})
    d = _deployment(cluster)
    EksTarget(cluster).ensure_node_pools(d)
    prefill = _group(aws, f"tandem-d{d.pk}-prefill")
    assert prefill["capacityType"] == capacity
    data = _template(aws, prefill)
    if capacity == "CAPACITY_BLOCK":
        assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
        assert data["CapacityReservationSpecification"]["CapacityReservationTarget"] == \
            {"CapacityReservationId": reservation}
    else:  # spot comes from capacityType; a spot request in the template is one EKS refuses
        assert "InstanceMarketOptions" not in data and "CapacityReservationSpecification" not in data


def test_a_capacity_block_without_a_reservation_for_the_type_is_a_permanent_error(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator, capacity_type="CAPACITY_BLOCK",
                          capacity_reservation_ids={"g6e.xlarge": "cr-0123456789abcdef0"})
    d = _deployment(cluster)
    with pytest.raises(PermanentError, match="names no reservation for p5.48xlarge"):
        EksTarget(cluster).ensure_node_pools(d)


def test_no_capacity_fails_with_ekss_words_frees_the_group_and_a_retry_creates_it_again(aws, emulator, db):
    from deployments.services.actions import deployment_retry

    cluster, _ = _cluster(aws, emulator)
    aws.short_of("p5.48xlarge")
    d = _passed(_deployment(cluster))
    assert d.status == "provisioning"
    d = _passed(d)
    name = f"tandem-d{d.pk}-prefill"
    assert d.status == "failed"
    assert "AsgInstanceLaunchFailures: Could not launch On-Demand Instances. InsufficientInstanceCapacity - We " \
           "currently do not have sufficient p5.48xlarge capacity" in d.status_reason
    assert ("DELETE", f"/clusters/gpu-prod/node-groups/{name}") in aws.hits  # it stops holding anything
    aws.short.clear()  # capacity came back
    deployment_retry(actor=d.requested_by, deployment=d)
    for _ in range(3):
        d = _passed(d)
    assert _group(aws, name)["status"] == "ACTIVE"
    assert d.status != "failed", d.status_reason


def test_past_the_deadline_the_deployment_fails_with_ekss_reason_and_frees_its_node_groups(aws, emulator, db):
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.eks.models import eks_backends

    cluster, _ = _cluster(aws, emulator, provisioning_deadline_minutes=30)
    d = _passed(_deployment(cluster))
    group = eks_backends[DEFAULT_ACCOUNT_ID][REGION].clusters["gpu-prod"].nodegroups[f"tandem-d{d.pk}-prefill"]
    group.status = "DEGRADED"  # a transient issue: waited for, up to the deadline
    group.health = {"issues": [{"code": "AsgInstanceLaunchFailures", "resourceIds": ["asg"],
                                "message": "Could not launch On-Demand Instances. InsufficientInstanceCapacity"}]}
    d = _passed(d)
    assert d.status == "provisioning", d.status_reason
    Deployment.objects.filter(pk=d.pk).update(status_changed_at=timezone.now() - timedelta(minutes=31))
    d = _passed(d)
    assert d.status == "failed"
    assert d.status_reason.startswith("The node groups were not ready within the cluster's 30-minute provisioning "
                                      f"deadline: tandem-d{d.pk}-prefill is DEGRADED (AsgInstanceLaunchFailures: "
                                      "Could not launch On-Demand Instances. InsufficientInstanceCapacity)")
    left = {n: _group(aws, n)["status"] for n in _eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"]
            if n != "system"}
    assert set(left.values()) <= {"DELETING"}, left


def test_a_pass_over_a_serving_deployment_describes_the_cluster_once_and_each_node_group_once(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator)
    d = _deployment(cluster)
    for _ in range(10):
        if (d := _passed(d)).status == "running":
            break
    assert d.status == "running", d.status_reason
    aws.hits.clear()
    aws.operations.clear()
    assert _passed(d).status == "running"
    eks_calls = [(m, p) for m, p in aws.hits if p.startswith("/clusters")]
    assert sorted(eks_calls) == sorted([("GET", "/clusters/gpu-prod"),
                                        ("GET", f"/clusters/gpu-prod/node-groups/tandem-d{d.pk}-prefill"),
                                        ("GET", f"/clusters/gpu-prod/node-groups/tandem-d{d.pk}-decode")])
    assert sorted(aws.operations) == ["eks:DescribeCluster", "eks:DescribeNodegroup", "eks:DescribeNodegroup"]


def test_a_cluster_at_eks_node_group_quota_fails_the_deployment_saying_so(aws, emulator, db):
    cluster, made = _cluster(aws, emulator)
    for i in range(29):  # beside the cluster's own system node group: 30
        _eks(aws).create_nodegroup(clusterName="gpu-prod", nodegroupName=f"other-{i}", subnets=made["subnet_ids"],
                                   nodeRole="arn:aws:iam::123456789012:role/n")
    d = _passed(_deployment(cluster))
    assert d.status == "failed"
    assert d.status_reason.startswith("EKS cluster gpu-prod has 30 managed node groups, EKS's limit per cluster")
    assert "ec2:CreateLaunchTemplate" not in aws.operations


def test_a_role_arn_is_assumed_for_every_aws_call(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator, role_arn="arn:aws:iam::123456789012:role/tandem-driver")
    d = _deployment(cluster)
    aws.access_keys.clear()
    EksTarget(cluster).ensure_node_pools(d)
    assert aws.access_keys[0] == "testing"  # the worker's own key signs AssumeRole only
    assumed = set(aws.access_keys[1:])
    assert len(assumed) == 1 and "testing" not in assumed
    assert len(aws.access_keys) > 5  # EKS and EC2 calls, all under the role


def test_teardown_removes_the_launch_templates_and_placement_groups_with_the_node_groups(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator)
    d = _deployment(cluster)
    target = EksTarget(cluster)
    target.ensure_node_pools(d)
    assert len(_ec2(aws).describe_launch_templates()["LaunchTemplates"]) == 2
    for _ in range(5):
        if EksTarget(cluster).teardown(d).ready:
            break
    assert _eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"] == ["system"]
    assert _ec2(aws).describe_launch_templates()["LaunchTemplates"] == []
    assert _ec2(aws).describe_placement_groups()["PlacementGroups"] == []


def test_the_fatal_issue_codes_are_codes_eks_reports():
    """A misspelt code would never match, and its DEGRADED group would be waited on until the deadline."""
    from workers.targets.eks import FATAL_ISSUES

    model = boto3.client("eks", region_name=REGION).meta.service_model
    codes = set(model.shape_for("NodegroupIssueCode").enum)
    assert FATAL_ISSUES < codes and "AsgInstanceLaunchFailures" not in FATAL_ISSUES


def test_every_aws_call_of_a_deployments_life_is_one_the_driver_policy_allows_and_it_allows_no_more(
        aws, emulator, db):
    """Measured from moto's request log (not read from the code): the cluster's AWS preflight (registering it runs
    the checks), then a deployment's create (EFA and not), resize, pause, tear down."""
    import json

    from tests.deploy.render import ROOT
    from tests.deploy.test_iam import IMPLIED
    from workers.preflight import Preflight

    cluster, _ = _cluster(aws, emulator)
    d = _deployment(cluster)
    aws.operations.clear()  # the cluster's own making is the platform team's, not the driver's
    preflight = Preflight(EksTarget(cluster))
    for check in (preflight.driver_iam, preflight.node_role_iam, preflight.subnets, preflight.efa_security_group,
                  preflight.nodegroup_quota):
        check()
    for _ in range(3):
        EksTarget(cluster).ensure_node_pools(d)
    d.spec["decode"]["nodes"] = 3
    EksTarget(cluster).ensure_node_pools(d)
    for _ in range(3):
        if EksTarget(cluster).pause(d).ready:
            break
    for _ in range(5):
        if EksTarget(cluster).teardown(d).ready:
            break
    made = {op for op in aws.operations if op.startswith(("eks:", "ec2:", "iam:"))}
    statements = json.loads((ROOT / "deploy" / "iam" / "eks-driver-policy.json").read_text())["Statement"]
    allowed = {a for s in statements if s["Effect"] == "Allow" for a in s["Action"]}
    assert made <= allowed, made - allowed
    assert allowed == made | set().union(*(IMPLIED.get(op, set()) for op in made))


def test_a_retry_deletes_a_group_an_earlier_attempt_left_failed_and_creates_it_again(aws, emulator, db):
    """EKS never retries a CREATE_FAILED group; one left from before this attempt began is replaced, not fatal."""
    from datetime import datetime, timezone as tz

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.eks.models import eks_backends

    cluster, _ = _cluster(aws, emulator)
    d = _deployment(cluster, status=Status.PROVISIONING)
    EksTarget(cluster).ensure_node_pools(d)
    name = f"tandem-d{d.pk}-prefill"
    group = eks_backends[DEFAULT_ACCOUNT_ID][REGION].clusters["gpu-prod"].nodegroups[name]
    group.status = "CREATE_FAILED"
    group.created_at = datetime.now(tz.utc) - timedelta(hours=2)  # before the retry (status_changed_at) began
    aws.hits.clear()
    step = EksTarget(cluster).ensure_node_pools(d)
    assert not step.ready and f"{name}: deleting the group a previous attempt failed to create" in step.message
    assert ("DELETE", f"/clusters/gpu-prod/node-groups/{name}") in aws.hits
    for _ in range(3):
        if EksTarget(cluster).ensure_node_pools(d).ready:
            break
    assert _group(aws, name)["status"] == "ACTIVE"


def test_a_new_instance_type_replaces_the_group_and_its_launch_template(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator)
    d = _deployment(cluster)
    for _ in range(3):
        EksTarget(cluster).ensure_node_pools(d)
    d.spec["prefill"] = {**d.spec["prefill"], "instance_type": "p4d.24xlarge"}
    for _ in range(4):
        if EksTarget(cluster).ensure_node_pools(d).ready:
            break
    prefill = _group(aws, f"tandem-d{d.pk}-prefill")
    assert prefill["instanceTypes"] == ["p4d.24xlarge"]
    assert len(_template(aws, prefill)["NetworkInterfaces"]) == 4  # p4d.24xlarge has 4 network cards
    assert len(_ec2(aws).describe_launch_templates()["LaunchTemplates"]) == 2  # replaced, not added


def test_a_cluster_registered_without_node_role_or_subnets_fails_the_deployment_naming_them(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator)
    Cluster.objects.filter(pk=cluster.pk).update(config={k: v for k, v in cluster.config.items()
                                                         if k not in ("node_role_arn", "subnet_ids")})
    d = _passed(_deployment(Cluster.objects.get(pk=cluster.pk)))
    assert d.status == "failed"
    assert d.status_reason.startswith("Cluster eks-prod has no node_role_arn or subnet_ids in its config")
    assert _eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"] == ["system"]

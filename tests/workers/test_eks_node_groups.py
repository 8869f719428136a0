"""What the eks driver asks EC2 and EKS for, read back from moto's server (made as strict as EKS by
tests/support/eks_rules.py, its node groups as slow as EKS's by tests/support/nodegroup_phases.py) with real boto3:
launch templates, EFA, subnets, capacity and reservations, failures, what is left behind, call counts."""
import base64
import dataclasses
import email
from datetime import timedelta

import boto3
import pytest
from django.utils import timezone

from deployments.catalog import INSTANCE_TYPES

from deployments.lifecycle import Status
from deployments.manifests import EFA_HUGEPAGES
from deployments.models import Cluster, Deployment
from deployments.services.actions import deployment_retry
from deployments.services.clusters import cluster_update
from tests.factories import MODEL_SOURCES, RUNTIME_IMAGES, ClusterFactory, DeploymentFactory, TeamFactory
from tests.support.eks_nodes import eks_emulated
from tests.support.moto_server import eks_cluster_create
from tests.support.nodeadm import node_configs
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
        "subnet_ids": made["subnet_ids"], "model_sources": MODEL_SOURCES, "runtime_images": RUNTIME_IMAGES,
        **config}), made


def _deployment(cluster, status=Status.APPROVED, team="ml-research"):
    spec = gpu_spec(prefill=_pool("p5.48xlarge", 8, 8), decode=_pool("g6e.xlarge", 1, 1, nodes=2))
    return DeploymentFactory(team=TeamFactory(slug=team), cluster=cluster, name="llama", spec=spec, status=status)


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


def test_an_approved_deployment_on_a_cluster_without_its_runtime_image_fails_before_any_node_group(aws, emulator, db):
    """The image was unregistered after approval: the reconcile pass refuses with the fix, and buys nothing."""
    cluster, _ = _cluster(aws, emulator, runtime_images={})
    d = _passed(_deployment(cluster))
    assert d.status == Status.FAILED
    assert "has no image registered for runtime ray-2.60.0-vllm-0.29.0" in d.status_reason
    assert "build and register the runtime image (docs/install.md, step 5)" in d.status_reason
    assert _eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"] == ["system"]


def _status_now(name: str) -> str | None:
    """A node group's status in moto, read without a DescribeNodegroup (which would step its phase)."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.eks.models import eks_backends

    group = eks_backends[DEFAULT_ACCOUNT_ID][REGION].clusters["gpu-prod"].nodegroups.get(name)
    return group.status if group else None


def _tandem_ec2(aws) -> dict[str, list[str]]:
    """What of Tandem's (tagged tandem.dev/managed-by=tandem) is in EC2, by kind."""
    def ours(tags):
        return {t["Key"]: t["Value"] for t in tags or []}.get("tandem.dev/managed-by") == "tandem"

    ec2 = _ec2(aws)
    return {"launch templates": sorted(t["LaunchTemplateName"] for t in ec2.describe_launch_templates()[
                "LaunchTemplates"] if ours(t.get("Tags"))),
            "placement groups": sorted(g["GroupName"] for g in ec2.describe_placement_groups()["PlacementGroups"]
                                       if ours(g.get("Tags"))),
            "security groups": sorted(g["GroupName"] for g in ec2.describe_security_groups()["SecurityGroups"]
                                      if ours(g.get("Tags")))}


def _until(step, times: int = 8):
    """Call `step` (a target's pass) until it is ready, as the reconciler does."""
    for _ in range(times):
        if (result := step()).ready:
            return result
    raise AssertionError(f"never ready: {result.message}")


def test_an_efa_pool_runs_on_a_launch_template_with_every_network_card_a_placement_group_and_its_security_group(
        aws, emulator, db):
    cluster, made = _cluster(aws, emulator)
    d = _deployment(cluster)
    EksTarget(cluster).ensure_node_pools(d)
    prefill = _group(aws, f"tandem-d{d.pk}-prefill")
    data = _template(aws, prefill)
    cards = data["NetworkInterfaces"]
    assert sorted(c["NetworkCardIndex"] for c in cards) == list(range(32))  # p5.48xlarge has 32 network cards
    # card 0's EFA carries the node's IP address; the other 31 are EFA-only and take none from the subnet
    assert [(c["NetworkCardIndex"], c["DeviceIndex"], c["InterfaceType"]) for c in cards[:2]] == \
        [(0, 0, "efa"), (1, 1, "efa-only")]
    assert {c["InterfaceType"] for c in cards[1:]} == {"efa-only"}
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
    assert node_configs(data["UserData"]) == [{  # as nodeadm reads it: a field it does not know would be dropped
        "apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig",
        "spec": {"instance": {"localStorage": {"strategy": "RAID0"}}}}]
    assert data["MetadataOptions"] == {"HttpTokens": "required", "HttpPutResponseHopLimit": 1}  # no pod reaches IMDS
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
                                capacity_reservation_id=None, capacity_block=False, tags={})
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


ZONE = f"{REGION}a"  # eks_cluster_create's one subnet


@pytest.mark.parametrize("capacity", ["SPOT", "ON_DEMAND", "CAPACITY_BLOCK"])
def test_the_node_groups_run_on_the_capacity_the_cluster_names_as_aws_documents_it(aws, emulator, db, capacity):
    """SPOT: EKS's capacityType alone. An On-Demand Capacity Reservation: the template targets it, the instance type
    stays on the node group. A Capacity Block: the template holds market type, target and instance type, the node
    group no instance type (EKS user guide, "Create a managed node group with Capacity Blocks for ML"). Around a
    reservation Tandem makes no placement group: a Capacity Block needs none, and an ODCR made outside one cannot
    be moved into one (EC2 user guide, "Capacity Reservations in cluster placement groups")."""
    block = capacity == "CAPACITY_BLOCK"
    ids = {t: aws.ec2_rules.reserve(t, ZONE, capacity_block=block) for t in ("p5.48xlarge", "g6e.xlarge")}
    cluster, _ = _cluster(aws, emulator, capacity_type=capacity, capacity_reservation_ids=ids)
    d = _deployment(cluster)
    _until(lambda: EksTarget(cluster).ensure_node_pools(d))
    prefill = _group(aws, f"tandem-d{d.pk}-prefill")
    assert (prefill["capacityType"], prefill["status"]) == (capacity, "ACTIVE")
    data = _template(aws, prefill)
    if capacity == "SPOT":  # a spot request in the template is one EKS refuses
        assert "InstanceMarketOptions" not in data and "CapacityReservationSpecification" not in data
        assert data["Placement"] == {"GroupName": f"tandem-d{d.pk}-prefill"}
        return
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": ids["p5.48xlarge"]}}
    assert "Placement" not in data and _tandem_ec2(aws)["placement groups"] == []
    if block:
        assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
        assert data["InstanceType"] == "p5.48xlarge" and "instanceTypes" not in prefill
    else:
        assert "InstanceMarketOptions" not in data and "InstanceType" not in data
        assert prefill["instanceTypes"] == ["p5.48xlarge"]
    aws.hits.clear()  # the next pass knows the type even where EKS does not say it: nothing is replaced
    assert EksTarget(cluster).ensure_node_pools(d).ready
    assert not [h for h in aws.hits if h[0] == "DELETE"]


def test_an_odcr_made_in_a_placement_group_is_launched_in_that_group_and_tandem_leaves_it(aws, emulator, db):
    _ec2(aws).create_placement_group(GroupName="ml-reserved", Strategy="cluster")
    rid = aws.ec2_rules.reserve("p5.48xlarge", ZONE, placement_group="ml-reserved")
    cluster, _ = _cluster(aws, emulator, capacity_reservation_ids={"p5.48xlarge": rid})
    d = _deployment(cluster)
    _until(lambda: EksTarget(cluster).ensure_node_pools(d))  # EC2 launches them into the reservation
    assert _template(aws, _group(aws, f"tandem-d{d.pk}-prefill"))["Placement"] == {"GroupName": "ml-reserved"}
    assert _tandem_ec2(aws)["placement groups"] == []
    _until(lambda: EksTarget(cluster).teardown(d))
    assert [g["GroupName"] for g in _ec2(aws).describe_placement_groups()["PlacementGroups"]] == ["ml-reserved"]


@pytest.mark.parametrize(("reservation", "capacity", "says"), [
    ({"zone": f"{REGION}b"}, "ON_DEMAND", f"is in {REGION}b and the cluster's subnets are in {REGION}a"),
    ({"instance_type": "p4d.24xlarge"}, "ON_DEMAND", "reserves p4d.24xlarge, not p5.48xlarge"),
    ({"capacity_block": True}, "ON_DEMAND", "is a Capacity Block: set the cluster's capacity_type to CAPACITY_BLOCK"),
    ({}, "CAPACITY_BLOCK", "is an On-Demand Capacity Reservation: set the cluster's capacity_type to ON_DEMAND"),
    ({"count": 0}, "ON_DEMAND", "reserves 0 instance(s) and the pool needs 1"),
    ({"state": "expired"}, "ON_DEMAND", "is expired: no instance launches into it"),
    ({"capacity_block": True, "state": "scheduled", "starts_in": timedelta(hours=5)}, "CAPACITY_BLOCK",
     "after the cluster's 45-minute provisioning deadline"),
    ({"missing": True}, "ON_DEMAND", "does not exist in us-west-2"),
], ids=["zone", "type", "block-as-odcr", "odcr-as-block", "count", "expired", "block-too-late", "missing"])
def test_a_reservation_that_cannot_take_the_pool_fails_the_deployment_before_anything_is_made(
        aws, emulator, db, reservation, capacity, says):
    given = {"instance_type": "p5.48xlarge", "zone": ZONE, **reservation}
    rid = "cr-0123456789abcdef0" if given.pop("missing", False) else \
        aws.ec2_rules.reserve(given.pop("instance_type"), given.pop("zone"), **given)
    cluster, _ = _cluster(aws, emulator, capacity_type=capacity, capacity_reservation_ids={"p5.48xlarge": rid})
    d = _passed(_deployment(cluster))
    assert d.status == "failed"
    assert d.status_reason.startswith(f"Capacity reservation {rid} (the cluster's capacity_reservation_ids for "
                                      f"p5.48xlarge) "), d.status_reason
    assert says in d.status_reason
    assert "ec2:CreateLaunchTemplate" not in aws.operations
    assert _eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"] == ["system"]


def test_a_capacity_block_without_a_reservation_for_the_type_is_a_permanent_error(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator, capacity_type="CAPACITY_BLOCK",
                          capacity_reservation_ids={"g6e.xlarge": "cr-0123456789abcdef0"})
    d = _deployment(cluster)
    with pytest.raises(PermanentError, match="names no reservation for p5.48xlarge"):
        EksTarget(cluster).ensure_node_pools(d)


def _failed(d, passes: int = 5):
    for _ in range(passes):
        if (d := _passed(d)).status == "failed":
            return d
    raise AssertionError(f"not failed: {d.status} {d.status_reason}")


def test_no_capacity_fails_with_ekss_words_and_the_release_leaves_nothing_of_that_pool(aws, emulator, db):
    """The attempt fails (EC2 has no p5): the failed group is deleted at once, and the release of the failed
    deployment (its pause: workers.pipeline) waits while EKS deletes it, then frees what it ran on: its launch
    template, its placement group and, the cluster's last EFA pool gone, the EFA security group. The other pool's
    group stays, at zero nodes for a retry, with its launch template."""
    cluster, _ = _cluster(aws, emulator)
    aws.short_of("p5.48xlarge")
    d = _failed(_deployment(cluster))
    name = f"tandem-d{d.pk}-prefill"
    assert "AsgInstanceLaunchFailures: Could not launch On-Demand Instances. InsufficientInstanceCapacity - We " \
           "currently do not have sufficient p5.48xlarge capacity" in d.status_reason
    assert _status_now(name) == "DELETING"  # it stops holding anything
    step = EksTarget(cluster).pause(d)
    assert not step.ready and f"{name}: deleting" in step.message
    step = _until(lambda: EksTarget(cluster).pause(d))
    assert _tandem_ec2(aws) == {"launch templates": [f"tandem-d{d.pk}-decode"], "placement groups": [],
                                "security groups": []}
    assert step.message.endswith(f"Node groups scaled to zero: tandem-d{d.pk}-decode. Gone, with what they ran on: "
                                 f"{name}.")


def test_a_retry_waits_until_the_failed_group_is_gone_then_creates_it_again(aws, emulator, db):
    """EKS never retries a CREATE_FAILED group, and refuses a new group of its name while the old one is DELETING
    (minutes): the retry deletes the group the failed attempt left, creates nothing while it goes, then creates it
    afresh on a new launch template, and it becomes ACTIVE."""
    from datetime import datetime, timezone as tz

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.eks.models import eks_backends

    cluster, _ = _cluster(aws, emulator)
    d = _deployment(cluster, status=Status.PROVISIONING)
    _until(lambda: EksTarget(cluster).ensure_node_pools(d))
    name = f"tandem-d{d.pk}-prefill"
    before = _ec2(aws).describe_launch_templates(LaunchTemplateNames=[name])["LaunchTemplates"][0]["LaunchTemplateId"]
    group = eks_backends[DEFAULT_ACCOUNT_ID][REGION].clusters["gpu-prod"].nodegroups[name]
    group.status = "CREATE_FAILED"
    group.created_at = datetime.now(tz.utc) - timedelta(hours=2)  # before the retry (status_changed_at) began
    aws.phases.describes["DELETING"] = 2  # EKS takes a while
    aws.hits.clear()
    aws.operations.clear()
    step = EksTarget(cluster).ensure_node_pools(d)
    assert not step.ready and f"{name}: deleting the group a previous attempt failed to create" in step.message
    assert ("DELETE", f"/clusters/gpu-prod/node-groups/{name}") in aws.hits
    for _ in range(2):  # DELETING: the pass waits, and asks EKS for nothing
        step = EksTarget(cluster).ensure_node_pools(d)
        assert not step.ready and f"{name}: deleting" in step.message
    assert "eks:CreateNodegroup" not in aws.operations
    step = EksTarget(cluster).ensure_node_pools(d)
    assert f"{name}: creating 1 × p5.48xlarge" in step.message
    _until(lambda: EksTarget(cluster).ensure_node_pools(d))
    assert _group(aws, name)["status"] == "ACTIVE"
    after = _ec2(aws).describe_launch_templates(LaunchTemplateNames=[name])["LaunchTemplates"][0]["LaunchTemplateId"]
    assert after != before  # what the failed group ran on went with it


def test_past_the_deadline_the_deployment_fails_with_ekss_reason_and_leaves_nothing_behind(aws, emulator, db):
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.eks.models import eks_backends

    cluster, _ = _cluster(aws, emulator, provisioning_deadline_minutes=30)
    d = _passed(_deployment(cluster))
    group = eks_backends[DEFAULT_ACCOUNT_ID][REGION].clusters["gpu-prod"].nodegroups[f"tandem-d{d.pk}-prefill"]
    group.status = "DEGRADED"  # a transient issue: waited for, up to the deadline
    group.health = {"issues": [{"code": "AsgInstanceLaunchFailures", "resourceIds": ["asg"],
                                "message": "Could not launch On-Demand Instances. RequestLimitExceeded"}]}
    d = _passed(d)
    assert d.status == "provisioning", d.status_reason
    Deployment.objects.filter(pk=d.pk).update(status_changed_at=timezone.now() - timedelta(minutes=31))
    d = _passed(d)
    assert d.status == "failed"
    assert d.status_reason.startswith("The node groups were not ready within the cluster's 30-minute provisioning "
                                      f"deadline: tandem-d{d.pk}-prefill is DEGRADED (AsgInstanceLaunchFailures: "
                                      "Could not launch On-Demand Instances. RequestLimitExceeded)")
    left = {n: _status_now(n) for n in _eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"]
            if n != "system"}
    assert set(left.values()) <= {"DELETING"}, left
    _until(lambda: EksTarget(cluster).pause(d))  # the release of the failed deployment, once EKS deleted them
    assert _tandem_ec2(aws) == {"launch templates": [], "placement groups": [], "security groups": []}


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


def test_teardown_leaves_nothing_of_tandems_in_ec2_and_waits_for_the_efa_groups_interfaces(aws, emulator, db):
    """Launch templates and placement groups go with their node groups, and the EFA security group with the
    cluster's last EFA pool, once EC2 has released the network interfaces of the terminated nodes (until then EC2
    answers DependencyViolation, and the teardown waits for it)."""
    cluster, made = _cluster(aws, emulator)
    d = _deployment(cluster)
    EksTarget(cluster).ensure_node_pools(d)
    assert _tandem_ec2(aws) == {"launch templates": [f"tandem-d{d.pk}-decode", f"tandem-d{d.pk}-prefill"],
                                "placement groups": [f"tandem-d{d.pk}-prefill"], "security groups": ["tandem-efa"]}
    sg = _ec2(aws).describe_security_groups(GroupNames=["tandem-efa"])["SecurityGroups"][0]["GroupId"]
    eni = _ec2(aws).create_network_interface(SubnetId=made["subnet_ids"][0], Groups=[sg])["NetworkInterface"]
    for _ in range(3):
        step = EksTarget(cluster).teardown(d)
    assert not step.ready and "tandem-efa" in step.message and "network interfaces" in step.message
    assert _eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"] == ["system"]
    assert _tandem_ec2(aws) == {"launch templates": [], "placement groups": [], "security groups": ["tandem-efa"]}
    _ec2(aws).delete_network_interface(NetworkInterfaceId=eni["NetworkInterfaceId"])  # EC2 released it
    assert EksTarget(cluster).teardown(d).ready
    assert _tandem_ec2(aws) == {"launch templates": [], "placement groups": [], "security groups": []}


def test_the_efa_security_group_stays_while_another_deployments_efa_pool_uses_it(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator)
    first, second = _deployment(cluster), _deployment(cluster, team="search")
    for d in (first, second):
        _until(lambda: EksTarget(cluster).ensure_node_pools(d))
    _until(lambda: EksTarget(cluster).teardown(first))
    assert _tandem_ec2(aws)["security groups"] == ["tandem-efa"]
    _until(lambda: EksTarget(cluster).teardown(second))
    assert _tandem_ec2(aws)["security groups"] == []


def test_what_the_node_groups_launch_carries_the_pools_tags(aws, emulator, db):
    """Instances, volumes and network interfaces are tagged from the launch template as they launch: GPU spend is
    attributable to a team, a deployment and a pool, and an orphan can be found by its tags."""
    cluster, _ = _cluster(aws, emulator)
    d = _deployment(cluster)
    EksTarget(cluster).ensure_node_pools(d)
    for stage in ("prefill", "decode"):
        data = _template(aws, _group(aws, f"tandem-d{d.pk}-{stage}"))
        want = {"tandem.dev/managed-by": "tandem", "tandem.dev/deployment-id": str(d.pk),
                "tandem.dev/team": "ml-research", "tandem.dev/deployment": "llama", "tandem.dev/pool": stage}
        launched = {spec["ResourceType"]: {t["Key"]: t["Value"] for t in spec["Tags"]}
                    for spec in data["TagSpecifications"]}
        launched.pop("launch-template", None)  # moto copies the template's own tags in; EC2 does not
        assert launched == {"instance": want, "volume": want, "network-interface": want}


def test_the_fatal_issue_codes_are_codes_eks_reports():
    """A misspelt code would never match, and its DEGRADED group would be waited on until the deadline."""
    from workers.targets.eks import FATAL_ISSUES

    model = boto3.client("eks", region_name=REGION).meta.service_model
    codes = set(model.shape_for("NodegroupIssueCode").enum)
    assert FATAL_ISSUES < codes and "AsgInstanceLaunchFailures" not in FATAL_ISSUES


def test_every_aws_call_of_a_deployments_life_is_one_the_driver_policy_allows_and_it_allows_no_more(
        aws, emulator, db):
    """Measured from moto's request log (not read from the code): the cluster's AWS preflight (registering it runs
    the checks), then a deployment's create (EFA and not, one pool in a capacity reservation), resize, pause, tear
    down (the EFA security group goes with the last EFA pool)."""
    import json

    from tests.deploy.render import ROOT
    from tests.deploy.test_iam import IMPLIED
    from workers.preflight import Preflight

    rid = aws.ec2_rules.reserve("g6e.xlarge", ZONE, 4)
    cluster, _ = _cluster(aws, emulator, capacity_reservation_ids={"g6e.xlarge": rid})
    d = _deployment(cluster)
    aws.operations.clear()  # the cluster's own making is the platform team's, not the driver's
    preflight = Preflight(EksTarget(cluster))
    for check in (preflight.driver_iam, preflight.node_role_iam, preflight.subnets, preflight.efa_security_group,
                  preflight.nodegroup_quota, preflight.instance_offerings, preflight.vcpu_quotas,
                  preflight.runtime_images):
        check()
    _until(lambda: EksTarget(cluster).ensure_node_pools(d))
    d.spec["decode"]["nodes"] = 3
    EksTarget(cluster).ensure_node_pools(d)
    _until(lambda: EksTarget(cluster).pause(d))
    _until(lambda: EksTarget(cluster).teardown(d))
    assert "ec2:DeleteSecurityGroup" in aws.operations
    made = {op for op in aws.operations if op.startswith(("eks:", "ec2:", "iam:", "ecr:", "servicequotas:"))}
    statements = json.loads((ROOT / "deploy" / "iam" / "eks-driver-policy.json").read_text())["Statement"]
    allowed = {a for s in statements if s["Effect"] == "Allow" for a in s["Action"]}
    assert made <= allowed, made - allowed
    assert allowed == made | set().union(*(IMPLIED.get(op, set()) for op in made))


def test_a_new_instance_type_replaces_the_group_and_its_launch_template(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator)
    d = _deployment(cluster)
    _until(lambda: EksTarget(cluster).ensure_node_pools(d))
    d.spec["prefill"] = {**d.spec["prefill"], "instance_type": "p4d.24xlarge"}
    step = EksTarget(cluster).ensure_node_pools(d)
    assert f"tandem-d{d.pk}-prefill: replacing for p4d.24xlarge" in step.message
    _until(lambda: EksTarget(cluster).ensure_node_pools(d))
    prefill = _group(aws, f"tandem-d{d.pk}-prefill")
    assert prefill["instanceTypes"] == ["p4d.24xlarge"]
    assert len(_template(aws, prefill)["NetworkInterfaces"]) == 4  # p4d.24xlarge has 4 network cards
    assert len(_ec2(aws).describe_launch_templates()["LaunchTemplates"]) == 2  # replaced, not added


def test_a_group_replaced_by_one_without_efa_leaves_no_placement_group(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator)
    d = _deployment(cluster)
    _until(lambda: EksTarget(cluster).ensure_node_pools(d))
    assert _tandem_ec2(aws)["placement groups"] == [f"tandem-d{d.pk}-prefill"]
    d.spec["prefill"] = {**d.spec["prefill"], "instance_type": "g6.12xlarge", "gpus_per_node": 4,
                         "tensor_parallel_size": 4}
    _until(lambda: EksTarget(cluster).ensure_node_pools(d))
    assert _group(aws, f"tandem-d{d.pk}-prefill")["instanceTypes"] == ["g6.12xlarge"]
    assert _tandem_ec2(aws)["placement groups"] == []
    _until(lambda: EksTarget(cluster).teardown(d))
    assert _tandem_ec2(aws) == {"launch templates": [], "placement groups": [], "security groups": []}


def test_a_cluster_registered_without_node_role_or_subnets_fails_the_deployment_naming_them(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator)
    Cluster.objects.filter(pk=cluster.pk).update(config={k: v for k, v in cluster.config.items()
                                                         if k not in ("node_role_arn", "subnet_ids")})
    d = _passed(_deployment(Cluster.objects.get(pk=cluster.pk)))
    assert d.status == "failed"
    assert d.status_reason.startswith("Cluster eks-prod has no node_role_arn or subnet_ids in its config")
    assert _eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"] == ["system"]


# --- what the account can launch: checked before any node group is created; launch failures that do not heal ----------
CREATIONS = ("eks:CreateNodegroup", "ec2:CreateLaunchTemplate", "ec2:CreatePlacementGroup", "ec2:CreateSecurityGroup")


def test_an_instance_type_the_node_subnets_zone_does_not_offer_is_refused_before_anything_is_created(
        aws, emulator, db):
    aws.offerings({"p5.48xlarge": ["us-west-2b", "us-west-2c"]})
    cluster, _ = _cluster(aws, emulator)
    aws.operations.clear()
    d = _passed(_deployment(cluster))
    assert d.status == "failed"
    assert d.status_reason.startswith(
        "p5.48xlarge is not offered in us-west-2a, the Availability Zone of the cluster's node subnets (EC2 offers it "
        "in us-west-2b, us-west-2c): its node group's instances would never launch. Register private subnets of "
        "us-west-2b or us-west-2c as the cluster's subnet_ids (tandemctl cluster set eks-prod 'subnet_ids=[")
    assert "or choose an instance type offered in us-west-2a (g5.xlarge, " in d.status_reason
    assert not set(CREATIONS) & set(aws.operations), aws.operations
    assert _eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"] == ["system"]


def test_vcpus_past_the_familys_quota_with_tandems_other_node_groups_are_refused_before_anything_is_created(
        aws, emulator, db):
    """One p5.48xlarge (192 vCPUs) of P runs for another deployment; the quota is 192: a second p5 is refused with
    the numbers and the command that asks AWS for 384, and nothing of it is created."""
    aws.quota("L-417A185B", 192)
    cluster, _ = _cluster(aws, emulator)
    first = _deployment(cluster)
    for _ in range(3):
        EksTarget(cluster).ensure_node_pools(first)
    assert _group(aws, f"tandem-d{first.pk}-prefill")["status"] == "ACTIVE"
    second = DeploymentFactory(team=first.team, cluster=cluster, name="qwen", spec=first.spec, status=Status.APPROVED)
    aws.operations.clear()

    d = _passed(second)

    assert d.status == "failed"
    assert d.status_reason == (
        "This deployment's node groups need 192 vCPUs of the quota Running On-Demand P instances (L-417A185B: "
        "prefill 1 × p5.48xlarge) and Tandem's other node groups of the family run 192; the account's quota in "
        "us-west-2 is 192 vCPUs (instances outside Tandem's node groups count against it too). Ask AWS for at least "
        "384 vCPUs: aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-417A185B "
        "--desired-value 384 --region us-west-2 (or the Service Quotas console: Amazon EC2, Running On-Demand P "
        "instances); AWS may take a few days to grant it. Then retry.")
    assert not set(CREATIONS) & set(aws.operations), aws.operations
    assert set(_eks(aws).list_nodegroups(clusterName="gpu-prod")["nodegroups"]) == \
        {"system", f"tandem-d{first.pk}-prefill", f"tandem-d{first.pk}-decode"}


@pytest.mark.parametrize(("status", "message", "fix"), [
    ("CREATING", "Could not launch On-Demand Instances. VcpuLimitExceeded - You have requested more vCPU capacity "
                 "than your current vCPU limit of 96 allows for the instance bucket that the specified instance type "
                 "belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to "
                 "this limit. Launching EC2 instance failed.",
     "the account's vCPU quota for the instance family is below what the node groups launch"),
    ("DEGRADED", "Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have "
                 "sufficient p5.48xlarge capacity in the Availability Zone you requested (us-west-2a). Launching EC2 "
                 "instance failed.",
     "EC2 has no capacity of this instance type in the node subnets' zone now"),
    ("CREATING", "Could not launch On-Demand Instances. Unsupported - Your requested instance type (p5.48xlarge) is "
                 "not supported in your requested Availability Zone (us-west-2d). Please retry your request by not "
                 "specifying an Availability Zone or choosing us-west-2a, us-west-2b, us-west-2c. Launching EC2 "
                 "instance failed.",
     "the node subnets' zone does not offer this instance type"),
])
def test_a_launch_failure_that_waiting_does_not_fix_fails_the_deployment_at_once_and_frees_its_node_groups(
        aws, emulator, db, status, message, fix):
    """Long before the 45-minute deadline: the next pass after EKS reports it."""
    cluster, _ = _cluster(aws, emulator)
    d = _passed(_deployment(cluster))
    name = f"tandem-d{d.pk}-prefill"
    aws.report(name, cluster="gpu-prod", status=status,
               issues=[{"code": "AsgInstanceLaunchFailures", "message": message, "resourceIds": ["asg"]}])

    d = _passed(d)

    assert d.status == "failed"
    assert d.status_reason.startswith(f"Node group {name} cannot launch its instances (AsgInstanceLaunchFailures: "
                                      f"{message[:80]}")  # EKS's words (their aws.amazon.com link redacted)
    assert f"): {fix}" in d.status_reason
    assert d.status_reason.endswith("Tandem deleted that node group; the deployment's other node group is released to "
                                    "zero nodes, kept for a retry.")
    assert ("DELETE", f"/clusters/gpu-prod/node-groups/{name}") in aws.hits
    assert ("DELETE", f"/clusters/gpu-prod/node-groups/tandem-d{d.pk}-decode") not in aws.hits


def test_a_transient_launch_failure_is_waited_for(aws, emulator, db):
    cluster, _ = _cluster(aws, emulator)
    d = _passed(_deployment(cluster))
    aws.report(f"tandem-d{d.pk}-prefill", cluster="gpu-prod", status="DEGRADED", issues=[
        {"code": "AsgInstanceLaunchFailures", "resourceIds": ["asg"], "message":
         "Could not launch On-Demand Instances. RequestLimitExceeded - Request limit exceeded. "
         "Launching EC2 instance failed."}])
    step = EksTarget(cluster).ensure_node_pools(d)
    assert not step.ready
    assert f"tandem-d{d.pk}-prefill: degraded (AsgInstanceLaunchFailures: Could not launch On-Demand Instances. " \
           "RequestLimitExceeded" in step.message
    assert _passed(d).status == "provisioning"


def test_an_update_whose_node_group_cannot_grow_keeps_its_node_groups(aws, emulator, db):
    """While it updates, its node groups serve the previous generation: a launch failure does not delete them."""
    cluster, _ = _cluster(aws, emulator)
    d = _deployment(cluster, status=Status.UPDATING)
    for _ in range(3):
        EksTarget(cluster).ensure_node_pools(d)
    aws.report(f"tandem-d{d.pk}-decode", cluster="gpu-prod", status="DEGRADED", issues=[
        {"code": "AsgInstanceLaunchFailures", "resourceIds": ["asg"], "message":
         "Could not launch On-Demand Instances. VcpuLimitExceeded - You have requested more vCPU capacity than your "
         "current vCPU limit of 8 allows."}])
    aws.hits.clear()
    step = EksTarget(cluster).ensure_node_pools(d)
    assert not step.ready and "degraded (AsgInstanceLaunchFailures" in step.message
    assert not [h for h in aws.hits if h[0] == "DELETE"]


def test_a_quota_taken_by_instances_outside_tandem_fails_the_launch_and_the_deployment_at_once(aws, emulator, db):
    """Tandem counts only its own node groups; someone else's p5.48xlarge node group holds the account's 192 vCPUs of
    P, so EC2 refuses the launch (VcpuLimitExceeded, as the emulated account answers it) and the deployment fails on
    the next pass with EKS's words, the group that cannot launch deleted (the other goes to zero with the release)."""
    aws.quota("L-417A185B", 192)
    cluster, made = _cluster(aws, emulator)
    _eks(aws).create_nodegroup(clusterName="gpu-prod", nodegroupName="research-p5", subnets=made["subnet_ids"],
                               nodeRole="arn:aws:iam::123456789012:role/n", instanceTypes=["p5.48xlarge"],
                               scalingConfig={"minSize": 1, "maxSize": 1, "desiredSize": 1})
    d = _failed(_deployment(cluster))  # EKS reports it once the group's CREATING ends
    assert "VcpuLimitExceeded - You have requested more vCPU capacity than your current vCPU limit of 192 allows" in \
        d.status_reason
    assert "Tandem deleted that node group; the deployment's other node group is released to zero nodes" in \
        d.status_reason


def _moto_group(name: str):
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.eks.models import eks_backends

    return eks_backends[DEFAULT_ACCOUNT_ID][REGION].clusters["gpu-prod"].nodegroups[name]

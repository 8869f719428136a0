"""The EKS emulator (moto behind tests/support/eks_rules.py) refuses or fails what real EKS does, so the driver
tests cannot pass on a request EKS would not take. Plain boto3, no Tandem code."""
import base64

import boto3
import pytest
from botocore.exceptions import ClientError

from tests.support.moto_server import eks_cluster_create

REGION = "us-west-2"
ROLE = "arn:aws:iam::123456789012:role/nodes"
ONE = {"minSize": 1, "maxSize": 1, "desiredSize": 1}
MIME = base64.b64encode(b'MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="//"\n\n--//\n'
                        b'Content-Type: text/x-shellscript\n\n#!/bin/bash\ntrue\n--//--\n').decode()


@pytest.fixture
def made(aws):
    return eks_cluster_create(url=aws.url, name="c", region=REGION, zones=("a", "b"))


def _clients(aws):
    return (boto3.client("eks", region_name=REGION, endpoint_url=aws.url),
            boto3.client("ec2", region_name=REGION, endpoint_url=aws.url))


def _template(ec2, name, **data):
    return ec2.create_launch_template(LaunchTemplateName=name, LaunchTemplateData=data)["LaunchTemplate"]


def _refused(fn, **kwargs) -> str:
    with pytest.raises(ClientError) as caught:
        fn(**kwargs)
    return caught.value.response["Error"]["Code"]


def test_a_node_group_needs_a_node_role_and_existing_subnets(aws, made):
    eks, _ = _clients(aws)
    base = {"clusterName": "c", "nodegroupName": "g", "scalingConfig": ONE}
    assert _refused(eks.create_nodegroup, **base, nodeRole="", subnets=made["subnet_ids"]) == \
        "InvalidParameterException"
    assert _refused(eks.create_nodegroup, **base, nodeRole=ROLE, subnets=[]) == "InvalidParameterException"
    assert _refused(eks.create_nodegroup, **base, nodeRole=ROLE, subnets=["subnet-0123456789abcdef0"]) == \
        "InvalidParameterException"
    assert eks.list_nodegroups(clusterName="c")["nodegroups"] == []
    eks.create_nodegroup(**base, nodeRole=ROLE, subnets=made["subnet_ids"])


@pytest.mark.parametrize(("data", "why"), [
    ({"IamInstanceProfile": {"Name": "nodes"}}, "IamInstanceProfile"),
    ({"NetworkInterfaces": [{"DeviceIndex": 0, "SubnetId": "subnet-0123456789abcdef0"}]}, "may not name a subnet"),
    ({"InstanceMarketOptions": {"MarketType": "spot"}}, "capacityType SPOT"),
    ({"InstanceType": "g6e.xlarge"}, "not both"),  # and instanceTypes on the node group
    ({"UserData": base64.b64encode(b"#!/bin/bash\ntrue\n").decode()}, "MIME multi-part"),
])
def test_a_launch_template_eks_forbids_is_refused(aws, made, data, why):
    eks, ec2 = _clients(aws)
    template = _template(ec2, "lt", **data)
    kwargs = {"clusterName": "c", "scalingConfig": ONE, "nodeRole": ROLE, "subnets": made["subnet_ids"][:1],
              "instanceTypes": ["g6e.xlarge"]}
    with pytest.raises(ClientError) as caught:
        eks.create_nodegroup(**kwargs, nodegroupName="g", launchTemplate={"id": template["LaunchTemplateId"]})
    assert caught.value.response["Error"]["Code"] == "InvalidParameterException"
    assert why in caught.value.response["Error"]["Message"]
    fine = _template(ec2, "fine", UserData=MIME, MetadataOptions={"HttpTokens": "required"})
    eks.create_nodegroup(**kwargs, nodegroupName="ok", launchTemplate={"id": fine["LaunchTemplateId"]})


def test_a_capacity_block_needs_market_type_reservation_and_instance_type_in_the_template(aws, made):
    """EKS user guide, "Create a managed node group with Capacity Blocks for ML": any of them missing, or another
    capacity type, and the create request is rejected; the instance type is the template's, not the node group's."""
    eks, ec2 = _clients(aws)
    target = {"CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}}
    block = {"InstanceMarketOptions": {"MarketType": "capacity-block"}, "CapacityReservationSpecification": target}
    base = {"clusterName": "c", "scalingConfig": ONE, "nodeRole": ROLE, "subnets": made["subnet_ids"][:1],
            "capacityType": "CAPACITY_BLOCK"}
    for n, (data, types) in enumerate([({"UserData": MIME}, ["p5.48xlarge"]), (block, ["p5.48xlarge"]),
                                       ({**block, "InstanceType": "p5.48xlarge"}, ["p5.48xlarge"])]):
        lt = _template(ec2, f"lt{n}", **data)
        assert _refused(eks.create_nodegroup, **base, nodegroupName=f"g{n}", instanceTypes=types,
                        launchTemplate={"id": lt["LaunchTemplateId"]}) == "InvalidParameterException"
    whole = _template(ec2, "block", **block, InstanceType="p5.48xlarge")
    assert _refused(eks.create_nodegroup, **{**base, "capacityType": "ON_DEMAND"}, nodegroupName="od",
                    launchTemplate={"id": whole["LaunchTemplateId"]}) == "InvalidParameterException"
    eks.create_nodegroup(**base, nodegroupName="b", launchTemplate={"id": whole["LaunchTemplateId"]})
    assert "instanceTypes" not in eks.describe_nodegroup(clusterName="c", nodegroupName="b")["nodegroup"]


def test_an_efa_group_across_zones_fails_and_one_zone_does_not(aws, made):
    eks, ec2 = _clients(aws)
    ec2.create_placement_group(GroupName="pg", Strategy="cluster")
    efa = _template(ec2, "efa", Placement={"GroupName": "pg"}, NetworkInterfaces=[
        {"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "efa"}])
    base = {"clusterName": "c", "scalingConfig": ONE, "nodeRole": ROLE, "instanceTypes": ["p4d.24xlarge"],
            "launchTemplate": {"id": efa["LaunchTemplateId"]}}
    eks.create_nodegroup(**base, nodegroupName="wide", subnets=made["subnet_ids"])
    eks.create_nodegroup(**base, nodegroupName="narrow", subnets=made["subnet_ids"][:1])
    for name in ("wide", "narrow"):
        aws.advance(name, cluster="c")
    wide = eks.describe_nodegroup(clusterName="c", nodegroupName="wide")["nodegroup"]
    assert wide["status"] == "CREATE_FAILED"
    assert [i["code"] for i in wide["health"]["issues"]] == ["AsgInstanceLaunchFailures"]
    assert eks.describe_nodegroup(clusterName="c", nodegroupName="narrow")["nodegroup"]["status"] == "ACTIVE"


def test_an_instance_type_short_of_capacity_fails_with_ec2s_words(aws, made):
    eks, _ = _clients(aws)
    aws.short_of("p5.48xlarge")
    eks.create_nodegroup(clusterName="c", nodegroupName="g", scalingConfig=ONE, nodeRole=ROLE,
                         subnets=made["subnet_ids"][:1], instanceTypes=["p5.48xlarge"])
    assert eks.describe_nodegroup(clusterName="c", nodegroupName="g")["nodegroup"]["status"] == "CREATING"
    ng = eks.describe_nodegroup(clusterName="c", nodegroupName="g")["nodegroup"]
    assert ng["status"] == "CREATE_FAILED"
    assert "InsufficientInstanceCapacity - We currently do not have sufficient p5.48xlarge capacity in the " \
           "Availability Zone you requested (us-west-2a)" in ng["health"]["issues"][0]["message"]


def test_the_thirty_first_node_group_is_refused(aws, made):
    eks, _ = _clients(aws)
    for i in range(30):
        eks.create_nodegroup(clusterName="c", nodegroupName=f"g{i}", scalingConfig=ONE, nodeRole=ROLE,
                             subnets=made["subnet_ids"][:1])
    assert _refused(eks.create_nodegroup, clusterName="c", nodegroupName="g30", scalingConfig=ONE, nodeRole=ROLE,
                    subnets=made["subnet_ids"][:1]) == "ResourceLimitExceededException"


def test_placement_groups_exist_once_and_go(aws):
    _, ec2 = _clients(aws)
    ec2.create_placement_group(GroupName="pg", Strategy="cluster")
    assert _refused(ec2.create_placement_group, GroupName="pg", Strategy="cluster") == \
        "InvalidPlacementGroup.Duplicate"
    assert [g["GroupName"] for g in ec2.describe_placement_groups()["PlacementGroups"]] == ["pg"]
    ec2.delete_placement_group(GroupName="pg")
    assert _refused(ec2.delete_placement_group, GroupName="pg") == "InvalidPlacementGroup.Unknown"


# --- node groups take time: CREATING, then ACTIVE or CREATE_FAILED; DELETING, then gone ---------------------------
def _status(eks, name):
    return eks.describe_nodegroup(clusterName="c", nodegroupName=name)["nodegroup"]["status"]


def test_a_node_group_is_creating_then_active_and_deleting_then_gone_as_the_test_steps_it(aws, made):
    eks, _ = _clients(aws)
    aws.phases.describes = {"CREATING": 2, "DELETING": 2}
    kwargs = {"clusterName": "c", "nodegroupName": "g", "scalingConfig": ONE, "nodeRole": ROLE,
              "subnets": made["subnet_ids"][:1]}
    assert eks.create_nodegroup(**kwargs)["nodegroup"]["status"] == "CREATING"
    assert [_status(eks, "g") for _ in range(3)] == ["CREATING", "CREATING", "ACTIVE"]
    assert eks.delete_nodegroup(clusterName="c", nodegroupName="g")["nodegroup"]["status"] == "DELETING"
    assert eks.list_nodegroups(clusterName="c")["nodegroups"] == ["g"]  # listed, and counted, until it is gone
    assert _refused(eks.create_nodegroup, **kwargs) == "ResourceInUseException"  # its name is still taken
    assert [_status(eks, "g") for _ in range(2)] == ["DELETING", "DELETING"]
    assert _refused(eks.describe_nodegroup, clusterName="c", nodegroupName="g") == "ResourceNotFoundException"
    eks.create_nodegroup(**kwargs)
    aws.advance("g", cluster="c")  # a test may end a phase at once
    assert _status(eks, "g") == "ACTIVE"


def test_a_node_group_is_resized_only_when_active_or_degraded(aws, made):
    eks, _ = _clients(aws)
    eks.create_nodegroup(clusterName="c", nodegroupName="g", scalingConfig=ONE, nodeRole=ROLE,
                         subnets=made["subnet_ids"][:1])
    two = {"minSize": 2, "maxSize": 2, "desiredSize": 2}
    assert _refused(eks.update_nodegroup_config, clusterName="c", nodegroupName="g", scalingConfig=two) == \
        "ResourceInUseException"  # CREATING
    aws.advance("g", cluster="c")
    eks.update_nodegroup_config(clusterName="c", nodegroupName="g", scalingConfig=two)
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.eks.models import eks_backends

    group = eks_backends[DEFAULT_ACCOUNT_ID][REGION].clusters["c"].nodegroups["g"]
    group.status = "DEGRADED"
    eks.update_nodegroup_config(clusterName="c", nodegroupName="g", scalingConfig=ONE)  # scaling down a sick group
    group.status = "CREATE_FAILED"
    assert _refused(eks.update_nodegroup_config, clusterName="c", nodegroupName="g", scalingConfig=two) == \
        "InvalidRequestException"
    eks.delete_nodegroup(clusterName="c", nodegroupName="g")
    assert _refused(eks.update_nodegroup_config, clusterName="c", nodegroupName="g", scalingConfig=two) == \
        "ResourceInUseException"  # DELETING


# --- what the nodes make of the launch template: nodeadm's NodeConfig, EFA-only interfaces -------------------------
def _node_config(text: str) -> str:
    return base64.b64encode(('MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary="//"\n\n--//\n'
                             'Content-Type: application/node.eks.aws\n\n' + text + '\n--//--\n').encode()).decode()


@pytest.mark.parametrize(("config", "joins"), [
    ("apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  instance:\n    localStorage:\n"
     "      strategy: RAID0\n", True),
    # nodeadm's decoder is not strict: a field it does not know is dropped, and the node joins without it
    ("apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  instance:\n    localStorge:\n"
     "      strategy: RAID0\n", True),
    ("apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  instance:\n    localStorage:\n"
     "      strategy: [RAID0]\n", False),  # a list where nodeadm's type is a string
    ("apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  instance:\n    localStorage:\n"
     "      strategy: RAID5\n", False),  # setup-local-disks knows raid0, raid10, mount, none
    ("apiVersion: node.eks.aws/v1beta9\nkind: NodeConfig\nspec: {}\n", False),
    ("apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  kubelet:\n    flags: --max-pods=10\n", False),
], ids=["raid0", "unknown-field-dropped", "list-for-string", "unknown-strategy", "unknown-version",
        "string-for-list"])
def test_a_node_config_nodeadm_cannot_read_leaves_the_node_group_create_failed(aws, made, config, joins):
    eks, ec2 = _clients(aws)
    lt = _template(ec2, "lt", UserData=_node_config(config))
    eks.create_nodegroup(clusterName="c", nodegroupName="g", scalingConfig=ONE, nodeRole=ROLE,
                         subnets=made["subnet_ids"][:1], instanceTypes=["g6e.xlarge"],
                         launchTemplate={"id": lt["LaunchTemplateId"]})
    aws.advance("g", cluster="c")
    ng = eks.describe_nodegroup(clusterName="c", nodegroupName="g")["nodegroup"]
    assert ng["status"] == ("ACTIVE" if joins else "CREATE_FAILED")
    if not joins:
        assert ng["health"]["issues"][0]["code"] == "NodeCreationFailure"
        assert ng["health"]["issues"][0]["message"].startswith("Instances failed to join the kubernetes cluster")


def test_a_capacity_block_group_is_active_whatever_its_nodes_make_of_the_user_data(aws, made):
    """EKS does not check that the instances of a Capacity Block node group join the cluster."""
    eks, ec2 = _clients(aws)
    rid = aws.ec2_rules.reserve("p5.48xlarge", f"{REGION}a", capacity_block=True)
    lt = _template(ec2, "lt", UserData=_node_config("apiVersion: v1\nkind: Pod\n"), InstanceType="p5.48xlarge",
                   InstanceMarketOptions={"MarketType": "capacity-block"},
                   CapacityReservationSpecification={"CapacityReservationTarget": {"CapacityReservationId": rid}})
    eks.create_nodegroup(clusterName="c", nodegroupName="g", scalingConfig=ONE, nodeRole=ROLE,
                         subnets=made["subnet_ids"][:1], capacityType="CAPACITY_BLOCK",
                         launchTemplate={"id": lt["LaunchTemplateId"]})
    aws.advance("g", cluster="c")
    assert _status(eks, "g") == "ACTIVE"


def test_an_efa_only_interface_cannot_be_the_primary_one(aws, made):
    eks, ec2 = _clients(aws)
    for n, kind in enumerate(("efa-only", "efa")):
        lt = _template(ec2, f"lt{n}", NetworkInterfaces=[
            {"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": kind},
            {"NetworkCardIndex": 1, "DeviceIndex": 1, "InterfaceType": "efa-only"}])
        eks.create_nodegroup(clusterName="c", nodegroupName=kind, scalingConfig=ONE, nodeRole=ROLE,
                             subnets=made["subnet_ids"][:1], instanceTypes=["p5.48xlarge"],
                             launchTemplate={"id": lt["LaunchTemplateId"]})
        aws.advance(kind, cluster="c")
    assert _status(eks, "efa-only") == "CREATE_FAILED" and _status(eks, "efa") == "ACTIVE"


# --- capacity reservations: the instances launch into them only where they match ------------------------------------
@pytest.mark.parametrize(("reservation", "placement", "subnet", "launches"), [
    ({}, None, 0, True),
    ({}, None, 1, False),  # the reservation is in zone a, the subnet in b
    ({"placement_group": "theirs"}, "theirs", 0, True),
    ({"placement_group": "theirs"}, None, 0, False),  # reserved in a placement group: launch in it
    ({"capacity_block": True}, None, 0, False),  # a Capacity Block, launched as on-demand
])
def test_an_odcr_takes_instances_of_its_type_zone_and_placement_group(aws, made, reservation, placement, subnet,
                                                                       launches):
    eks, ec2 = _clients(aws)
    rid = aws.ec2_rules.reserve("p5.48xlarge", f"{REGION}a", **reservation)
    if placement:
        ec2.create_placement_group(GroupName=placement, Strategy="cluster")
    lt = _template(ec2, "lt", CapacityReservationSpecification={"CapacityReservationTarget": {
        "CapacityReservationId": rid}}, **({"Placement": {"GroupName": placement}} if placement else {}))
    eks.create_nodegroup(clusterName="c", nodegroupName="g", scalingConfig=ONE, nodeRole=ROLE,
                         subnets=[made["subnet_ids"][subnet]], instanceTypes=["p5.48xlarge"],
                         launchTemplate={"id": lt["LaunchTemplateId"]})
    aws.advance("g", cluster="c")
    assert _status(eks, "g") == ("ACTIVE" if launches else "CREATE_FAILED")


def test_capacity_reservations_are_described_by_id(aws):
    _, ec2 = _clients(aws)
    rid = aws.ec2_rules.reserve("p5.48xlarge", f"{REGION}a", 4, capacity_block=True, placement_group="pg")
    found = ec2.describe_capacity_reservations(CapacityReservationIds=[rid])["CapacityReservations"]
    assert [(r["InstanceType"], r["AvailabilityZone"], r["TotalInstanceCount"], r["ReservationType"], r["State"],
             r["PlacementGroupArn"].rsplit("/", 1)[1]) for r in found] == \
        [("p5.48xlarge", f"{REGION}a", 4, "capacity-block", "active", "pg")]
    assert _refused(ec2.describe_capacity_reservations, CapacityReservationIds=["cr-0123456789abcdef0"]) == \
        "InvalidCapacityReservationId.NotFound"


# --- EC2: tags at launch, a security group its network interfaces still use -----------------------------------------
def test_a_launch_template_tags_only_what_an_instance_launch_creates(aws):
    _, ec2 = _clients(aws)
    tags = [{"Key": "team", "Value": "ml"}]
    with pytest.raises(ClientError) as caught:
        _template(ec2, "bad", TagSpecifications=[{"ResourceType": "security-group", "Tags": tags}])
    assert caught.value.response["Error"]["Code"] == "InvalidParameterValue"
    _template(ec2, "ok", TagSpecifications=[{"ResourceType": kind, "Tags": tags}
                                            for kind in ("instance", "volume", "network-interface")])


def test_a_security_group_in_use_by_a_network_interface_cannot_be_deleted(aws, made):
    _, ec2 = _clients(aws)
    sg = ec2.create_security_group(GroupName="efa", Description="efa", VpcId=made["vpc_id"])["GroupId"]
    eni = ec2.create_network_interface(SubnetId=made["subnet_ids"][0], Groups=[sg])["NetworkInterface"]
    assert _refused(ec2.delete_security_group, GroupId=sg) == "DependencyViolation"
    ec2.delete_network_interface(NetworkInterfaceId=eni["NetworkInterfaceId"])
    ec2.delete_security_group(GroupId=sg)

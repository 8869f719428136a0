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


def test_a_capacity_block_needs_its_market_type_and_reservation_in_the_template(aws, made):
    eks, ec2 = _clients(aws)
    plain = _template(ec2, "plain", UserData=MIME)
    block = _template(ec2, "block", InstanceMarketOptions={"MarketType": "capacity-block"},
                      CapacityReservationSpecification={"CapacityReservationTarget": {
                          "CapacityReservationId": "cr-0123456789abcdef0"}})
    base = {"clusterName": "c", "scalingConfig": ONE, "nodeRole": ROLE, "subnets": made["subnet_ids"][:1],
            "instanceTypes": ["p5.48xlarge"], "capacityType": "CAPACITY_BLOCK"}
    assert _refused(eks.create_nodegroup, **base, nodegroupName="a",
                    launchTemplate={"id": plain["LaunchTemplateId"]}) == "InvalidParameterException"
    eks.create_nodegroup(**base, nodegroupName="b", launchTemplate={"id": block["LaunchTemplateId"]})


def test_an_efa_group_across_zones_fails_and_one_zone_does_not(aws, made):
    eks, ec2 = _clients(aws)
    ec2.create_placement_group(GroupName="pg", Strategy="cluster")
    efa = _template(ec2, "efa", Placement={"GroupName": "pg"}, NetworkInterfaces=[
        {"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "efa"}])
    base = {"clusterName": "c", "scalingConfig": ONE, "nodeRole": ROLE, "instanceTypes": ["p4d.24xlarge"],
            "launchTemplate": {"id": efa["LaunchTemplateId"]}}
    eks.create_nodegroup(**base, nodegroupName="wide", subnets=made["subnet_ids"])
    eks.create_nodegroup(**base, nodegroupName="narrow", subnets=made["subnet_ids"][:1])
    wide = eks.describe_nodegroup(clusterName="c", nodegroupName="wide")["nodegroup"]
    assert wide["status"] == "CREATE_FAILED"
    assert [i["code"] for i in wide["health"]["issues"]] == ["AsgInstanceLaunchFailures"]
    assert eks.describe_nodegroup(clusterName="c", nodegroupName="narrow")["nodegroup"]["status"] == "ACTIVE"


def test_an_instance_type_short_of_capacity_fails_with_ec2s_words(aws, made):
    eks, _ = _clients(aws)
    aws.short_of("p5.48xlarge")
    eks.create_nodegroup(clusterName="c", nodegroupName="g", scalingConfig=ONE, nodeRole=ROLE,
                         subnets=made["subnet_ids"][:1], instanceTypes=["p5.48xlarge"])
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
